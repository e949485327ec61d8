"""The whole-job plan: groups by source identity, whatever the input order, in compact arrays."""

from __future__ import annotations

import sys
from array import array

from mmbatch.planner import Plan, plan
from mmbatch.types import FrameAt, MediaRef, Request, TimeSpan


def image(request_id: str, path: str, prompt: str, system: str | None = None) -> Request:
    return Request(request_id, prompt, (MediaRef("image", path),), system)


def planned_ids(requests: list[Request]) -> list[list[str]]:
    return [[requests[i].id for i in group] for group in plan(requests).groups()]


def test_prompt_major_input_is_planned_image_major() -> None:
    # A loop over tasks: every image for prompt A, then every image for prompt B, ...
    requests = [image(f"{p}{i}", f"/d/{i}.jpg", p) for p in "ABCD" for i in range(500)]
    groups = planned_ids(requests)
    assert len(groups) == 500
    assert groups[0] == ["A0", "B0", "C0", "D0"]
    assert groups[499] == ["A499", "B499", "C499", "D499"]


def test_groups_keep_first_appearance_order() -> None:
    requests = [image("1", "z.jpg", "p"), image("2", "a.jpg", "p"), image("3", "z.jpg", "q")]
    assert planned_ids(requests) == [["1", "3"], ["2"]]


def test_members_sorted_by_system_then_prompt_so_prefixes_are_adjacent() -> None:
    requests = [
        image("1", "k.jpg", "b", system="s2"),
        image("2", "k.jpg", "a", system="s2"),
        image("3", "k.jpg", "z", system="s1"),
    ]
    assert planned_ids(requests) == [["3", "2", "1"]]


def test_identical_prompts_keep_input_order() -> None:
    requests = [image(str(i), "k.jpg", "same") for i in range(5)]
    assert planned_ids(requests) == [list("01234")]


def test_a_videos_frames_are_one_group_in_time_order() -> None:
    def frame(request_id: str, video: str, pts: float) -> Request:
        return Request(request_id, "p", (MediaRef("image", video, part=FrameAt(0, pts)),))

    requests = [frame("b2", "b.mp4", 2.0), frame("a9", "a.mp4", 9.0), frame("b1", "b.mp4", 1.0)]
    requests += [frame("a1", "a.mp4", 1.0)]
    assert planned_ids(requests) == [["b1", "b2"], ["a1", "a9"]]


def test_an_audio_files_windows_are_one_group_in_time_order() -> None:
    def window(request_id: str, start: float) -> Request:
        ref = MediaRef("audio", "talk.wav", part=TimeSpan(start, start + 30))
        return Request(request_id, "p", (ref,))

    assert planned_ids([window("late", 30.0), window("early", 0.0)]) == [["early", "late"]]


def test_media_in_memory_are_each_their_own_group() -> None:
    # Two cells with the same label may hold different bytes: only hashing can tell.
    cells = [Request(str(i), "p", (MediaRef("image", "row", data=b"x"),)) for i in range(3)]
    assert planned_ids(cells) == [["0"], ["1"], ["2"]]


def test_text_only_requests_share_a_group_sorted_by_prompt() -> None:
    requests = [Request("t1", "b"), image("i", "k.jpg", "p"), Request("t2", "a")]
    assert planned_ids(requests) == [["t2", "t1"], ["i"]]


def test_the_plan_is_a_permutation() -> None:
    requests = [image(str(i), f"{i % 7}.jpg", f"p{i % 3}") for i in range(100)]
    order = [i for group in plan(requests).groups() for i in group]
    assert sorted(order) == list(range(100))


def test_an_empty_job_has_an_empty_plan() -> None:
    assert len(plan([])) == 0


def test_a_large_plan_is_compact_arrays() -> None:
    rows = 200_000
    requests = [image(str(i), f"/photos/{i % 50_000}.jpg", "Describe.") for i in range(rows)]
    result = plan(requests)
    assert isinstance(result, Plan)
    assert len(result) == 50_000
    assert isinstance(result.order, array)
    assert isinstance(result.starts, array)
    # Two arrays of machine words: about 8 bytes a request, not an object per request.
    size = sys.getsizeof(result.order) + sys.getsizeof(result.starts)
    assert size < 12 * rows
    first = [requests[i].id for i in result.group(0)]
    assert first == ["0", "50000", "100000", "150000"]

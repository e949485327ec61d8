from mmbatch.planner import ordered, plan
from mmbatch.types import LoadedRequest, MediaRef, Request


def loaded(request_id: str, key: str, prompt: str, system: str | None = None) -> LoadedRequest:
    return LoadedRequest(Request(request_id, prompt, (MediaRef("image", key),), system), (key,))


def test_prompt_major_input_is_regrouped_by_media() -> None:
    # A loop over tasks: every image for prompt A, then every image for prompt B.
    requests = [loaded(f"{p}{i}", f"k{i}", p) for p in "AB" for i in range(3)]
    groups = plan(requests)
    assert [g.media_keys for g in groups] == [("k0",), ("k1",), ("k2",)]
    assert [g.request_ids for g in groups] == [("A0", "B0"), ("A1", "B1"), ("A2", "B2")]


def test_groups_keep_first_appearance_order() -> None:
    requests = [loaded("1", "z", "p"), loaded("2", "a", "p"), loaded("3", "z", "q")]
    assert [g.media_keys for g in plan(requests)] == [("z",), ("a",)]


def test_members_sorted_by_system_then_prompt_so_prefixes_are_adjacent() -> None:
    requests = [
        loaded("1", "k", "b", system="s2"),
        loaded("2", "k", "a", system="s2"),
        loaded("3", "k", "z", system="s1"),
    ]
    assert plan(requests)[0].request_ids == ("3", "2", "1")


def test_identical_prompts_keep_input_order() -> None:
    requests = [loaded(str(i), "k", "same") for i in range(5)]
    assert plan(requests)[0].request_ids == tuple("01234")


def test_ordered_is_a_permutation() -> None:
    requests = [loaded(str(i), f"k{i % 3}", f"p{i % 2}") for i in range(20)]
    assert sorted(r.id for r in ordered(requests)) == sorted(r.id for r in requests)


def test_requests_without_media_form_their_own_group() -> None:
    text_only = LoadedRequest(Request("t", "hello"), ())
    groups = plan([loaded("1", "k", "p"), text_only])
    assert groups[1].media_keys == ()
    assert groups[1].request_ids == ("t",)

"""vLLM's multimodal processor cache kept mirrored by ``VLLMEngine``, on the session's engine.

The front end records a picture as sent when it renders a request carrying it, and then sends
only its key; the engine core holds the data. A request rendered but never handed to the core
(aborted as it rendered, as a kept engine does to a job killed mid-run; refused by vLLM after
rendering) must still leave the picture usable: the next request carrying it, with the same
key (a job resumed, another prompt about the picture), is answered, not refused for a cache
miss. Each case is fixed, never timed: a request's render precedes its successor's, on the
one render thread that keeps the cache."""

from __future__ import annotations

import pytest
from PIL import Image

from mmbatch.types import LoadedRequest, MediaItem, MediaRef, Request, Result, Sampling

pytestmark = pytest.mark.slow

ANSWER = Sampling(max_tokens=4, ignore_eos=True)


def _picture(name: str, colour: tuple[int, int, int], size: int = 64) -> MediaItem:
    """A picture no other test sends (its key is the test's own)."""
    return MediaItem("image", f"mirror-{name}", Image.new("RGB", (size, size), colour))


def _request(request_id: str, picture: MediaItem, prompt: str = "Describe.") -> LoadedRequest:
    return LoadedRequest(
        Request(request_id, prompt, (MediaRef("image", picture.key),)), (picture.key,)
    )


def _results(engine) -> dict[str, Result]:  # type: ignore[no-untyped-def]
    done: list[Result] = []
    while engine.num_unfinished():
        done += engine.step()
    return {result.request_id: result for result in done}


def _answered(result: Result) -> None:
    assert result.error is None, result.error
    assert result.usage.output_tokens == ANSWER.max_tokens


def test_a_request_aborted_as_it_renders_leaves_its_picture_to_the_next(vl_engine) -> None:  # type: ignore[no-untyped-def]
    picture = _picture("aborted", (200, 30, 30))
    vl_engine.add(_request("killed", picture), [picture], ANSWER)
    vl_engine.abort(["killed"])  # the job is gone; its request was queued to render
    vl_engine.add(_request("resumed", picture), [picture], ANSWER)
    results = _results(vl_engine)
    assert set(results) == {"resumed"}  # the aborted one is not answered
    _answered(results["resumed"])


def _past_the_context_with_its_picture(engine) -> str:  # type: ignore[no-untyped-def]
    """A prompt that fits the engine's 1,024 tokens alone, and outgrows it by its picture's
    tokens (eight, on this model): vLLM refuses it for its length only once the picture is
    rendered. Measured on a picture of the same size that the test sends no more."""
    measured = _picture("measure", (30, 200, 30), PICTURE_SIDE)
    engine.add(_request("measure", measured, "Describe."), [measured], ANSWER)
    base = _results(engine)["measure"].usage.prompt_tokens  # "Describe." and its picture
    return "Describe. " * ((1024 + 3 - base) // 2 + 1)  # two tokens each: 1,027 or so


PICTURE_SIDE = 896
"""Side of the pictures refused for length: as large as this model takes (eight tokens)."""


@pytest.mark.parametrize("refused_for", ["settings", "length"])
def test_a_request_refused_after_rendering_leaves_its_picture_to_the_next(
    vl_engine,  # type: ignore[no-untyped-def]
    refused_for: str,
) -> None:
    picture = _picture(f"refused-{refused_for}", (30, 30, 200), PICTURE_SIDE)
    if refused_for == "settings":
        sampling, prompt = Sampling(max_tokens=4, logprobs=1000), "Describe."  # vLLM allows 20
    else:
        sampling, prompt = ANSWER, _past_the_context_with_its_picture(vl_engine)
    vl_engine.add(_request("refused", picture, prompt), [picture], sampling)
    # Rendered behind the refused one, before vLLM refuses it: it counts on the picture sent.
    vl_engine.add(_request("next", picture, "Name it."), [picture], ANSWER)
    results = _results(vl_engine)
    refusal = results["refused"].error
    assert refusal is not None
    assert refusal.kind == ("too_long" if refused_for == "length" else "rejected"), refusal
    _answered(results["next"])
    vl_engine.add(_request("later", picture), [picture], ANSWER)
    _answered(_results(vl_engine)["later"])

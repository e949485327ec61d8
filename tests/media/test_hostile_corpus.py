"""A hostile corpus (made by ``hostile_media``) through the whole command: every file ends as
an error row naming its stage and kind, or as a correct caption; never a crash, a hang or a
lost row. The fast tests use the fake engine (with the tiny model's processor, which says
what media the model takes); the slow ones vLLM with the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_cli import main
from fake_engine import FakeEngine, expected_text
from hostile_media import (
    CORPUS_ARGS,
    ENGINE_DEPENDENT,
    SKIPPED,
    make_hostile_corpus,
    make_thin_strip,
)
from media_loader import MediaLoader

from mmbatch.cli import EXIT_ITEMS_FAILED
from mmbatch.jsonl import printable
from mmbatch.media.image import decode_image
from mmbatch.media.options import ImageOptions, MediaOptions
from mmbatch.output.sinks import MemorySink
from mmbatch.pipeline import RunConfig, run_requests
from mmbatch.types import MediaRef, Request, Sampling


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    folder = tmp_path_factory.mktemp("hostile")
    return folder, make_hostile_corpus(folder)  # type: ignore[return-value]


def outcome(row: dict[str, object]) -> object:
    error = row["error"]
    return "ok" if error is None else (error["stage"], error["kind"])  # type: ignore[index]


def check_corpus_rows(out: Path, expected: dict[str, object]) -> list[dict[str, object]]:
    """One row per input, each with its expected outcome; the files passed over counted."""
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by_name = {Path(r["id"]).name: r for r in rows}  # type: ignore[arg-type]
    assert len(rows) == len(by_name) == len(expected)
    assert {name: outcome(row) for name, row in by_name.items()} == expected
    skipped = json.loads(out.with_name(out.name + ".summary.json").read_text())["job"]["skipped"]
    assert sum(skipped.values()) == len(SKIPPED) + 2  # and the hidden file, the link out
    return rows


def test_every_hostile_file_is_one_row_with_its_outcome(
    hostile: tuple[Path, dict[str, object]], tmp_path: Path, tiny_vl_model: Path
) -> None:
    folder, expected = hostile
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(folder), "--model", str(tiny_vl_model), "--out", str(out)]
    argv += [*CORPUS_ARGS, "--no-progress"]
    assert main(argv, FakeEngine(capacity=3)) == EXIT_ITEMS_FAILED
    rows = check_corpus_rows(out, expected)
    for row in rows:
        if row["error"] is None:
            assert row["text"] == expected_text([row["media_hash"]], row["prompt"])
        else:
            assert row["text"] is None
            assert row["error"]["message"]
    quarantine = (tmp_path / "o.jsonl.quarantine.jsonl").read_text().splitlines()
    assert len(quarantine) == sum(1 for e in expected.values() if e != "ok")


def test_bomb_is_refused_before_its_pixels_are_decoded(
    hostile: tuple[Path, dict[str, object]],
) -> None:
    import tracemalloc

    data = (hostile[0] / "bomb_20000x20000.png").read_bytes()
    tracemalloc.start()
    with pytest.raises(Exception, match=r"bomb|pixels"):
        decode_image(data, ImageOptions())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50 * 1024**2  # 400 million pixels would need hundreds of MB


def test_awkward_images_decode_to_the_picture_a_viewer_shows(
    hostile: tuple[Path, dict[str, object]],
) -> None:
    folder = hostile[0]

    def decoded(name: str):  # type: ignore[no-untyped-def]
        return decode_image((folder / name).read_bytes(), ImageOptions())

    gray = decoded("gray16.png")
    # The 16-bit ramp keeps its shades: not clipped to white past the first 1/256.
    shades = sorted({gray.getpixel((x, 0))[0] for x in range(64)})
    assert len(shades) == 64
    assert shades[0] == 0
    assert 240 <= shades[-1] < 255
    palette = decoded("palette_alpha.png")
    assert palette.getpixel((0, 0)) == (255, 255, 255)  # transparent -> white, not black
    assert palette.getpixel((20, 20)) == (255, 0, 0)
    assert decoded("animated.gif").getpixel((5, 5)) == (255, 0, 0)  # the first frame
    assert decoded("huge_exif.jpg").size == (64, 96)  # its orientation tag applied
    cmyk = decoded("cmyk.jpg")
    assert cmyk.mode == "RGB"
    assert cmyk.size == (96, 64)
    assert decoded("one_pixel.png").getpixel((0, 0)) == (200, 30, 30)


@pytest.mark.slow
def test_hostile_corpus_on_vllm_gives_rows_and_the_engine_survives(
    vl_engine,  # type: ignore[no-untyped-def]
    hostile: tuple[Path, dict[str, object]],
    tmp_path: Path,
) -> None:
    folder, corpus = hostile
    pictures = sorted(
        p for p in folder.iterdir() if printable(p.name) in corpus and p.suffix != ".mp4"
    )
    thin = make_thin_strip(tmp_path)
    expected = {printable(p.name): corpus[printable(p.name)] for p in pictures}
    expected |= {k: v for k, v in ENGINE_DEPENDENT.items() if k in expected or k == thin.name}
    requests = [
        Request(printable(p.name), "Describe this image.", (MediaRef("image", str(p)),))
        for p in [*pictures, thin]
    ]
    # Over max_model_len (1024): refused alone, as a "too_long" row.
    picture = (MediaRef("image", str(folder / "cmyk.jpg")),)
    requests.append(Request("too_long", "word " * 1500, picture))
    requests.append(Request("after_all_that", "Describe.", picture))
    expected |= {"too_long": ("validate", "too_long"), "after_all_that": "ok"}
    sink = MemorySink()
    run = RunConfig(progress=False)
    stats = run_requests(requests, vl_engine, MediaOptions(), sink, Sampling(max_tokens=6), run)
    by_id = {row["id"]: row for row in sink.rows}
    assert len(sink.rows) == len(by_id) == len(requests)
    assert {item_id: outcome(row) for item_id, row in by_id.items()} == expected
    for row in sink.rows:
        if row["error"] is None:
            assert row["text"], row
            assert row["output_tokens"] > 0, row
    # Measured before it reached vLLM (the pre-flight budget), with the numbers.
    assert "over max_model_len 1024" in by_id["too_long"]["error"]["message"]
    assert stats.failed_by_kind["too_long"] == 1


@pytest.mark.slow
def test_a_request_vllm_drops_becomes_an_error_row_not_a_hang(
    uncached_vl_engine,  # type: ignore[no-untyped-def]
    samples: Path,
) -> None:
    engine = uncached_vl_engine  # the vLLM adapter itself, whose internals this test drives
    loader = MediaLoader()
    image = [
        Request(n, "Describe.", (MediaRef("image", str(samples / "sunset.jpg")),)) for n in "ab"
    ]
    window = loader.load(image)
    sampling = Sampling(max_tokens=8)
    results = {}
    try:
        for loaded in window.requests:
            engine.add(loaded, [window.media[k] for k in loaded.media_keys], sampling)
        while engine._rendering:  # hand background renders to vLLM now
            assert not engine._submit_rendered(wait=True)
        # Abort "a" inside vLLM, behind the adapter's back: as if the engine gave up on it.
        engine_id = next(e for e, ours in engine._pending.items() if ours == "a")
        engine._engine.abort_request([engine_id])
    finally:
        # Whatever happens, leave the shared engine empty for the next test.
        for _ in range(500):
            if not engine.num_unfinished():
                break
            for result in engine.step():
                results[result.request_id] = result
    assert set(results) == {"a", "b"}
    failed = results["a"].error
    assert failed is not None
    assert (failed.stage, failed.kind) == ("engine", "engine")
    assert results["b"].ok
    assert results["b"].text

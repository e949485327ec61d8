"""The review gallery, rendered by a real headless Chromium (Debian's ``chromium``).

In CI (``CI`` set) a missing chromium fails these tests: .ci/run installs it. Elsewhere they
are skipped with the reason, so a laptop without chromium can still run the suite.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

import pytest
from browser import browse, probe
from fake_engine import FakeEngine
from PIL import Image

from mmbatch.cli import main
from mmbatch.jobs import Job, run_job
from mmbatch.output.file_output import FileOutput
from mmbatch.output.formats import read_output
from mmbatch.pipeline import RunConfig
from mmbatch.review.gallery import render
from mmbatch.review.thumbnails import NoPreview
from mmbatch.sources.files import image_requests
from mmbatch.types import Sampling

HOSTILE = '<script>document.title="owned"</script> & <b>bold</b>'


@pytest.fixture
def job_output(samples: Path, tmp_path: Path) -> Path:
    """A finished job over the samples (fake engine): rows, one decode error, a summary."""
    out = tmp_path / "captions.jsonl"
    requests = image_requests([str(samples)], "Describe.")
    requests[0] = type(requests[0])(requests[0].id, HOSTILE, requests[0].media)
    job = Job(requests, Sampling(), info={"model": "tiny-test-model", "prompt": "Describe."})
    run_job(job, FakeEngine(), FileOutput.at(out), RunConfig(progress=False))
    return out


def test_chromium_renders_every_caption_and_filters_errors(
    job_output: Path, tmp_path: Path
) -> None:
    page = tmp_path / "report.html"
    assert main(["report", str(job_output), "--html", str(page)]) == 0
    rows = list(read_output(job_output))
    ok = [r for r in rows if not r["error"]]
    assert len(ok) == 5
    assert len(rows) == 6

    dom = browse(page, tmp_path / "profile-1", "--dump-dom")
    for row in ok:
        # The fake engine's text echoes the prompt, so one caption carries HOSTILE markup:
        # it must arrive as text, never as elements.
        assert f'<p class="text">{escape(row["text"], quote=False)}</p>' in dom
    assert 'document.title="owned"' not in dom.split("<title>")[1].split("</title>")[0]
    assert "<b>bold</b>" not in dom
    assert dom.count('src="data:image/jpeg;base64,') == 5
    assert (
        '<div class="nopreview">no preview</div>' in dom
    )  # the truncated JPEG: its error says why
    assert "decode</span>" in dom
    assert "showing 6 of 6" in dom  # written by the page's script: it ran
    # The summary: counts, throughput and cache hit rates from captions.jsonl.summary.json.
    assert "6: 5 ok, 1 failed (1 at decode)" in dom
    assert "output tok/s" in dom
    assert "prefix n/a, multimodal n/a" in dom  # the fake engine has no caches
    assert "tiny-test-model" in dom

    filtered = browse(page, tmp_path / "profile-2", "--dump-dom", fragment="#errors")
    assert 'data-filter="errors"' in filtered
    assert "showing 1 of 6" in filtered

    shot = tmp_path / "report.png"
    browse(page, tmp_path / "profile-3", f"--screenshot={shot}", "--window-size=1280,900")
    with Image.open(shot) as image:
        assert image.size == (1280, 900)
        # Not a blank page: the thumbnails put many colours on it.
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 500


LONG_ANSWER = "x" * 5000
"""An answer with no place to break a line: 5,000 characters of one word."""

FITS_AND_FILTERS = """
var page = doc.documentElement;
function shown() {
  return Array.prototype.filter.call(doc.querySelectorAll(".item"), function (item) {
    return item.getClientRects().length > 0;
  }).map(function (item) { return item.querySelector(".id").textContent; });
}
result = {width: win.innerWidth,
          scrolled: Math.max(page.scrollWidth, doc.body.scrollWidth), all: shown()};
var search = doc.getElementById("search");
if (search) {
  search.value = "SUNSET";
  search.dispatchEvent(new win.Event("input"));
  result.sunset = shown();
  search.value = "truncated 39";
  search.dispatchEvent(new win.Event("input"));
  result.error = shown();
  result.showing = doc.getElementById("showing").textContent;
}
"""


@pytest.mark.parametrize("width", [390, 1280])
def test_the_page_fits_a_phone_and_a_desktop_and_its_search_filters_cards(
    samples: Path, tmp_path: Path, width: int
) -> None:
    out = tmp_path / "captions.jsonl"
    requests = image_requests([str(samples)], "Describe.")
    requests[0] = type(requests[0])(requests[0].id, LONG_ANSWER, requests[0].media)
    run_job(Job(requests, Sampling()), FakeEngine(), FileOutput.at(out), RunConfig(progress=False))
    assert any(LONG_ANSWER in (row["text"] or "") for row in read_output(out))
    page = tmp_path / "report.html"
    assert main(["report", str(out), "--html", str(page)]) == 0

    found = probe(page, tmp_path / "profile", width, FITS_AND_FILTERS)
    assert found["width"] == width
    assert found["scrolled"] <= width, found  # no card, answer or title widens the page
    assert len(found["all"]) == 6
    # The search keeps the cards whose text holds the words typed, in any case: the two
    # sunsets by their ids, then the error by its message.
    assert sorted(Path(card).name for card in found["sunset"]) == ["sunset.jpg", "sunset_copy.jpg"]
    assert [Path(card).name for card in found["error"]] == ["truncated.jpg"]
    assert found["showing"] == "showing 1 of 6"


def test_an_error_card_says_its_message_once(samples: Path, tmp_path: Path) -> None:
    """The picture the job could not decode has no preview either: the card says why once."""
    out = tmp_path / "captions.jsonl"
    requests = image_requests([str(samples / "truncated.jpg")], "Describe.")
    run_job(Job(requests, Sampling()), FakeEngine(), FileOutput.at(out), RunConfig(progress=False))
    [row] = read_output(out)
    message = row["error"]["message"]
    assert "truncated" in message
    page = tmp_path / "report.html"
    assert main(["report", str(out), "--html", str(page)]) == 0
    html = page.read_text()
    assert html.count(escape(message, quote=False)) == 1
    assert '<div class="nopreview">no preview</div>' in html


def test_a_clip_card_shows_where_the_clip_starts_and_ends_and_how_long_it_is() -> None:
    rows = [
        {"id": "v.mp4@12.5", "source": "v.mp4", "start": 12.5, "end": 17.25, "text": "a"},
        {"id": "w.mp4", "source": "w.mp4", "text": "b"},
    ]

    def no_preview(row: object) -> str:
        raise NoPreview("not on disk")

    page = render(rows, None, no_preview, "t")
    assert '<p class="span">12.5 to 17.25 s (4.75 s long)</p>' in page
    assert page.count('class="span"') == 1  # a whole video has no span


def test_rows_from_a_dataset_map_and_unknown_fields_render(tmp_path: Path) -> None:
    rows = [
        {"id": "0", "source": "x.jpg", "text": "a cat", "error": "", "score": 0.5},
        {"id": "1", "source": None, "text": "", "error": "decode: corrupt <image>"},
    ]

    def no_preview(row: object) -> str:
        raise NoPreview("not on disk")

    page = render(rows, None, no_preview, "t")
    assert '<p class="text">a cat</p>' in page
    assert '<span class="stage">decode</span> corrupt &lt;image&gt;' in page
    assert "&quot;score&quot;: 0.5" in page  # under "more"
    assert "2 items: 1 ok, 1 failed" in page
    assert page.count("no preview: not on disk") == 2


def test_a_recipe_row_shows_every_answer(tmp_path: Path) -> None:
    outputs = {
        "subject": {"prompt": "What?", "text": "a <boat>", "error": None},
        "facts": {"text": '{"n": 1}', "parsed": {"n": 1}, "error": None},
        "mood": {"text": None, "error": {"stage": "validate", "message": "too long"}},
    }
    rows = [{"id": "a", "source": "a.jpg", "outputs": outputs, "error": None}]

    def no_preview(row: object) -> str:
        raise NoPreview("not on disk")

    page = render(rows, None, no_preview, "t")
    assert '<p class="text"><b>subject</b> a &lt;boat&gt;</p>' in page
    assert '<p class="text"><b>facts</b> {&quot;n&quot;: 1}</p>' in page
    assert '<b>mood</b> <span class="stage">validate</span> too long' in page
    assert "&quot;outputs&quot;" not in page  # shown as answers, not again under "more"


def test_max_items_keeps_every_error(job_output: Path, tmp_path: Path) -> None:
    page = tmp_path / "small.html"
    assert main(["report", str(job_output), "--html", str(page), "--max-items", "2"]) == 0
    html = page.read_text()
    assert html.count('<article class="item') == 2
    assert html.count('<article class="item error"') == 1


COLOURS = [(220, 30, 30), (30, 220, 30), (30, 30, 220), (220, 220, 30)]
"""A test video's colours, one a second."""


def colour_video(path: Path, codec: str = "mpeg4") -> Path:
    """Four seconds at 10 fps (25 for MPEG-1, which knows no 10), one of ``COLOURS`` a
    second; the container follows the suffix."""
    import av
    import numpy as np

    rate = 25 if codec == "mpeg1video" else 10
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for colour in COLOURS:
            for _ in range(rate):
                pixels = np.full((48, 64, 3), colour, dtype=np.uint8)
                frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
                container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def strip_colours(uri: str) -> list[tuple[int, int, int]]:
    """The colour at the middle of each frame of a video's strip."""
    import base64
    import io

    from mmbatch.review.thumbnails import VIDEO_FRAMES

    with Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))) as strip:
        assert strip.size == (64 * VIDEO_FRAMES, 48)
        return [strip.getpixel((64 * i + 32, 24)) for i in range(VIDEO_FRAMES)]  # type: ignore[misc]


def assert_colours(centres: list[tuple[int, int, int]]) -> None:
    """One frame from each second, in order: the strip spans the whole video."""
    for centre, colour in zip(centres, COLOURS, strict=True):
        assert max(abs(a - b) for a, b in zip(centre, colour, strict=True)) < 40, centres


def test_a_video_gets_a_strip_of_frames_from_across_it(tmp_path: Path) -> None:
    from mmbatch.review.thumbnails import thumbnail_uri
    from mmbatch.types import MediaRef

    path = colour_video(tmp_path / "colours.mp4")
    assert_colours(strip_colours(thumbnail_uri(MediaRef("video", str(path)))))
    with pytest.raises(NoPreview, match="no file at"):
        thumbnail_uri(MediaRef("video", str(tmp_path / "missing.mp4")))
    with pytest.raises(NoPreview, match="audio has no picture"):
        thumbnail_uri(MediaRef("audio", str(path)))


@pytest.mark.parametrize("suffix", [".mpg", ".mpeg", ".mp4"])
def test_a_file_the_listing_takes_as_a_video_is_previewed_as_one(
    tmp_path: Path, suffix: str
) -> None:
    """A path whose row does not say it is a video (an OpenAI batch line's, shown as a
    picture) is told by its suffix, the listing's own (``VIDEO_SUFFIXES``): an MPEG file
    gets its strip, not "not an image"."""
    from mmbatch.review.thumbnails import thumbnail_uri
    from mmbatch.sources.files import VIDEO_SUFFIXES
    from mmbatch.types import MediaRef

    assert suffix in VIDEO_SUFFIXES
    codec = "mpeg4" if suffix == ".mp4" else "mpeg1video"
    path = colour_video(tmp_path / f"colours{suffix}", codec)
    assert_colours(strip_colours(thumbnail_uri(MediaRef("image", str(path)))))


def test_an_openai_batch_output_shows_its_errors_ids_and_pictures_from_anywhere(
    samples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gallery of a run-openai-batch output, made from another folder than the job's:
    failed lines are error cards (the header, the filter and the cards agree), cards are
    named by custom_id, and pictures named by relative paths still preview."""
    import base64
    import json as jsonlib

    from fake_cli import main as fake_main

    job = tmp_path / "job"
    (job / "pics").mkdir(parents=True)
    (job / "pics" / "s.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    (job / "pics" / "bad.jpg").write_bytes((samples / "truncated.jpg").read_bytes())
    inline = (
        "data:image/png;base64,"
        + base64.b64encode((samples / "checkerboard.png").read_bytes()).decode()
    )

    def line(custom_id: str, url: str, **body: object) -> str:
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Q?"}]
        entry = {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": content}], **body},
        }
        return jsonlib.dumps(entry)

    lines = [
        line("photo", "pics/s.jpg"),
        line("inline", inline),
        line("broken", "pics/bad.jpg"),
        line("refused", "pics/s.jpg", logit_bias={"1": 5}),
    ]
    (job / "requests.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(job)  # the job runs here, with relative paths
    argv = ["run-openai-batch", "requests.jsonl", "--model", "m", "--out", "out/results.jsonl"]
    assert fake_main([*argv, "--no-progress"]) == 1
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the report is made from somewhere else
    page = elsewhere / "report.html"
    assert main(["report", str(job / "out" / "results.jsonl"), "--html", str(page)]) == 0

    dom = browse(page, tmp_path / "profile", "--dump-dom")
    assert "4: 2 ok, 2 failed" in dom  # the summary's count...
    assert "errors only (2)" in dom  # ...the filter's...
    assert dom.count('<article class="item error"') == 2  # ...and the cards agree
    for custom_id in ("photo", "inline", "broken", "refused"):
        assert f'<h2 class="id">{custom_id}</h2>' in dom
    assert "batch_req_" not in dom.split('<main id="items">', 1)[1].split("</main>")[0]
    assert '<p class="prompt">Q?</p>' in dom  # read back from the batch input
    assert "unsupported parameter(s): 'logit_bias'" in dom
    # photo's (a relative path), inline's (a data: URI) and refused's pictures (read again
    # from its line, as its prompt is); broken's is the truncated JPEG.
    assert dom.count('src="data:image/jpeg;base64,') == 3
    refused = dom.split('<h2 class="id">refused</h2>')[0].rsplit("<article", 1)[1]
    refused += dom.split('<h2 class="id">refused</h2>')[1].split("</article>")[0]
    assert 'src="data:image/jpeg;base64,' in refused
    assert '<p class="prompt">Q?</p>' in refused
    assert "names no source" not in refused
    assert "pics/s.jpg</p>" in refused
    filtered = browse(page, tmp_path / "profile-2", "--dump-dom", fragment="#errors")
    assert "showing 2 of 4" in filtered


def test_a_refused_batch_lines_card_shows_its_prompt_and_the_pictures_it_may(
    samples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line refused before it became a request said "the row names no source" and showed
    no prompt: its card now shows both, read again from the line; never a remote picture
    or a file outside where the job could read."""
    import json as jsonlib

    from fake_cli import main as fake_main

    (tmp_path / "job" / "pics").mkdir(parents=True)
    (tmp_path / "job" / "pics" / "s.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    (tmp_path / "outside.jpg").write_bytes((samples / "sunset.jpg").read_bytes())

    def line(custom_id: str, url: str, text: str, **body: object) -> str:
        content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": content},
        ]
        body = {"messages": messages, **body}
        return jsonlib.dumps({"custom_id": custom_id, "url": "/v1/chat/completions", "body": body})

    lines = [
        line("tools", "pics/s.jpg", "What is this?", tools=[]),
        line("remote", "https://example.com/x.jpg", "And this?"),
        line("outside", "../outside.jpg", "And that?"),
    ]
    (tmp_path / "job" / "requests.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path / "job")
    argv = ["run-openai-batch", "requests.jsonl", "--model", "m", "--out", "results.jsonl"]
    assert fake_main([*argv, "--no-progress"]) == 1
    page = tmp_path / "report.html"
    assert main(["report", "results.jsonl", "--html", str(page)]) == 0
    html = page.read_text()
    cards = {
        card.split('<h2 class="id">', 1)[1].split("</h2>", 1)[0]: card
        for card in html.split("<article")[1:]
    }
    assert "names no source" not in html
    for custom_id, prompt in (("tools", "What is this?"), ("remote", "And this?")):
        assert f'<p class="prompt">{prompt}</p>' in cards[custom_id]
    assert 'src="data:image/jpeg;base64,' in cards["tools"]
    assert f'<p class="source">{tmp_path / "job" / "pics" / "s.jpg"}</p>' in cards["tools"]
    assert "data:image" not in cards["remote"]  # never fetched
    assert "example.com" not in cards["remote"].split('class="error"')[0]
    assert '<p class="prompt">And that?</p>' in cards["outside"]
    assert "data:image" not in cards["outside"]  # a file the job could not read


def test_a_clips_card_shows_frames_of_that_clip_only(tiny_vl_model: Path, tmp_path: Path) -> None:
    """A clip cut from a video previews as a strip of its own frames, not the whole
    video's: each scene's card is that scene's colour."""
    import base64
    import io

    import numpy as np
    from fake_cli import main as fake_main
    from media_files import scene_video
    from PIL import Image

    colours = [(200, 30, 30), (30, 200, 30), (30, 30, 200)]
    video = scene_video(
        tmp_path / "scenes.mp4", [(30, colours[0]), (20, colours[1]), (40, colours[2])]
    )
    out = tmp_path / "clips.jsonl"
    argv = ["caption", str(video), "--scenes", "--model", str(tiny_vl_model), "--out", str(out)]
    assert fake_main([*argv, "--no-progress"]) == 0
    page = tmp_path / "report.html"
    assert main(["report", str(out), "--html", str(page)]) == 0
    strips = page.read_text().split('src="data:image/jpeg;base64,')[1:]
    assert len(strips) == 3
    for strip, colour in zip(strips, colours, strict=True):
        data = base64.b64decode(strip.split('"', 1)[0])
        pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=float)
        median = np.median(pixels.reshape(-1, 3), axis=0)  # the flat colour, not the square
        assert np.abs(median - colour).max() < 25, (median, colour)


def test_relative_sources_preview_from_another_folder(
    samples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fake_cli import main as fake_main

    job = tmp_path / "job"
    (job / "photos").mkdir(parents=True)
    for name in ("sunset.jpg", "checkerboard.png"):
        (job / "photos" / name).write_bytes((samples / name).read_bytes())
    monkeypatch.chdir(job)
    assert (
        fake_main(["caption", "photos", "--model", "m", "--out", "c.jsonl", "--no-progress"]) == 0
    )
    assert {row["source"] for row in read_output(job / "c.jsonl")} == {
        "photos/sunset.jpg",
        "photos/checkerboard.png",
    }
    monkeypatch.chdir(tmp_path)
    page = tmp_path / "report.html"
    assert main(["report", str(job / "c.jsonl"), "--html", str(page)]) == 0
    html = page.read_text()
    assert html.count('src="data:image/jpeg;base64,') == 2
    assert "no preview" not in html

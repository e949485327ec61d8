"""OpenAI batch lines naming their pictures by http(s) URL, as hosted batch files do: fetched
with ``--allow-urls`` on the loader's reader threads, within the size and time bounds every
URL input has, each URL once however many lines name it; a fetch that fails is its line's
400 row. Served by a local HTTP server that counts what it is asked (fake engine: the fetch,
the decode and the rows are real)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_cli import main
from fake_engine import FakeEngine
from media_server import MediaServer, serving

from mmbatch.cli import EXIT_ITEMS_FAILED, EXIT_OK


def batch_line(custom_id: str, url: str) -> dict[str, Any]:
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Q?"}]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def write_batch(folder: Path, lines: list[dict[str, Any]]) -> Path:
    path = folder / "requests.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def run_batch(requests: Path, out: Path, *flags: str) -> tuple[int, dict[str, dict[str, Any]]]:
    argv = ["run-openai-batch", str(requests), "--model", "m", "--out", str(out), "--no-progress"]
    code = main([*argv, *flags], FakeEngine())
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return code, {row["custom_id"]: row for row in rows}


def error_of(row: dict[str, Any]) -> dict[str, Any]:
    assert row["response"]["status_code"] == 400, row
    error: dict[str, Any] = row["response"]["body"]["error"]
    return error


@pytest.fixture
def server(samples: Path) -> Iterator[MediaServer]:
    payloads = {
        "/sunset.jpg": (samples / "sunset.jpg").read_bytes(),
        "/big.jpg": b"\xff\xd8" + b"\0" * 300_000,
        **{f"/p{i}.png": (samples / "shapes_alpha.png").read_bytes() for i in range(4)},
    }
    with serving(payloads) as httpd:
        yield httpd


def test_remote_images_are_fetched_once_each_and_failures_are_their_lines_rows(
    tmp_path: Path, server: MediaServer, samples: Path
) -> None:
    (tmp_path / "ok.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    url = server.url
    lines = [
        *(batch_line(name, f"{url}/sunset.jpg") for name in ("a", "b", "c")),
        batch_line("missing", f"{url}/nope.jpg"),
        batch_line("big", f"{url}/big.jpg"),
        batch_line("slow", f"{url}/slow"),
        batch_line("local", "ok.jpg"),
    ]
    requests = write_batch(tmp_path, lines)
    bounds = ["--url-max-bytes", "100000", "--url-timeout", "1"]
    code, rows = run_batch(requests, tmp_path / "o.jsonl", "--allow-urls", *bounds)
    assert code == EXIT_ITEMS_FAILED
    assert len(rows) == len(lines)
    # The same URL on three lines is fetched once; its content is the local copy's.
    assert server.hits["/sunset.jpg"] == 1
    answer = rows["local"]["response"]["body"]["choices"][0]["message"]["content"]
    for name in ("a", "b", "c", "local"):
        response = rows[name]["response"]
        assert response["status_code"] == 200, rows[name]
        assert response["body"]["choices"][0]["message"]["content"] == answer
    missing = error_of(rows["missing"])
    assert missing["message"] == f"cannot fetch '{url}/nope.jpg': HTTP 404 Not Found"
    assert (missing["stage"], missing["code"]) == ("load", "unreadable")
    big = error_of(rows["big"])
    assert big["message"] == f"'{url}/big.jpg' is over the URL size limit of 100000 bytes"
    assert big["code"] == "too_large"
    slow = error_of(rows["slow"])
    assert slow["message"] in (
        f"fetching '{url}/slow' took over 1 s",
        f"cannot fetch '{url}/slow': timed out",
    )
    assert slow["code"] == "unreadable"


def test_without_allow_urls_each_remote_image_is_its_lines_error(
    tmp_path: Path, server: MediaServer, samples: Path
) -> None:
    (tmp_path / "ok.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    requests = write_batch(
        tmp_path, [batch_line("remote", f"{server.url}/sunset.jpg"), batch_line("local", "ok.jpg")]
    )
    code, rows = run_batch(requests, tmp_path / "o.jsonl")
    assert code == EXIT_ITEMS_FAILED
    assert rows["local"]["response"]["status_code"] == 200
    refused = error_of(rows["remote"])
    assert refused["message"] == (
        f"remote#image0: '{server.url}/sunset.jpg' is a URL; URLs are fetched only with "
        "--allow-urls (which bounds each download in size and time)"
    )
    assert (refused["stage"], refused["code"]) == ("source", "not_allowed")
    assert not server.hits  # nothing was asked of the server


def test_a_lines_urls_are_fetched_together(tmp_path: Path, server: MediaServer) -> None:
    """The server answers once it is asked two at once (10 s at most): the URLs of one unit
    are in flight at the same time, not one after another."""
    lines = [batch_line(f"l{i}", f"{server.url}/late/p{i}.png") for i in range(4)]
    code, rows = run_batch(write_batch(tmp_path, lines), tmp_path / "o.jsonl", "--allow-urls")
    assert code == EXIT_OK
    assert all(row["response"]["status_code"] == 200 for row in rows.values())
    assert sum(server.hits.values()) == 4
    assert server.most_at_once >= 2


def test_url_bounds_are_checked_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requests = write_batch(tmp_path, [batch_line("a", "https://example.com/a.jpg")])
    argv = ["run-openai-batch", str(requests), "--model", "m", "--out", str(tmp_path / "o.jsonl")]
    assert main([*argv, "--allow-urls", "--url-timeout", "0"], FakeEngine()) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "mmbatch: error: the URL time limit must be > 0 s, got 0.0"
    ]
    assert not (tmp_path / "o.jsonl").exists()

"""No line of an input brings a job down: a NUL byte in a path, a ``custom_id`` that is not
valid Unicode, JSON nested a hundred thousand deep. Each is its item's error row, or for a
file that cannot be read as one, the one-line exit 2 of every malformed input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from error_line import one_error
from fake_cli import main
from fake_engine import FakeEngine

from mmbatch.cli import EXIT_ITEMS_FAILED, EXIT_JOB_FAILED
from mmbatch.cli import main as real_main
from mmbatch.errors import ConfigError
from mmbatch.recipe.spec import parse_recipe

NUL_PATHS = ["a\0.jpg", "file:///tmp/x%00.jpg", "ok.jpg\0../../secret.jpg"]
"""Paths no file can have; the first is how JSON's ``\\u0000`` escape reads."""
UNNAMEABLE = "\ud800.jpg"
"""A lone surrogate that stands for no byte (JSON's ``\\ud800``): no file name either."""


def jsonl(path: Path, *rows: object) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def batch_line(custom_id: str, url: str | None = None) -> dict[str, object]:
    content: list[object] = [{"type": "text", "text": "What is it?"}]
    if url is not None:
        content.insert(0, {"type": "image_url", "image_url": {"url": url}})
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 5}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


@pytest.fixture
def folder(tmp_path: Path, samples: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    (data / "ok.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    return data


def rows_of(out: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in out.read_text().splitlines()]


def assert_nul_refused(error: dict) -> None:  # type: ignore[type-arg]
    assert (error["stage"], error["kind"]) == ("source", "unreadable"), error
    assert "holds a NUL byte, which no file name can" in error["message"]


@pytest.mark.parametrize("wider", [[], ["--allow-outside-root"]])
def test_a_nul_byte_in_a_manifest_path_is_its_rows_error(
    folder: Path, tmp_path: Path, wider: list[str]
) -> None:
    paths = [*NUL_PATHS, UNNAMEABLE]
    items = jsonl(folder / "items.jsonl", {"path": "ok.jpg"}, *({"path": p} for p in paths))
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(items), "--model", "m", "--out", str(out), "--no-progress", *wider]
    assert main(argv, FakeEngine()) == EXIT_ITEMS_FAILED
    first, *refused, unnameable = rows_of(out)
    assert first["error"] is None
    assert [row["id"] for row in refused] == NUL_PATHS
    for row in refused:
        assert_nul_refused(row["error"])
    assert unnameable["id"] == "\\ud800.jpg"  # the id made printable
    assert (unnameable["error"]["stage"], unnameable["error"]["kind"]) == ("source", "unreadable")
    assert "holds a character that no file name can" in unnameable["error"]["message"]


def test_a_nul_byte_in_a_batch_image_url_is_its_lines_error(folder: Path, tmp_path: Path) -> None:
    lines = [batch_line("ok", "ok.jpg"), *(batch_line(f"n{i}", p) for i, p in enumerate(NUL_PATHS))]
    requests = jsonl(folder / "requests.jsonl", *lines)
    out = tmp_path / "o.jsonl"
    argv = ["run-openai-batch", str(requests), "--model", "m", "--out", str(out), "--no-progress"]
    assert main(argv, FakeEngine()) == EXIT_ITEMS_FAILED
    first, *refused = rows_of(out)
    assert first["response"]["status_code"] == 200
    for row in refused:
        assert row["response"]["status_code"] == 400
        error = row["response"]["body"]["error"]
        assert_nul_refused({"stage": error["stage"], "kind": error["code"], **error})


def test_a_nul_byte_in_a_parquet_path_cell_is_its_rows_error(folder: Path, tmp_path: Path) -> None:
    import datasets

    datasets.Dataset.from_dict({"image": ["ok.jpg", *NUL_PATHS]}).to_parquet(
        str(folder / "d.parquet")
    )
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(folder / "d.parquet"), "--image-column", "image", "--model", "m"]
    assert main([*argv, "--out", str(out), "--no-progress"], FakeEngine()) == EXIT_ITEMS_FAILED
    first, *refused = rows_of(out)
    assert first["error"] is None
    assert len(refused) == len(NUL_PATHS)
    for row in refused:
        assert_nul_refused(row["error"])


LONE = "b\udc80"
"""A custom_id as JSON's ``"b\\udc80"`` escape reads: valid JSON in valid UTF-8, yet no
UTF-8 writer takes the string."""


def test_a_custom_id_that_is_not_valid_unicode_is_kept_and_resumed(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        batch_line("a", "ok.jpg"),
        batch_line(LONE, "ok.jpg"),
        batch_line("c\udfff"),
        {**batch_line("d\ud800"), "url": "/v1/embeddings"},  # refused: an error line
    ]
    requests = folder / "requests.jsonl"
    text = "".join(json.dumps(line) + "\n" for line in lines)
    assert "\\udc80" in text  # the escape, in a file of valid UTF-8
    requests.write_bytes(text.encode("utf-8"))
    out = tmp_path / "o.jsonl"
    argv = ["run-openai-batch", str(requests), "--model", "m", "--out", str(out), "--no-progress"]
    assert main(argv, FakeEngine()) == EXIT_ITEMS_FAILED
    rows = rows_of(out)
    assert [row["custom_id"] for row in rows] == ["a", LONE, "c\udfff", "d\ud800"]
    assert [row["response"]["status_code"] for row in rows] == [200, 200, 200, 400]
    assert "\\udc80" in out.read_text(encoding="utf-8")  # written back with the same escape
    quarantine = (tmp_path / "o.jsonl.quarantine.jsonl").read_text(encoding="utf-8")
    assert [json.loads(line)["id"] for line in quarantine.splitlines()] == ["d\ud800"]
    # Reruns find every row: nothing to redo, nothing crashes.
    written = out.read_bytes()
    capsys.readouterr()
    assert main(argv, FakeEngine()) == EXIT_ITEMS_FAILED
    assert out.read_bytes() == written
    assert "4 items already have a row" in capsys.readouterr().err
    # A run stopped half-way resumes the rest.
    out.write_bytes(b"".join(written.splitlines(keepends=True)[:1]))
    assert main([*argv, "--retry-errors"], FakeEngine()) == EXIT_ITEMS_FAILED
    assert [row["custom_id"] for row in rows_of(out)] == ["a", LONE, "c\udfff", "d\ud800"]


DEEP = "[" * 100_000
"""A hundred thousand nested arrays: Python's JSON and TOML readers recurse on each."""


@pytest.mark.parametrize("kind", ["manifest", "batch"])
def test_json_nested_too_deep_is_a_one_line_error(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    path = folder / "input.jsonl"
    first = {"path": "ok.jpg"} if kind == "manifest" else batch_line("ok", "ok.jpg")
    path.write_text(json.dumps(first) + "\n" + DEEP + "\n")
    out = tmp_path / "o.jsonl"
    command = ["caption", str(path)] if kind == "manifest" else ["run-openai-batch", str(path)]
    argv = [*command, "--model", "m", "--out", str(out), "--no-progress"]
    assert main(argv, FakeEngine()) == EXIT_JOB_FAILED
    assert one_error(capsys) == f"{path}:2: JSON nested too deeply to read"
    assert not out.exists()


def test_a_recipe_nested_too_deep_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = tmp_path / "deep.toml"
    recipe.write_text(f'[prompt]\ntext = "x"\n[engine]\nx = {DEEP}\n')
    assert real_main(["check", str(recipe)]) == EXIT_JOB_FAILED
    assert "nested too deeply" in one_error(capsys)
    # A schema too deep for the schema check, as a recipe read by Python could hold.
    schema: dict[str, object] = {}
    for _ in range(5000):
        schema = {"not": schema}
    with pytest.raises(ConfigError, match=r"^r: \[output\] schema: the JSON schema is nested too"):
        parse_recipe({"prompt": {"text": "x"}, "output": {"format": "json", "schema": schema}}, "r")

"""A job is the same job only with the same model by content and the same prompt per item:
rebuilt weights at the same path are refused on resume (and change the ``DatasetMap``
fingerprint), and an item whose manifest prompt was edited is redone, never kept."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fake_cli import main
from fake_engine import FakeEngine

from mmbatch.cli import EXIT_JOB_FAILED, EXIT_OK
from mmbatch.engine import identity
from mmbatch.engine.identity import model_identity
from mmbatch.integrations.hf_datasets import DatasetMap

WEIGHTS = 2 * 1024 * 1024  # over the 1 MiB the old fingerprint read


def build(model: Path, fill: int) -> None:
    """A model directory whose weights are ``WEIGHTS`` bytes of ``fill``."""
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"hidden_size": 8}')
    weights = model / "model.safetensors"
    stamp = weights.stat() if weights.exists() else None
    weights.write_bytes(bytes([fill]) * WEIGHTS)
    if stamp is not None:  # rebuilt in place, size and mtime as before
        os.utime(weights, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files hashed (not found in the digest cache)."""
    calls: list[str] = []
    real = identity.file_digest

    def counting(path: str) -> tuple[bytes, int]:
        calls.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(identity, "file_digest", counting)
    return calls


def test_a_model_is_known_by_content_and_hashed_once(tmp_path: Path, hashed: list[str]) -> None:
    model = tmp_path / "model"
    build(model, 1)
    first = model_identity(str(model))
    assert sorted(hashed) == ["config.json", "model.safetensors"]
    assert model_identity(str(model)) == first
    assert len(hashed) == 2  # cached by path, size, mtime and ctime
    build(model, 2)  # same size, same mtime, other weights
    assert model_identity(str(model)) != first
    assert hashed[-1] == "model.safetensors"
    assert model_identity("org/name") == "hub:org/name"
    assert model_identity("org/name", "abc123") == "hub:org/name@abc123"


def test_resuming_on_rebuilt_weights_is_refused(
    tmp_path: Path, samples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    build(model, 1)
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(samples / "sunset.jpg"), "--model", str(model), "--out", str(out)]
    argv.append("--no-progress")
    assert main(argv, FakeEngine()) == EXIT_OK
    assert main(argv, FakeEngine()) == EXIT_OK  # the same model: resumed
    build(model, 2)
    capsys.readouterr()
    assert main(argv, FakeEngine()) == EXIT_JOB_FAILED
    assert f"written by a different job (the model's files changed ({model}));" in (
        capsys.readouterr().err
    )
    assert main([*argv, "--force"], FakeEngine()) == EXIT_OK  # asked for: appended


def test_the_same_model_by_another_path_or_a_link_resumes_without_an_engine(
    tmp_path: Path, samples: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local model is its content: ``.tiny``, its absolute path and a link to it are one
    model, so a finished job run again by any of them has nothing to do."""
    model = tmp_path / "model"
    build(model, 1)
    (tmp_path / "link").symlink_to(model)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "o.jsonl"

    def argv(spelled: str) -> list[str]:
        picture = str(samples / "sunset.jpg")
        return ["caption", picture, "--model", spelled, "--out", str(out), "--no-progress"]

    assert main(argv("model"), FakeEngine()) == EXIT_OK
    finished = out.read_bytes()
    for spelled in (str(model), "./model/", "link", str(tmp_path / "link")):
        idle = FakeEngine()
        assert main(argv(spelled), idle) == EXIT_OK, spelled
        assert idle.added == [], spelled  # resumed: nothing left, no engine at work
    assert out.read_bytes() == finished


def test_the_datasetmap_fingerprint_sees_replaced_weights_of_the_same_size(
    tmp_path: Path,
) -> None:
    model = tmp_path / "model"
    build(model, 1)
    before = DatasetMap(str(model), "Describe.").fingerprint
    assert DatasetMap(str(model), "Describe.").fingerprint == before
    build(model, 2)
    assert DatasetMap(str(model), "Describe.").fingerprint != before


def test_the_datasetmap_fingerprint_is_the_same_for_the_model_spelled_another_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model"
    build(model, 1)
    (tmp_path / "link").symlink_to(model)
    monkeypatch.chdir(tmp_path)
    spelled = {DatasetMap(name, "Describe.").fingerprint for name in ("model", str(model), "link")}
    assert len(spelled) == 1
    assert (
        DatasetMap("org/one", "Describe.").fingerprint
        != DatasetMap("org/two", "Describe.").fingerprint
    )


def manifest(folder: Path, prompts: dict[str, str]) -> Path:
    path = folder / "items.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": item, "path": "sunset.jpg", "prompt": prompt}) + "\n"
            for item, prompt in prompts.items()
        )
    )
    return path


def test_an_edited_manifest_prompt_is_redone_not_kept(
    tmp_path: Path, samples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "sunset.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    prompts = {"a": "What is this?", "b": "What colour is the sky?", "c": "Count the clouds."}
    items = manifest(tmp_path, prompts)
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(items), "--model", "fake", "--out", str(out), "--no-progress"]
    assert main(argv, FakeEngine()) == EXIT_OK
    manifest(tmp_path, {**prompts, "b": "Is it raining?"})
    capsys.readouterr()
    assert main(argv, FakeEngine()) == EXIT_OK
    err = capsys.readouterr().err
    assert "1 items whose prompt changed since their row was written (e.g. 'b') are redone" in err
    assert "1 item to do" in err
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert len(out.read_text().splitlines()) == 3
    assert rows["b"]["prompt"] == "Is it raining?"
    assert rows["b"]["text"].endswith("|Is it raining?")
    assert rows["a"]["prompt"] == "What is this?"
    # --force keeps what is there, as it says.
    manifest(tmp_path, {**prompts, "a": "Anything else?"})
    assert main([*argv, "--force"], FakeEngine()) == EXIT_OK
    assert json.loads(out.read_text().splitlines()[0])["prompt"] == "What is this?"


def test_an_edited_prompt_is_redone_in_a_recipe_job(tmp_path: Path, samples: Path) -> None:
    (tmp_path / "sunset.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    recipe = tmp_path / "r.toml"
    recipe.write_text('[prompt]\ntext = "Describe."\n[engine]\nmodel = "fake"\n')
    out = tmp_path / "o.jsonl"
    argv = ["run", str(recipe), "--out", str(out), "--no-progress"]
    assert main([*argv, str(manifest(tmp_path, {"a": "One.", "b": "Two."}))]) == EXIT_OK
    assert main([*argv, str(manifest(tmp_path, {"a": "One.", "b": "Three."}))]) == EXIT_OK
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert len(rows) == 2
    assert rows["b"]["outputs"]["answer"]["prompt"] == "Three."

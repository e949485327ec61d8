"""What inputs may make mmbatch do: paths named inside an input stay inside its folder, URLs are
fetched only when allowed and within limits, a model's own code runs only when asked."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_cli import main
from fake_engine import FakeEngine
from media_server import serving

from mmbatch.cli import EXIT_ITEMS_FAILED, EXIT_JOB_FAILED, EXIT_OK, build_parser
from mmbatch.cli.options import engine_config_from
from mmbatch.engine.config import EngineConfig
from mmbatch.errors import ConfigError, MediaError, SourceError
from mmbatch.media.fetch import UrlPolicy, read_source
from mmbatch.sources.files import SourcePolicy, image_requests
from mmbatch.sources.paths import LocalPaths, is_inside
from mmbatch.types import ItemError


def batch_line(custom_id: str, url: str) -> dict[str, object]:
    """An OpenAI batch line asking about the picture at ``url``."""
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Q?"}]
    messages = [{"role": "user", "content": content}]
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": messages, "max_tokens": 8}}  # fmt: skip


def manifest(folder: Path, *paths: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "items.jsonl"
    path.write_text("".join(json.dumps({"path": p}) + "\n" for p in paths))
    return path


@pytest.fixture
def outside(tmp_path: Path, samples: Path) -> Path:
    secret = tmp_path / "secret.jpg"
    secret.write_bytes((samples / "sunset.jpg").read_bytes())
    return secret


ESCAPES = ["dotdot", "absolute", "file_url", "symlink"]
"""The ways a path written inside an input can lead out of the input's folder."""


def escape(folder: Path, outside: Path, how: str) -> str:
    """A path, written inside an input in ``folder``, that leads to ``outside``."""
    folder.mkdir(parents=True, exist_ok=True)
    if how == "symlink":
        (folder / "link.jpg").symlink_to(outside)
        return "link.jpg"
    named = {"dotdot": os.path.relpath(outside, folder), "absolute": str(outside)}
    return named.get(how) or outside.as_uri()


def inside(folder: Path, samples: Path) -> str:
    """A picture in ``folder``, named as the input names it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ok.jpg").write_bytes((samples / "checkerboard.png").read_bytes())
    return "ok.jpg"


def assert_refused(error: ItemError | dict[str, str] | None, named: str, widen: str) -> None:
    """An error row that says which path, why, and how to allow it."""
    error = error.to_dict() if isinstance(error, ItemError) else error
    assert error is not None
    assert (error["stage"], error["kind"]) == ("source", "not_allowed")
    assert repr(named) in error["message"]
    assert "a path named inside an input must stay inside its folder" in error["message"]
    assert widen in error["message"]


@pytest.mark.parametrize("how", ESCAPES)
def test_a_manifest_path_outside_its_folder_is_its_rows_error(
    tmp_path: Path, samples: Path, outside: Path, how: str
) -> None:
    data = tmp_path / "data"
    named = escape(data, outside, how)
    items = manifest(data, inside(data, samples), named)
    ok, refused = image_requests([str(items)], "p")
    assert ok.error is None
    assert ok.media[0].source == str(data / "ok.jpg")
    assert_refused(refused.error, named, "--input-root DIR")
    assert refused.error is not None
    assert f"{items}:2: " in refused.error.message
    for wider in (LocalPaths((str(tmp_path),)), LocalPaths(anywhere=True)):
        allowed = image_requests([str(items)], "p", policy=SourcePolicy(wider))
        assert [r.error for r in allowed] == [None, None]


def test_videos_and_audio_outside_a_manifests_folder_are_not_opened(
    tmp_path: Path, samples: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frame and audio jobs open a file while listing it (its frames, its length): a path
    refused is its row's error before anything reads it, and a clip as a whole likewise."""
    from mmbatch.media.options import AudioOptions, VideoOptions
    from mmbatch.sources import timeline
    from mmbatch.sources.mixed_media import Takes, list_media, media_requests

    opened: list[str] = []
    monkeypatch.setattr(timeline, "_frames_taken", lambda path, *a: opened.append(path))
    monkeypatch.setattr("mmbatch.media.audio.probe_audio", lambda path: opened.append(path))
    data = tmp_path / "data"
    for name in ("clip.mp4", "tone.wav"):
        (tmp_path / name).write_bytes((samples / name).read_bytes())
        items = manifest(data, f"../{name}")
        listed = [
            *timeline.frame_requests([str(items)], VideoOptions(num_frames=2), "p"),
            *timeline.audio_requests([str(items)], AudioOptions(), "p"),
            *media_requests(list_media([str(items)]), "p", takes=Takes(("video",), as_clip=True)),
        ]
        for request in listed:
            assert_refused(request.error, f"../{name}", "--input-root DIR")
    assert opened == []


@pytest.mark.parametrize("how", ESCAPES)
def test_a_batch_file_path_outside_its_folder_is_its_lines_error(
    tmp_path: Path, samples: Path, outside: Path, how: str
) -> None:
    from mmbatch.openai_batch.reader import read_batch

    data = tmp_path / "data"
    named = escape(data, outside, how)
    lines = [batch_line("ok", inside(data, samples)), batch_line("out", named)]
    (data / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    ok, refused = read_batch(data / "requests.jsonl").requests
    assert ok.error is None
    assert_refused(refused.error, named, "--input-root DIR")
    wider = read_batch(data / "requests.jsonl", paths=LocalPaths((str(tmp_path),)))
    assert [r.error for r in wider.requests] == [None, None]
    assert Path(wider.requests[1].media[0].source).resolve() == outside


@pytest.mark.parametrize("how", ESCAPES)
def test_a_dataset_path_outside_its_folder_is_its_rows_error(
    tmp_path: Path, samples: Path, outside: Path, how: str
) -> None:
    """A local dataset's path cells, as {bytes: None, path} (how datasets stores a picture
    by path) and as a plain string column: relative to the dataset's folder."""
    import datasets

    from mmbatch.sources.local_datasets import DatasetInput, dataset_requests

    cell = {"bytes": datasets.Value("binary"), "path": datasets.Value("string")}
    for fmt in ("disk", "parquet"):
        folder = tmp_path / fmt  # the dataset's own folder
        named = escape(folder, outside, how)
        paths = [inside(folder, samples), named]
        if fmt == "disk":
            cells = [{"bytes": None, "path": p} for p in paths]
            features = datasets.Features({"image": cell})
            datasets.Dataset.from_dict({"image": cells}, features).save_to_disk(str(folder))
            spec = DatasetInput(str(folder), "disk", image_column="image")
        else:
            datasets.Dataset.from_dict({"image": paths}).to_parquet(str(folder / "d.parquet"))
            spec = DatasetInput(str(folder / "d.parquet"), "parquet", image_column="image")
        ok, refused = dataset_requests(spec, "p")
        assert ok.error is None, spec
        assert ok.media[0].source == str(folder / "ok.jpg")
        assert_refused(refused.error, named, "--input-root DIR")
        wider = dataset_requests(spec, "p", paths=LocalPaths((str(tmp_path),)))
        assert [r.error for r in wider] == [None, None]


def test_a_dataset_map_reads_path_cells_only_inside_the_folders_its_caller_allows(
    tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DatasetMap's dataset (from the Hub, from memory) has no folder of its own: a cell
    holding only a path is read inside ``allowed_paths`` only; bytes need no permission."""
    from mmbatch.integrations.hf_datasets import DatasetMap

    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "link.jpg").symlink_to(outside)
    (allowed / "ok.jpg").write_bytes(outside.read_bytes())
    named = [str(outside), os.path.relpath(outside), outside.as_uri(), str(allowed / "link.jpg")]
    cells = [{"bytes": None, "path": named[0]}, named[1], named[2], {"path": named[3]}]
    pictures = [str(allowed / "ok.jpg"), {"bytes": outside.read_bytes(), "path": str(outside)}]
    batch = {"image": [*cells, *pictures]}
    rows = list(range(len(batch["image"])))
    monkeypatch.setattr(DatasetMap, "_engine", lambda self, *args: FakeEngine())
    mapper = DatasetMap("unused-model", "Describe.", allowed_paths=[str(allowed)])
    out = mapper(batch, rows, None)
    for index, path in enumerate(named):
        error = out["error"][index]
        assert error.startswith(f"source: row {index}: {path!r} leads to {outside}"), error
        assert "(allow another folder with DatasetMap(allowed_paths=[DIR]))" in error
    assert out["error"][len(named) :] == ["", ""]  # inside the folder allowed; bytes
    # Called by hand, the callable cannot see its dataset's origin: no column of refusals,
    # but the one-argument fix at the first path cell refused.
    with pytest.raises(ConfigError, match=r"allow their folder with DatasetMap\(\.\.\., allowed"):
        DatasetMap("unused-model", "Describe.")(batch, rows, None)
    wider = DatasetMap("unused-model", "Describe.", allowed_paths=[str(tmp_path)])
    assert wider(batch, rows, None)["error"] == [""] * len(rows)
    assert len(set(wider(batch, rows, None)["text"])) == 1  # one picture, however named
    assert wider.fingerprint != mapper.fingerprint


@pytest.mark.parametrize("kind", ["manifest", "batch", "dataset"])
def test_the_commands_give_refused_paths_error_rows_and_go_on(
    tmp_path: Path, samples: Path, outside: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through each command, every escape at once: one error row each, the picture inside
    captioned, exit 1; --input-root admits them, and the gallery shows no refused file."""
    from mmbatch import cli

    data = tmp_path / "data"
    named = [escape(data, outside, how) for how in ESCAPES]
    ok = inside(data, samples)
    out = tmp_path / "o.jsonl"
    if kind == "manifest":
        argv = ["caption", str(manifest(data, ok, *named)), "--model", "fake"]
    elif kind == "batch":
        lines = [batch_line(f"r{i}", p) for i, p in enumerate([ok, *named])]
        (data / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        argv = ["run-openai-batch", str(data / "requests.jsonl"), "--model", "fake"]
    else:
        import datasets

        datasets.Dataset.from_dict({"image": [ok, *named]}).to_parquet(str(data / "d.parquet"))
        argv = ["caption", str(data / "d.parquet"), "--image-column", "image", "--model", "f"]
    argv += ["--out", str(out), "--no-progress"]
    assert main(argv, FakeEngine()) == EXIT_ITEMS_FAILED
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    errors = [
        row["response"]["body"].get("error") if kind == "batch" else row["error"] for row in rows
    ]
    assert errors[0] is None
    for error, path in zip(errors[1:], named, strict=True):
        if kind == "batch":
            error = {"stage": error["stage"], "kind": error["code"], "message": error["message"]}
        assert_refused(error, path, "--input-root DIR")
    page = tmp_path / "report.html"
    assert cli.main(["report", str(out), "--html", str(page)]) == EXIT_OK
    assert page.read_text().count("<img ") == 1  # the picture inside, not the secret
    capsys.readouterr()
    # Allowed, the refused rows are redone: the secret picture is read now, and shown.
    wider = [*argv, "--retry-errors", "--input-root", str(tmp_path)]
    assert main(wider, FakeEngine()) == EXIT_OK
    assert len(out.read_text().splitlines()) == 1 + len(ESCAPES)
    assert cli.main(["report", str(out), "--html", str(page)]) == EXIT_OK
    assert page.read_text().count("<img ") == 1 + len(ESCAPES)


def test_a_folder_whose_name_extends_the_inputs_is_outside_it(
    tmp_path: Path, samples: Path
) -> None:
    """``data`` is a prefix of ``data2``'s name, not of its path: ``../data2/x.jpg`` leaves
    ``data``. (A check by string prefix would let it through.)"""
    (tmp_path / "data2").mkdir()
    (tmp_path / "data2" / "x.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    items = manifest(tmp_path / "data", "../data2/x.jpg")
    [refused] = image_requests([str(items)], "p")
    assert_refused(refused.error, "../data2/x.jpg", "--input-root DIR")
    root = str(tmp_path / "data")
    assert not is_inside(str(tmp_path / "data2" / "x.jpg"), root)
    assert is_inside(str(tmp_path / "data" / "x.jpg"), root)
    assert is_inside(root, root)
    assert is_inside(str(tmp_path / "data2"), "/")


def test_manifest_values_are_data(tmp_path: Path, samples: Path) -> None:
    (tmp_path / "a.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    sneaky = "__import__('os').system('touch pwned')"
    (tmp_path / "items.csv").write_text(f'path,id,prompt\na.jpg,"{sneaky}","{sneaky}"\n')
    [request] = image_requests([str(tmp_path / "items.csv")], "p")
    assert request.id == sneaky
    assert request.prompt == sneaky
    assert not (tmp_path / "pwned").exists()


@pytest.fixture
def server(samples: Path) -> Iterator[str]:
    payloads = {"/sunset.jpg": (samples / "sunset.jpg").read_bytes(), "/big.bin": b"\0" * 300_000}
    with serving(payloads) as httpd:
        yield httpd.url


def test_urls_are_refused_unless_allowed(tmp_path: Path, server: str) -> None:
    """A manifest's URL is its row's error (as a path out of its folder is); a URL named on
    the command line is the job's mistake."""
    items = manifest(tmp_path, f"{server}/sunset.jpg")
    [refused] = image_requests([str(items)], "p")
    assert refused.error is not None
    assert (refused.error.stage, refused.error.kind) == ("source", "not_allowed")
    assert f"{items}:1: '{server}/sunset.jpg' is a URL" in refused.error.message
    assert "--allow-urls" in refused.error.message
    with pytest.raises(SourceError, match="--allow-urls"):
        image_requests([f"{server}/sunset.jpg"], "p")
    with pytest.raises(MediaError, match="--allow-urls"):
        read_source(f"{server}/sunset.jpg", None)


def test_allowed_urls_are_fetched_within_size_and_time(server: str, samples: Path) -> None:
    policy = UrlPolicy(max_bytes=100_000, timeout_s=1.0)
    assert read_source(f"{server}/sunset.jpg", policy) == (samples / "sunset.jpg").read_bytes()
    with pytest.raises(MediaError, match="over the URL size limit") as big:
        read_source(f"{server}/big.bin", policy)
    assert big.value.kind == "too_large"
    started = time.monotonic()
    with pytest.raises(MediaError, match=r"took over 1 s|timed out") as slow:
        read_source(f"{server}/slow", policy)
    assert time.monotonic() - started < 10  # the 1 s limit, not the body's 20 s
    assert slow.value.kind == "unreadable"
    with pytest.raises(MediaError, match="HTTP 404 Not Found") as missing:
        read_source(f"{server}/nope.jpg", policy)
    assert missing.value.stage == "load"
    with pytest.raises(MediaError, match="only http and https"):
        read_source("file:///etc/passwd", policy)


def test_url_inputs_through_the_command(
    tmp_path: Path, server: str, samples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ok.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    items = manifest(tmp_path, f"{server}/sunset.jpg", f"{server}/big.bin", "ok.jpg")
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(items), "--model", "fake", "--out", str(out), "--no-progress"]
    # Without --allow-urls, each URL is its row's error and the path is captioned.
    assert main(argv, FakeEngine()) == EXIT_ITEMS_FAILED
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["ok.jpg"]["error"] is None
    for url in (f"{server}/sunset.jpg", f"{server}/big.bin"):
        assert rows[url]["error"]["kind"] == "not_allowed"
        assert "--allow-urls" in rows[url]["error"]["message"]
    capsys.readouterr()
    allowed = [*argv, "--allow-urls", "--url-max-bytes", "100000", "--retry-errors"]
    assert main(allowed, FakeEngine()) == EXIT_ITEMS_FAILED
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows[f"{server}/sunset.jpg"]["error"] is None
    assert rows[f"{server}/big.bin"]["error"]["kind"] == "too_large"
    # A URL named on the command line without --allow-urls is the job's mistake.
    named = ["caption", f"{server}/sunset.jpg", "--model", "fake", "--out", str(out) + "2"]
    assert main(named, FakeEngine()) == EXIT_JOB_FAILED
    assert "--allow-urls" in capsys.readouterr().err


def test_remote_code_runs_only_when_asked() -> None:
    assert EngineConfig("m").llm_kwargs()["trust_remote_code"] is False
    parse = build_parser().parse_args
    plain = parse(["caption", "x", "--model", "m", "--out", "o"])
    assert engine_config_from(plain).llm_kwargs()["trust_remote_code"] is False
    asked = parse(["caption", "x", "--model", "m", "--out", "o", "--trust-remote-code"])
    assert engine_config_from(asked).llm_kwargs()["trust_remote_code"] is True


PAYLOAD = "recipe_payload"
"""A module on the path that leaves a marker file beside itself when it is imported: what
a hostile recipe would have vLLM import."""


@pytest.fixture
def payload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "payload"
    folder.mkdir()
    (folder / f"{PAYLOAD}.py").write_text(
        "from pathlib import Path\n"
        "Path(__file__).with_suffix('.imported').write_text('imported')\n"
        "def evil(*args, **kwargs):\n    return None\n"
        "class Evil:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, PAYLOAD, raising=False)
    return folder / f"{PAYLOAD}.imported"


def shared_recipe(tmp_path: Path, engine: str) -> Path:
    recipe = tmp_path / "shared.toml"
    recipe.write_text(f'[prompt]\ntext = "Describe."\n[engine]\nmodel = "m"\n{engine}\n')
    return recipe


ATTACKS = [
    # Each of these once reached vLLM untouched, and the first two imported the module
    (f'compilation_config = {{ inductor_passes = {{ p = "{PAYLOAD}.evil" }} }}',
     "compilation_config.inductor_passes"),
    (f'compilation_config = {{ backend = "{PAYLOAD}.evil" }}', "compilation_config.backend"),
    (f'hf_overrides = {{ auto_map = {{ AutoConfig = "{PAYLOAD}.Evil" }} }}', "hf_overrides"),
    ('chat_template = "../../elsewhere/template.jinja"', "chat_template"),
    ("mm_processor_kwargs = { trust_remote_code = true }",
     "mm_processor_kwargs.trust_remote_code"),
    # settings that name code to import, or files to read
    (f'worker_extension_cls = "{PAYLOAD}.Evil"', "worker_extension_cls"),
    (f'logits_processors = ["{PAYLOAD}.Evil"]', "logits_processors"),
    (f'distributed_executor_backend = "{PAYLOAD}.Evil"', "distributed_executor_backend"),
    (f'kv_transfer_config = {{ kv_connector_module_path = "{PAYLOAD}" }}', "kv_transfer_config"),
    (f'speculative_config = {{ method = "custom_class", model = "{PAYLOAD}.Evil" }}',
     "speculative_config"),
    ('tokenizer = "/elsewhere/tokenizer"', "tokenizer"),
    ('generation_config = "/elsewhere/folder"', "generation_config"),
    ('tokenizer_mode = "custom"', "tokenizer_mode"),
    ('load_format = "tensorizer"', "load_format"),
    ('download_dir = "/elsewhere"', "download_dir"),
    (f'quantization = "{PAYLOAD}.Evil"', "quantization"),
    # a setting that starts a cluster whose daemons listen on the network
    ('distributed_executor_backend = "ray"', "distributed_executor_backend"),
]  # fmt: skip


@pytest.mark.parametrize(("engine", "key"), ATTACKS)
def test_a_recipe_cannot_make_code_run_or_files_be_read(
    tmp_path: Path,
    samples: Path,
    payload: Path,
    capsys: pytest.CaptureFixture[str],
    engine: str,
    key: str,
) -> None:
    """Refused by check and by run when the recipe is read, one line naming the key and
    the command-line way to set it, before anything is written or imported."""
    from mmbatch import cli

    recipe = shared_recipe(tmp_path, engine)
    assert cli.main(["check", str(recipe)]) == EXIT_JOB_FAILED
    error = capsys.readouterr().err
    assert f"[engine] {key}" in error
    assert f"--engine-arg {key.split('.')[0]}=" in error
    assert len(error.strip().splitlines()) == 1
    out = tmp_path / "o.jsonl"
    argv = ["run", str(recipe), str(samples / "sunset.jpg"), "--out", str(out)]
    assert main([*argv, "--no-progress"], FakeEngine()) == EXIT_JOB_FAILED
    assert f"[engine] {key}" in capsys.readouterr().err
    assert not out.exists()
    assert not payload.exists()


def test_trust_remote_code_in_a_recipe_is_refused_with_the_flag_that_allows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mmbatch import cli

    recipe = shared_recipe(tmp_path, "trust_remote_code = true")
    assert cli.main(["check", str(recipe)]) == EXIT_JOB_FAILED
    assert "pass --trust-remote-code to the command to allow it" in capsys.readouterr().err


def test_check_and_run_import_nothing_a_recipe_names(
    tmp_path: Path, samples: Path, payload: Path, tiny_vl_model: Path
) -> None:
    """With a real model at hand, check and run read vLLM's own configuration (which is
    where the module was imported before): both refuse first, and nothing is imported."""
    from mmbatch import cli

    for engine, _ in ATTACKS[:2]:
        recipe = shared_recipe(tmp_path, engine)
        model = ["--model", str(tiny_vl_model)]
        assert cli.main(["check", str(recipe), *model]) == EXIT_JOB_FAILED
        assert not payload.exists()
        out = tmp_path / "o.jsonl"
        argv = ["run", str(recipe), str(samples / "sunset.jpg"), "--out", str(out)]
        assert cli.main([*argv, *model, "--no-progress"]) == EXIT_JOB_FAILED
        assert not payload.exists()
        assert not out.exists()
        assert PAYLOAD not in sys.modules


def test_a_recipe_on_ray_or_in_python_is_held_to_the_same_rule(
    tmp_path: Path, samples: Path, payload: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The faces a recipe reaches besides check and run: run --ray (refused before Ray is
    asked for anything), and a Recipe made in Python for a Ray job or a DatasetMap."""
    from types import MappingProxyType

    from mmbatch.integrations.ray_replica import RayJob
    from mmbatch.recipe.spec import Question, Recipe, load_recipe, parse_recipe

    engine, key = ATTACKS[0]
    recipe = shared_recipe(tmp_path, engine)
    out = tmp_path / "ray-out"
    argv = ["run", str(recipe), str(samples / "sunset.jpg"), "--out", str(out)]
    assert main([*argv, "--ray", "--gpus-per-replica", "0"], FakeEngine()) == EXIT_JOB_FAILED
    assert f"[engine] {key}" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(ConfigError, match=r"\[engine\] hf_overrides: not a setting"):
        parse_recipe(
            {"prompt": {"text": "x"}, "engine": {"hf_overrides": {"auto_map": {}}}}, "r.toml"
        )
    good = load_recipe(shared_recipe(tmp_path, "max_model_len = 2048"))
    with pytest.raises(ConfigError, match=r"\[engine\] compilation_config\.backend"):
        Recipe(
            name="built",
            questions=(Question("answer", "Describe."),),
            system=None,
            description="",
            sampling=good.sampling,
            engine=MappingProxyType({"compilation_config": {"backend": f"{PAYLOAD}.evil"}}),
            media=good.media,
            output=good.output,
        )
    # What a recipe can hand a Ray job or a DatasetMap is only what it may hold.
    job = RayJob(EngineConfig("m", good.engine_kwargs()), recipe=good)
    assert dict(job.engine.engine_kwargs) == {"max_model_len": 2048}
    assert not payload.exists()


def test_the_command_line_allows_what_a_recipe_cannot(tmp_path: Path, samples: Path) -> None:
    from mmbatch.cli.options import engine_args_from
    from mmbatch.recipe.spec import load_recipe

    recipe = tmp_path / "r.toml"
    recipe.write_text('[prompt]\ntext = "Describe."\n[engine]\ntrust_remote_code = false\n')
    assert load_recipe(recipe).engine_kwargs() == {"trust_remote_code": False}  # harmless
    argv = ["run", str(recipe), str(samples / "sunset.jpg")]
    argv += ["--out", str(tmp_path / "o.jsonl"), "--model", "m", "--no-progress"]
    chosen = [
        "worker_extension_cls=mine.X",
        'compilation_config={"backend": "mine.backend"}',
        'hf_overrides={"architectures": ["Mine"]}',
        "chat_template=/home/me/template.jinja",
        "distributed_executor_backend=ray",
    ]
    args = build_parser().parse_args(
        [*argv, "--trust-remote-code", *(f"--engine-arg={pair}" for pair in chosen)]
    )
    assert engine_args_from(args) == {
        "trust_remote_code": True,
        "worker_extension_cls": "mine.X",
        "compilation_config": {"backend": "mine.backend"},
        "hf_overrides": {"architectures": ["Mine"]},
        "chat_template": "/home/me/template.jinja",
        "distributed_executor_backend": "ray",
    }
    # The job runs with them (on the fake engine: nothing is imported here).
    assert main([*argv, *(f"--engine-arg={pair}" for pair in chosen)], FakeEngine()) == EXIT_OK

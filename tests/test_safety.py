"""What inputs may make mmbatch do: manifest paths stay inside the input root, URLs are
fetched only when allowed and within limits, a model's own code runs only when asked."""

from __future__ import annotations

import http.server
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_cli import main

from mmbatch.cli import EXIT_JOB_FAILED, EXIT_OK, build_parser
from mmbatch.cli.options import engine_config_from
from mmbatch.engine.config import EngineConfig
from mmbatch.errors import MediaError, SourceError
from mmbatch.media.fetch import UrlPolicy, read_source
from mmbatch.sources.files import SourcePolicy, image_requests
from mmbatch.testing.fake_engine import FakeEngine


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


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_manifest_paths_cannot_leave_the_manifest_folder(
    tmp_path: Path, outside: Path, how: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    if how == "symlink":
        (data / "link.jpg").symlink_to(outside)
    entry = {"dotdot": "../secret.jpg", "absolute": str(outside), "symlink": "link.jpg"}[how]
    items = manifest(data, entry)
    with pytest.raises(SourceError, match=r"items\.jsonl:1: .* resolves outside the input root"):
        image_requests([str(items)], "p")
    allowed = image_requests([str(items)], "p", policy=SourcePolicy(allow_outside_root=True))
    assert len(allowed) == 1


def test_a_declared_root_can_be_wider_than_the_manifest_folder(
    tmp_path: Path, outside: Path
) -> None:
    items = manifest(tmp_path / "lists", "../secret.jpg")
    with pytest.raises(SourceError):
        image_requests([str(items)], "p")
    wider = SourcePolicy(root=str(tmp_path))
    assert [r.media[0].source for r in image_requests([str(items)], "p", policy=wider)] == [
        str(tmp_path / "lists" / "../secret.jpg")
    ]


def test_the_command_refuses_an_escaping_manifest_before_starting_anything(
    tmp_path: Path, outside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = manifest(tmp_path / "data", "../secret.jpg")
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(items), "--model", "fake", "--out", str(out), "--no-progress"]
    engine = FakeEngine()
    assert main(argv, engine) == EXIT_JOB_FAILED
    assert "--allow-outside-root" in capsys.readouterr().err
    assert not out.exists()
    assert engine.added == []
    assert main([*argv, "--allow-outside-root"], FakeEngine()) == EXIT_OK


def test_manifest_values_are_data(tmp_path: Path, samples: Path) -> None:
    (tmp_path / "a.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    sneaky = "__import__('os').system('touch pwned')"
    (tmp_path / "items.csv").write_text(f'path,id,prompt\na.jpg,"{sneaky}","{sneaky}"\n')
    [request] = image_requests([str(tmp_path / "items.csv")], "p")
    assert request.id == sneaky
    assert request.prompt == sneaky
    assert not (tmp_path / "pwned").exists()


class _Server(http.server.ThreadingHTTPServer):
    payloads: dict[str, bytes]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        if self.path == "/slow":
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(40):  # trickles for 4 s
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.1)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up, as it should
            return
        body = self.server.payloads.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the tests read the results, not the access log."""


@pytest.fixture
def server(samples: Path) -> Iterator[str]:
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.payloads = {
        "/sunset.jpg": (samples / "sunset.jpg").read_bytes(),
        "/big.bin": b"\0" * 300_000,
    }
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_urls_are_refused_unless_allowed(tmp_path: Path, server: str) -> None:
    items = manifest(tmp_path, f"{server}/sunset.jpg")
    with pytest.raises(SourceError, match="--allow-urls"):
        image_requests([str(items)], "p")
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
    assert time.monotonic() - started < 3
    assert slow.value.kind == "unreadable"
    with pytest.raises(MediaError, match="HTTP 404 Not Found") as missing:
        read_source(f"{server}/nope.jpg", policy)
    assert missing.value.stage == "load"
    with pytest.raises(MediaError, match="only http and https"):
        read_source("file:///etc/passwd", policy)


def test_url_inputs_through_the_command(
    tmp_path: Path, server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    items = manifest(tmp_path, f"{server}/sunset.jpg", f"{server}/big.bin")
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(items), "--model", "fake", "--out", str(out), "--no-progress"]
    assert main(argv, FakeEngine()) == EXIT_JOB_FAILED
    assert "--allow-urls" in capsys.readouterr().err
    assert main([*argv, "--allow-urls", "--url-max-bytes", "100000"], FakeEngine()) == 1
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows[f"{server}/sunset.jpg"]["error"] is None
    assert rows[f"{server}/big.bin"]["error"]["kind"] == "too_large"


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
    # issue 24's: each reached vLLM untouched, and the first two imported the module
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
    argv = ["run", str(recipe), "--input", str(samples / "sunset.jpg"), "--out", str(out)]
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
        argv = ["run", str(recipe), "--input", str(samples / "sunset.jpg"), "--out", str(out)]
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

    from mmbatch.errors import ConfigError
    from mmbatch.integrations.ray_data import RayJob
    from mmbatch.recipe.spec import Question, Recipe, load_recipe, parse_recipe

    engine, key = ATTACKS[0]
    recipe = shared_recipe(tmp_path, engine)
    out = tmp_path / "ray-out"
    argv = ["run", str(recipe), "--input", str(samples / "sunset.jpg"), "--out", str(out)]
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
    argv = ["run", str(recipe), "--input", str(samples / "sunset.jpg")]
    argv += ["--out", str(tmp_path / "o.jsonl"), "--model", "m", "--no-progress"]
    chosen = [
        "worker_extension_cls=mine.X",
        'compilation_config={"backend": "mine.backend"}',
        'hf_overrides={"architectures": ["Mine"]}',
        "chat_template=/home/me/template.jinja",
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
    }
    # The job runs with them (on the fake engine: nothing is imported here).
    assert main([*argv, *(f"--engine-arg={pair}" for pair in chosen)], FakeEngine()) == EXIT_OK

"""``mmbatch engine start|stop|list``: a vLLM engine kept alive between jobs, for those who
iterate (``mmbatch.engine.kept``): jobs given ``--engine NAME`` run on it, without paying
the engine's start-up each time."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

from mmbatch.cli.options import EXIT_OK, Commands, engine_args_from

START_POLL = 0.2
"""Seconds between looks at a starting engine's record."""
SAID = "mmbatch: error: "
"""How the engine's process says why it did not start, in its log."""
STOP_WAIT = 60.0
"""Seconds a stopping engine has to close, before it is ended by signal."""


def register(commands: Commands) -> None:
    parser = commands.add_parser(
        "engine", help="keep a vLLM engine alive between jobs (start, stop, list)"
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    start = verbs.add_parser(
        "start", help="start an engine in the background; prints its name once it is ready"
    )
    start.add_argument("model", help="local model directory or hub name")
    start.add_argument("--name", default=None, help="its name (default: the model's)")
    start.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to vllm.LLM untouched (VALUE parsed as JSON when it is JSON); repeatable",
    )
    start.add_argument(
        "--media-per-prompt",
        action="append",
        default=[],
        metavar="MODALITY=N",
        help="the most items of a kind one request may carry (default image=1); repeatable",
    )
    start.add_argument("--gpus", type=int, default=None, metavar="N")
    start.add_argument("--engines-per-gpu", type=int, default=None, metavar="K")
    start.add_argument("--trust-remote-code", action="store_true")
    start.add_argument("--batch-invariant", action="store_true")
    start.set_defaults(handler=run_start)
    stop = verbs.add_parser("stop", help="stop a kept engine")
    stop.add_argument("name")
    stop.set_defaults(handler=run_stop)
    listing = verbs.add_parser("list", help="the kept engines: name, model, pid, uptime, layout")
    listing.set_defaults(handler=run_list)


def run_start(args: argparse.Namespace) -> int:
    from mmbatch.engine.config import EngineConfig, check_model_name
    from mmbatch.engine.kept_folder import EngineFiles
    from mmbatch.errors import ConfigError

    check_model_name(args.model)
    media = _media_per_prompt(args.media_per_prompt)
    config = EngineConfig(args.model, engine_args_from(args))  # checked as it is made
    name = args.name or os.path.basename(os.path.normpath(args.model)).replace("/", "-")
    files = EngineFiles.of(name, create=True)
    record = files.read_info()
    if record is not None:
        if _alive(record.get("pid")):
            raise ConfigError(f"an engine named {name!r} runs already (pid {record['pid']})")
        files.remove()  # a record left by an engine that died
    settings = {
        "name": name,
        "model": config.model,
        "engine_kwargs": dict(config.engine_kwargs),
        "gpus": args.gpus,
        "engines_per_gpu": args.engines_per_gpu,
        "batch_invariant": args.batch_invariant,
        "media_per_prompt": media,
    }
    fd = os.open(files.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "mmbatch.engine.kept_server", json.dumps(settings)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # its own session: it outlives this command and its terminal
        )
    print(f"mmbatch: starting engine {name} (its log: {files.log})", file=sys.stderr)
    while True:
        record = files.read_info()
        if record is not None and record.get("ready") and record.get("pid") == server.pid:
            print(name)
            return EXIT_OK
        if server.poll() is not None:
            lines = [ln for ln in files.log.read_text(errors="replace").splitlines() if ln]
            said = [ln.removeprefix(SAID) for ln in lines if ln.startswith(SAID)]
            why = (said or lines or [f"exit code {server.returncode}"])[-1]
            raise ConfigError(f"the engine {name!r} did not start: {why} (its log: {files.log})")
        time.sleep(START_POLL)


def run_stop(args: argparse.Namespace) -> int:
    from multiprocessing.connection import Client

    from mmbatch.engine.kept_folder import EngineFiles
    from mmbatch.errors import ConfigError

    files = EngineFiles.of(args.name)
    record = files.read_info()
    if record is None:
        raise ConfigError(f"no kept engine {args.name!r}")
    pid = record.get("pid")
    answered = False  # the engine proved it is the recorded one: it holds the key
    try:
        conn = Client(str(files.socket), family="AF_UNIX", authkey=files.read_key())
        conn.send(("stop",))
        conn.recv()
        conn.close()
        answered = True
    except (OSError, EOFError):
        if isinstance(pid, int) and _alive(pid):
            os.kill(pid, signal.SIGTERM)  # still starting: it stops on SIGTERM too
    if isinstance(pid, int):
        _ended(pid, whole_session=answered)
    files.remove()
    print(f"mmbatch: engine {args.name} stopped", file=sys.stderr)
    return EXIT_OK


def _ended(pid: int, whole_session: bool) -> None:
    """Wait for the kept engine's server ``pid`` to end, up to ``STOP_WAIT``, then SIGKILL
    its process group. ``whole_session``: the server answered on its socket, so the session
    it leads is the engine's, not a process that took a stale record's pid; then every
    process of that session (its engine processes, vLLM's engine core under each: what
    holds the GPU) is waited for too, and killed if left, so that once ``stop`` returns the
    GPU is free for the next job."""
    from mmbatch.lifetime import live_processes

    def left() -> list[int]:
        return live_processes(session=pid) if whole_session else []

    deadline = time.monotonic() + STOP_WAIT
    while (_alive(pid) or left()) and time.monotonic() < deadline:
        time.sleep(START_POLL)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # it leads its session and its group
    for process in left():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process, signal.SIGKILL)


def run_list(args: argparse.Namespace) -> int:
    from mmbatch.engine.kept_folder import kept_engines

    rows = []
    for files in kept_engines():
        record = files.read_info() or {}
        pid = record.get("pid")
        if not _alive(pid):
            files.remove()  # an engine that died: its record goes
            continue
        uptime = int(time.time() - float(record.get("started", time.time())))
        layout = record.get("layout") if record.get("ready") else "(starting)"
        rows.append((files.name, str(record.get("model")), str(pid), _duration(uptime), layout))
    header = ("NAME", "MODEL", "PID", "UPTIME", "LAYOUT")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row, widths, strict=False)]
        print("  ".join([*cells, str(row[4])]))
    return EXIT_OK


def _media_per_prompt(pairs: list[str]) -> dict[str, int]:
    from mmbatch.errors import ConfigError

    media: dict[str, int] = {}
    for pair in pairs:
        modality, _, count = pair.partition("=")
        if modality not in ("image", "video", "audio") or not count.isdigit():
            raise ConfigError(f"--media-per-prompt {pair!r}: not MODALITY=N (image, video, audio)")
        media[modality] = int(count)
    return media or {"image": 1}


def _alive(pid: object) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie left for its parent to reap holds nothing: it is gone
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return True


def _duration(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"

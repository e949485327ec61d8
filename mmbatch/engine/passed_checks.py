"""Engine settings that passed vLLM's device-free check, remembered on the host across runs.

Ray's driver checks a job's engine settings as vLLM reads them before any replica starts, so
that a mistake exits 2 in one line with nothing left behind (``check_engine_without_devices``).
That check is vLLM's import and the model's config read (vLLM's import alone took 15-17 s in
an engine process on an H200 host, 4-7 s on a 2-core CPU machine), and every ``--ray``
command spent it before its first replica began to start. A job run again with
settings that passed before need not spend it again, nor a ``--ray`` job after a local one
of the same settings: a local job's check (``check_engine``: vLLM's whole engine config,
more than the driver's check reads) is remembered too.

A pass is keyed by everything the check reads: the model by its content (``model_identity``:
every file of a local directory), the engine settings, and the versions of vLLM and mmbatch.
A hub name's content is the hub's to change, so its passes are not kept. Each pass is an
empty file named by its key under ``$MMBATCH_CACHE_DIR/passed-checks``: two jobs remembering
at once cannot spoil each other, and a folder that cannot be read or written costs only the
check. A replica's engine still checks its settings as it starts, as every engine does: a
pass remembered wrongly (an mmbatch built from changed sources under the same version) would
cost the early one-line error, never a wrong engine.
"""

from __future__ import annotations

import importlib.metadata
import json
from contextlib import suppress
from pathlib import Path

import xxhash

from mmbatch.engine.config import EngineConfig
from mmbatch.engine.identity import cache_root, model_identity
from mmbatch.engine.installed_vllm import vllm_version

FOLDER = "passed-checks"


def pass_key(config: EngineConfig) -> str | None:
    """The key of ``config``'s check on this host (the model's content, the settings, the
    versions); None for a hub model, whose passes are not kept."""
    identity = model_identity(config.model)
    if not identity.startswith("dir:"):
        return None
    what = [identity, config.engine_kwargs, vllm_version(), _mmbatch_version()]
    return xxhash.xxh3_128_hexdigest(json.dumps(what, sort_keys=True, default=str).encode())


def passed_before(key: str | None) -> bool:
    """Whether the check of ``key`` passed on this host before."""
    return key is not None and _marker(key).is_file()


def remember_pass(key: str | None) -> None:
    """Keep that the check of ``key`` passed (nothing for None, or where the cache cannot
    be written)."""
    if key is None:
        return
    with suppress(OSError):
        marker = _marker(key)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()


def _mmbatch_version() -> str | None:
    """The installed mmbatch's version (None where it runs from its sources unpackaged)."""
    try:
        return importlib.metadata.version("mmbatch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _marker(key: str) -> Path:
    return cache_root() / FOLDER / key

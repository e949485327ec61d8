from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from repo_paths import SAMPLES
from s3_server import Bucket, S3Server

# The manual tier (tests/manual) runs checks of the default tier's modules at full size and
# imports them by name, as pytest imports a test module (its folder on ``sys.path``),
# whichever folders a run collects. The one-off measurements (``benchmarks/``, run as
# ``python benchmarks/NAME.py``) are imported by name the same way.
for _folder in ("bench", "integrations", "media", "tiny_models", "../benchmarks"):
    _path = str((Path(__file__).parent / _folder).resolve())
    if _path not in sys.path:
        sys.path.append(_path)


@pytest.fixture(scope="session")
def samples() -> Path:
    return SAMPLES


# vLLM's CPU build: run the engine in-process (same tokens, ~7x faster start, half the RAM)
# and keep its KV cache small. Set before anything imports vllm.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# A test run started in the background of a script (`bash .ci/run &`, nohup) inherits
# Ctrl-C ignored, and so would every job the tests start: the tests that press Ctrl-C on a
# job would see it run to its end. Take it back, as an interactive shell's foreground has it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# The model-content digests the tests compute are cached in a folder of their own, not in
# the user's ~/.cache/mmbatch.
os.environ.setdefault("MMBATCH_CACHE_DIR", tempfile.mkdtemp(prefix="mmbatch-test-cache-"))

ENGINES_IN_PROCESS = frozenset(
    {
        "tests/cli/test_ray_connection.py",
        "tests/engine/test_engine_settings.py",
        "tests/engine/test_media_cache_mirror.py",
        "tests/engine/test_replicas.py",
        "tests/engine/test_same_as_vllm.py",
        "tests/integrations/test_dataset_runs.py",
        "tests/integrations/test_hf_datasets.py",
        "tests/integrations/test_ray_data.py",
        "tests/integrations/test_ray_restarts.py",
        "tests/media/test_hostile_corpus.py",
        "tests/media/test_media_end_to_end.py",
        "tests/recipe/test_fit.py",
        "tests/recipe/test_recipes_e2e.py",
        "tests/sources/test_dataset_jobs.py",
        "tests/storage/test_storage_ray.py",
        "tests/test_end_to_end.py",
        "tests/test_sampling.py",
        "tests/tiny_models/test_tiny_models.py",
    }
)
"""The modules whose tests hold vLLM engines in the test process: the session's, the
registry's (a command run in-process finds the engine kept with its settings), or vLLM's own
``LLM``. Run in parallel (pytest-xdist, ``-n``), they go to one worker, in order, as they run
in one process without it (``pytest_xdist_make_scheduler``): the registry shares an engine
only within a process, and engines in one process share vLLM's global state (an in-process
engine that closes takes it along). Every other test (fake engines, engine and job
processes, storage) goes to whichever worker is free. A new module that holds an engine in
the test process belongs here, as does one whose test must find no Ray cluster running on
the machine (the Ray modules' clusters run in this scope)."""

ENGINE_SERVERS = frozenset({"tests/engine/test_kept_engine.py"})
"""The modules whose tests share one engine server (a process of its own, a module fixture):
each module's tests go to one worker together, beside any other, so that the server starts
once."""


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's scheduling by scope, with ``ENGINES_IN_PROCESS`` one scope and every
    other test a scope of its own. (``--dist loadgroup`` would say the same with markers, but
    the group it writes into a test's id is lost under pytest 9.2.)"""
    from xdist.scheduler import LoadScopeScheduling

    class EnginesOnOneWorker(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module in ENGINES_IN_PROCESS:
                return "engines-in-process"
            return module if module in ENGINE_SERVERS else nodeid

    return EnginesOnOneWorker(config, log)


TINY_ENGINE_KWARGS = {
    "dtype": "float32",
    "max_model_len": 1024,
    "enforce_eager": True,
    # Small KV blocks, so that the short prompts of these tests span whole blocks and the
    # prefix cache has something to hit (CPU's default block is larger than the prompts).
    "block_size": 32,
}
TINY_ENGINE_FLAGS = [f"--engine-arg={k}={json.dumps(v)}" for k, v in TINY_ENGINE_KWARGS.items()]
"""``TINY_ENGINE_KWARGS`` as a command's ``--engine-arg`` flags: a command run in this process
with them finds the session's engine in the registry."""


@pytest.fixture(scope="session")
def tiny_vl_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mmbatch.tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2-vl"), family="qwen2_vl", seed=0)


@pytest.fixture(scope="session")
def vl_engine(tiny_vl_model: Path):  # type: ignore[no-untyped-def]
    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.registry import shared_engine

    # Through the per-process registry, so that a DatasetMap with these settings reuses it.
    return shared_engine(EngineConfig(str(tiny_vl_model), TINY_ENGINE_KWARGS), {"image": 1})


@pytest.fixture(scope="session")
def uncached_vl_engine(tiny_vl_model: Path):  # type: ignore[no-untyped-def]
    """The same model with the prefix cache and the multimodal processor cache off: the
    reference that cached, reordered runs must agree with."""
    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.vllm import VLLMEngine

    kwargs = {**TINY_ENGINE_KWARGS, "enable_prefix_caching": False, "mm_processor_cache_gb": 0}
    return VLLMEngine(EngineConfig(str(tiny_vl_model), kwargs), {"image": 1})


@pytest.fixture(scope="session")
def tiny_audio_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mmbatch.tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2-audio"), family="qwen2_audio")


@pytest.fixture
def environ_kept() -> Iterator[None]:
    """``os.environ`` as it was, put back after the test. datasets' ``map(num_proc=...)``
    ends by putting back a copy of ``os.environ`` taken as it started (``os.environ =
    prev_env``), so ``monkeypatch``'s undo writes into the object it replaced: without this,
    every later test lost the ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` taken away here, and each
    engine after it ran vLLM's engine core in a process of its own (slower to start, and the
    shared memory it makes outlived Ray's actors then)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """The tests' S3 API server (moto's server mode over HTTP), started once."""
    server = S3Server()
    yield server
    server.close()


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    """A bucket of this test's own, and the standard AWS environment pointing at the server
    (put back after the test)."""
    import uuid

    for key, value in s3_server.environment().items():
        monkeypatch.setenv(key, value)
    return Bucket(s3_server, f"test-{uuid.uuid4().hex[:12]}")

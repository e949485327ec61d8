from __future__ import annotations

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
# whichever folders a run collects.
for _folder in ("bench", "integrations", "media", "testing"):
    if str(Path(__file__).parent / _folder) not in sys.path:
        sys.path.append(str(Path(__file__).parent / _folder))


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

TINY_ENGINE_KWARGS = {
    "dtype": "float32",
    "max_model_len": 1024,
    "enforce_eager": True,
    # Small KV blocks, so that the short prompts of these tests span whole blocks and the
    # prefix cache has something to hit (CPU's default block is larger than the prompts).
    "block_size": 32,
}


@pytest.fixture(scope="session")
def tiny_vl_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mmbatch.testing.tiny_models import build_tiny_model

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
    from mmbatch.testing.tiny_models import build_tiny_model

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

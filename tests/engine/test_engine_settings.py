"""The settings vLLM is started with are built in one place (``engine_settings``), and the
pre-flight check reads the same ones (``engine_args``): what is checked is what is started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_ENGINE_KWARGS

from mmbatch.engine.config import EngineConfig
from mmbatch.engine.vllm_arguments import LLM_ONLY_ARGUMENTS
from mmbatch.engine.vllm_settings import engine_args, engine_settings

MEDIA = {"image": 1}


def checked(config: EngineConfig) -> dict[str, Any]:
    """Each setting the engine starts with, as the pre-flight check's ``EngineArgs`` hold it."""
    args = engine_args(config, MEDIA)
    started = engine_settings(config, MEDIA).llm_kwargs
    return {k: getattr(args, k) for k in started if k not in LLM_ONLY_ARGUMENTS}


@pytest.mark.parametrize(
    ("settings", "render_threads", "cache_gb", "threads"),
    [
        ({}, 0, None, 0),
        ({}, 3, 0, 3),  # several renderers: vLLM's processor cache, not thread-safe, is off
        ({"mm_processor_cache_gb": 2}, 3, 2, 1),  # the user's cache: one renderer
        ({"limit_mm_per_prompt": {"image": 2}}, 1, None, 1),
    ],
)
def test_the_check_reads_what_the_engine_is_started_with(
    settings: dict[str, Any], render_threads: int, cache_gb: int | None, threads: int
) -> None:
    config = EngineConfig("m", {**TINY_ENGINE_KWARGS, **settings}, render_threads=render_threads)
    started = engine_settings(config, MEDIA)
    assert started.render_threads == threads
    assert started.llm_kwargs.get("mm_processor_cache_gb") == cache_gb
    limits = settings.get("limit_mm_per_prompt", {"image": 1, "video": 0, "audio": 0})
    assert started.llm_kwargs["limit_mm_per_prompt"] == limits
    assert checked(config) == {
        k: v for k, v in started.llm_kwargs.items() if k not in LLM_ONLY_ARGUMENTS
    }


@pytest.mark.slow
def test_the_engine_started_is_the_engine_checked(tiny_vl_model: Path) -> None:
    """vLLM's whole configuration, read by the pre-flight check and by the engine it starts,
    agrees on what the settings decide: the media limits and the processor cache that several
    render threads turn off, the context and the KV cache."""
    from mmbatch.engine.builder import read_host, start_engine

    config = EngineConfig(str(tiny_vl_model), TINY_ENGINE_KWARGS, render_threads=3)
    expected = engine_args(config, MEDIA).create_engine_config()
    host = read_host(config, in_process=True)
    engine = start_engine(host, MEDIA, host.layout())
    try:
        started = engine.llm.llm_engine.vllm_config
        assert started.model_config.multimodal_config == expected.model_config.multimodal_config
        assert started.model_config.multimodal_config.mm_processor_cache_gb == 0
        assert started.model_config.max_model_len == expected.model_config.max_model_len
        assert started.cache_config.block_size == expected.cache_config.block_size
        assert started.cache_config.kv_cache_memory_bytes == (
            expected.cache_config.kv_cache_memory_bytes
        )
        assert engine.render_threads == 3
    finally:
        engine.close()

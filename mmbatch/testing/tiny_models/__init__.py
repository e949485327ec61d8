"""Model directories made offline, for tests and benchmarks.

* :func:`build_tiny_model` writes a tiny random-weight Qwen2-VL, Qwen2.5-VL or Qwen2-Audio
  checkpoint (about 800k parameters, a few seconds on a CPU) that vLLM's offline engine loads
  and runs on a CPU: config, ``model.safetensors``, a trained byte-level BPE tokenizer of
  exactly 1024 ids with Qwen's special tokens at fixed low ids, processor configs and the chat
  template. The same seed gives the same bytes in every file.
* :func:`write_real_shape` writes a config-only directory at the real dimensions of a public
  7B checkpoint, for GPU benchmarks with ``load_format="dummy"``.

Nothing heavy is imported until one of them is called. The tiny models' special token ids::

    <|endoftext|> 0   <|im_start|> 1   <|im_end|> 2   <|vision_start|> 3   <|vision_end|> 4
    <|vision_pad|> 5  <|image_pad|> 6  <|video_pad|> 7  <|audio_bos|> 8  <|audio_eos|> 9
    <|AUDIO|> 10

Loading one in vLLM on a CPU::

    LLM(model=path, dtype="float32", max_model_len=1024, enforce_eager=True,
        limit_mm_per_prompt={"image": 1})   # with VLLM_CPU_KVCACHE_SPACE=1
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mmbatch.errors import ConfigError
from mmbatch.testing.tiny_models.real_shapes import REAL_SHAPES
from mmbatch.testing.tiny_models.tokenizer import QWEN_SPECIAL_TOKENS, TINY_SPECIAL_TOKENS

if TYPE_CHECKING:
    from pathlib import Path

FAMILIES: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl", "qwen2_audio")


def build_tiny_model(out_dir: str | Path, family: str = "qwen2_vl", seed: int = 0) -> Path:
    """Write a tiny random-weight checkpoint of ``family`` into ``out_dir`` and return its path.

    ``family`` is one of :data:`FAMILIES`; anything else raises :class:`ConfigError` before
    anything is written. ``out_dir`` is created if needed; files already there are overwritten.
    The same ``seed`` gives byte-identical files.
    """
    if family not in FAMILIES:
        raise ConfigError(f"unknown tiny model family {family!r}; known: {', '.join(FAMILIES)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative int, got {seed!r}")
    if family == "qwen2_audio":
        from mmbatch.testing.tiny_models.qwen_audio import build_tiny_audio

        return build_tiny_audio(out_dir, seed)
    from mmbatch.testing.tiny_models.qwen_vl import build_tiny_vl

    return build_tiny_vl(out_dir, family, seed)


def write_real_shape(out_dir: str | Path, name: str) -> Path:
    """Write the config-only directory of the real-shape ``name`` (one of :data:`REAL_SHAPES`).

    Unknown names raise :class:`ConfigError` before anything is written.
    """
    from mmbatch.testing.tiny_models.real_shapes import write_real_shape as _write

    return _write(out_dir, name)


__all__ = [
    "FAMILIES",
    "QWEN_SPECIAL_TOKENS",
    "REAL_SHAPES",
    "TINY_SPECIAL_TOKENS",
    "build_tiny_model",
    "write_real_shape",
]

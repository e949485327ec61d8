"""Model directories made offline, for tests and benchmarks.

* :func:`build_tiny_model` writes a tiny random-weight checkpoint of one of :data:`FAMILIES`
  (about a million parameters, a few seconds on a CPU) that vLLM's offline engine loads and
  runs on a CPU: config, ``model.safetensors``, a trained byte-level BPE tokenizer of exactly
  1024 ids with the family's special tokens at fixed low ids, processor configs and a chat
  template in the family's style. The same seed gives the same bytes in every file.
  :data:`FAMILY_MEDIA` says which media each family takes.
* :func:`write_real_shape` writes a config-only directory at the real dimensions of a public
  checkpoint, for GPU benchmarks with ``load_format="dummy"``.

Nothing heavy is imported until one of them is called. The Qwen families' special token ids::

    <|endoftext|> 0   <|im_start|> 1   <|im_end|> 2   <|vision_start|> 3   <|vision_end|> 4
    <|vision_pad|> 5  <|image_pad|> 6  <|video_pad|> 7  <|audio_bos|> 8  <|audio_eos|> 9
    <|AUDIO|> 10

Loading one in vLLM on a CPU::

    LLM(model=path, dtype="float32", max_model_len=1024, enforce_eager=True,
        limit_mm_per_prompt={"image": 1})   # with VLLM_CPU_KVCACHE_SPACE=1
"""

from __future__ import annotations

from pathlib import Path

from mmbatch.errors import ConfigError
from mmbatch.tiny_models.real_shapes import REAL_SHAPES
from mmbatch.tiny_models.tokenizer import QWEN_SPECIAL_TOKENS, TINY_SPECIAL_TOKENS

# family -> (module, builder function): each builder module imports torch and transformers.
_BUILDERS: dict[str, tuple[str, str]] = {
    "qwen2_vl": ("qwen_vl", "build_tiny_vl"),
    "qwen2_5_vl": ("qwen_vl", "build_tiny_vl"),
    "qwen2_audio": ("qwen_audio", "build_tiny_audio"),
    "qwen3_vl": ("qwen3_vl", "build_tiny_qwen3_vl"),
    "llava_onevision": ("llava_onevision", "build_tiny_llava_onevision"),
    "internvl": ("internvl", "build_tiny_internvl"),
    "gemma3": ("gemma3", "build_tiny_gemma3"),
    "idefics3": ("idefics3", "build_tiny_idefics3"),
    "mistral3": ("mistral3", "build_tiny_mistral3"),
    "audioflamingo3": ("audioflamingo3", "build_tiny_audioflamingo3"),
}

FAMILIES: tuple[str, ...] = tuple(_BUILDERS)

FAMILY_MEDIA: dict[str, tuple[str, ...]] = {
    "qwen2_vl": ("image", "video"),
    "qwen2_5_vl": ("image", "video"),
    "qwen2_audio": ("audio",),
    "qwen3_vl": ("image", "video"),
    "llava_onevision": ("image", "video"),
    "internvl": ("image", "video"),
    "gemma3": ("image",),
    "idefics3": ("image",),
    "mistral3": ("image",),
    "audioflamingo3": ("audio",),
}
"""The media each family's model takes (its processor's image, video and audio parts)."""


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
    import importlib

    module, function = _BUILDERS[family]
    build = getattr(importlib.import_module(f"mmbatch.tiny_models.{module}"), function)
    if module == "qwen_vl":  # one builder for both Qwen2-VL generations
        return Path(build(out_dir, family, seed))
    return Path(build(out_dir, seed))


def write_real_shape(out_dir: str | Path, name: str) -> Path:
    """Write the config-only directory of the real-shape ``name`` (one of :data:`REAL_SHAPES`).

    Unknown names raise :class:`ConfigError` before anything is written.
    """
    from mmbatch.tiny_models.real_shapes import write_real_shape as _write

    return _write(out_dir, name)


__all__ = [
    "FAMILIES",
    "FAMILY_MEDIA",
    "QWEN_SPECIAL_TOKENS",
    "REAL_SHAPES",
    "TINY_SPECIAL_TOKENS",
    "build_tiny_model",
    "write_real_shape",
]

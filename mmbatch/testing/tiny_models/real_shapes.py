"""Config-only model directories at the real dimensions of public checkpoints.

For GPU benchmarks with ``load_format="dummy"``: vLLM builds the full-size model from
``config.json`` and fills it with random weights, so no weights are written here. What is
written is everything else a run reads, offline:

* ``config.json``: the public checkpoint's config, in its original (hub) layout, with
  ``rope_scaling`` ``{"type": "mrope", ...}`` that transformers 5 turns into ``rope_parameters``;
* ``generation_config.json``: the public defaults (repetition penalty 1.05 included);
* ``preprocessor_config.json``: the public image processor defaults
  (``min_pixels`` 56*56, ``max_pixels`` 16384*28*28);
* a tokenizer with exactly ``vocab_size`` ids whose special tokens sit at Qwen's real ids
  (151643 ``<|endoftext|>`` ... 151656 ``<|video_pad|>``). Its ordinary tokens come from a
  tiny byte-level BPE, so text is split into more tokens than Qwen's real tokenizer would;
  image, video and audio placeholders count exactly as in the real model;
* the chat template (``chat_template.jinja``).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from mmbatch.errors import ConfigError
from mmbatch.testing.tiny_models._common import prepare_dir, write_json
from mmbatch.testing.tiny_models.chat_templates import QWEN_CHAT_TEMPLATE
from mmbatch.testing.tiny_models.tokenizer import (
    QWEN_SPECIAL_TOKENS,
    build_tokenizer,
    wrap_tokenizer,
)

if TYPE_CHECKING:
    from pathlib import Path

_QWEN_TOKEN_IDS = {
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
}

# The Qwen2-VL-7B / Qwen2.5-VL-7B language model (Qwen2-7B).
_QWEN2_7B_TEXT: dict[str, Any] = {
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_window_layers": 28,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    # As in the public config. It also keeps transformers 5 from taking a versionless local
    # config for a Mistral one and warning about the tokenizer's regex.
    "transformers_version": "4.41.2",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
}

_CONFIGS: dict[str, dict[str, Any]] = {
    # Qwen/Qwen2.5-VL-7B-Instruct
    "qwen2_5_vl_7b": {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        **_QWEN_TOKEN_IDS,
        **_QWEN2_7B_TEXT,
        "max_position_embeddings": 128000,
        "vision_config": {
            "depth": 32,
            "hidden_act": "silu",
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "in_chans": 3,
            "out_hidden_size": 3584,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "spatial_patch_size": 14,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2,
            "temporal_patch_size": 2,
        },
    },
    # Qwen/Qwen2-VL-7B-Instruct
    "qwen2_vl_7b": {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        **_QWEN_TOKEN_IDS,
        **_QWEN2_7B_TEXT,
        "max_position_embeddings": 32768,
        "vision_config": {
            "depth": 32,
            "embed_dim": 1280,
            "mlp_ratio": 4,
            "num_heads": 16,
            "in_chans": 3,
            "hidden_size": 3584,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "spatial_patch_size": 14,
            "temporal_patch_size": 2,
        },
    },
}

_PROCESSOR_CLASS = {"qwen2_5_vl_7b": "Qwen2_5_VLProcessor", "qwen2_vl_7b": "Qwen2VLProcessor"}
_MODEL_MAX_LENGTH = {"qwen2_5_vl_7b": 131072, "qwen2_vl_7b": 32768}

REAL_SHAPES: tuple[str, ...] = tuple(_CONFIGS)

# The public preprocessor_config.json of both models (processor_class added per model).
_PREPROCESSOR: dict[str, Any] = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor",
}

_GENERATION: dict[str, Any] = {
    "bos_token_id": 151643,
    "pad_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "repetition_penalty": 1.05,
    "temperature": 0.1,
    "top_p": 0.001,
    "top_k": 1,
}


def real_shape_config(name: str) -> dict[str, Any]:
    """The ``config.json`` content of the real-shape ``name`` (a fresh copy)."""
    if name not in _CONFIGS:
        raise ConfigError(f"unknown real shape {name!r}; known: {', '.join(REAL_SHAPES)}")
    return copy.deepcopy(_CONFIGS[name])


def write_real_shape(out_dir: str | Path, name: str) -> Path:
    """Write the config-only directory of ``name`` (see the module docstring) to ``out_dir``."""
    config = real_shape_config(name)  # validates the name before anything is written
    path = prepare_dir(out_dir)
    write_json(path / "config.json", config)
    write_json(path / "generation_config.json", _GENERATION)
    write_json(
        path / "preprocessor_config.json",
        {**_PREPROCESSOR, "processor_class": _PROCESSOR_CLASS[name]},
    )

    tokenizer = wrap_tokenizer(
        build_tokenizer(config["vocab_size"], QWEN_SPECIAL_TOKENS),
        chat_template=QWEN_CHAT_TEMPLATE,
        model_max_length=_MODEL_MAX_LENGTH[name],
    )
    tokenizer.init_kwargs["processor_class"] = _PROCESSOR_CLASS[name]
    tokenizer.save_pretrained(str(path))
    return path

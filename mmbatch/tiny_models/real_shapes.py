"""Config-only model directories at the real dimensions of public checkpoints.

For GPU benchmarks with ``load_format="dummy"``: vLLM builds the full-size model from
``config.json`` and fills it with random weights, so no weights are written here. What is
written is everything else a run reads, offline:

* ``config.json``: the public checkpoint's config, in its original (hub) layout (Qwen's
  ``rope_scaling`` ``{"type": "mrope", ...}`` and Gemma 3's ``rope_scaling`` and
  ``rope_local_base_freq``, which transformers 5 turns into ``rope_parameters``), with every
  dimension spelled out rather than left to a library default;
* ``generation_config.json``: the public defaults (Qwen's repetition penalty 1.05, Gemma's
  top-k 64 and top-p 0.95 included);
* the image processor's config with the public defaults (Qwen: ``min_pixels`` 56*56,
  ``max_pixels`` 16384*28*28; Gemma 3: 896x896, 256 tokens a picture, no pan-and-scan);
* a tokenizer with exactly ``vocab_size`` ids whose special tokens sit at the real ids
  (Qwen's 151643 ``<|endoftext|>`` ... 151656 ``<|video_pad|>``; Gemma's ``<bos>`` 2,
  ``<start_of_image>`` 255999, ``<image_soft_token>`` 262144). Its ordinary tokens come from
  a tiny byte-level BPE, so text is split into more tokens than the real tokenizer would;
  image, video and audio placeholders count exactly as in the real model;
* the chat template (``chat_template.jinja``), in the family's style.

Shapes: ``qwen2_5_vl_7b`` and ``qwen2_vl_7b`` (8.29B parameters), ``gemma3_4b``
(``google/gemma-3-4b-it``, 4.3B).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mmbatch.errors import ConfigError
from mmbatch.tiny_models._common import prepare_dir, write_json
from mmbatch.tiny_models.chat_templates import GEMMA3_CHAT_TEMPLATE, QWEN_CHAT_TEMPLATE
from mmbatch.tiny_models.tokenizer import (
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

# google/gemma-3-4b-it: Gemma 3 text (34 layers, 5 sliding-window layers to each global
# one) and a SigLIP-so400m vision tower on 896x896 pictures, pooled to 256 tokens.
_GEMMA3_4B: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "image_token_index": 262144,
    "eos_token_id": [1, 106],
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "text_config": {
        "model_type": "gemma3_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 2560,
        "initializer_range": 0.02,
        "intermediate_size": 10240,
        "max_position_embeddings": 131072,
        "num_attention_heads": 8,
        "num_hidden_layers": 34,
        "num_key_value_heads": 4,
        "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "rope_theta": 1000000.0,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "vocab_size": 262208,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
    },
    "vision_config": {
        "model_type": "siglip_vision_model",
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
}
_CONFIGS["gemma3_4b"] = _GEMMA3_4B

REAL_SHAPES: tuple[str, ...] = tuple(_CONFIGS)

# The public preprocessor_config.json of both Qwen models (processor_class added per model).
_QWEN_PREPROCESSOR: dict[str, Any] = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor",
}

_QWEN_GENERATION: dict[str, Any] = {
    "bos_token_id": 151643,
    "pad_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "repetition_penalty": 1.05,
    "temperature": 0.1,
    "top_p": 0.001,
    "top_k": 1,
}

GEMMA_SPECIAL_TOKENS: dict[str, int] = {
    "<pad>": 0,
    "<eos>": 1,
    "<bos>": 2,
    "<unk>": 3,
    "<mask>": 4,
    "<start_of_turn>": 105,
    "<end_of_turn>": 106,
    "<start_of_image>": 255999,
    "<end_of_image>": 256000,
    "<image_soft_token>": 262144,
}
"""Gemma 3's special tokens at their real ids."""
GEMMA_NEWLINES: dict[str, int] = {"\n": 107, "\n\n": 108, "\n\n\n": 109, "\n\n\n\n": 110}


@dataclass(frozen=True)
class _Files:
    """Everything but ``config.json`` that one real-shape directory holds."""

    processor_class: str
    generation: dict[str, Any]
    preprocessor: dict[str, Any]
    special_tokens: dict[str, int]
    chat_template: str
    model_max_length: int
    processor: dict[str, Any] | None = None
    """``processor_config.json`` (the processor's own settings), if the model has one."""
    plain_tokens: dict[str, int] = field(default_factory=dict)
    named_tokens: dict[str, str] = field(default_factory=dict)
    eos: str = "<|im_end|>"
    pad: str = "<|endoftext|>"
    bos: str | None = None


def _qwen_files(processor_class: str, model_max_length: int) -> _Files:
    return _Files(
        processor_class=processor_class,
        generation=_QWEN_GENERATION,
        preprocessor={**_QWEN_PREPROCESSOR, "processor_class": processor_class},
        special_tokens=QWEN_SPECIAL_TOKENS,
        chat_template=QWEN_CHAT_TEMPLATE,
        model_max_length=model_max_length,
    )


_FILES: dict[str, _Files] = {
    "qwen2_5_vl_7b": _qwen_files("Qwen2_5_VLProcessor", 131072),
    "qwen2_vl_7b": _qwen_files("Qwen2VLProcessor", 32768),
    "gemma3_4b": _Files(
        processor_class="Gemma3Processor",
        generation={
            "bos_token_id": 2,
            "cache_implementation": "hybrid",
            "do_sample": True,
            "eos_token_id": [1, 106],
            "pad_token_id": 0,
            "top_k": 64,
            "top_p": 0.95,
        },
        preprocessor={
            "do_convert_rgb": None,
            "do_normalize": True,
            "do_pan_and_scan": None,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_processor_type": "Gemma3ImageProcessor",
            "image_seq_length": 256,
            "image_std": [0.5, 0.5, 0.5],
            "pan_and_scan_max_num_crops": None,
            "pan_and_scan_min_crop_size": None,
            "pan_and_scan_min_ratio_to_activate": None,
            "processor_class": "Gemma3Processor",
            "resample": 2,
            "rescale_factor": 0.00392156862745098,
            "size": {"height": 896, "width": 896},
        },
        processor={"image_seq_length": 256, "processor_class": "Gemma3Processor"},
        special_tokens=GEMMA_SPECIAL_TOKENS,
        plain_tokens=GEMMA_NEWLINES,
        named_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
        chat_template=GEMMA3_CHAT_TEMPLATE,
        model_max_length=131072,
        eos="<eos>",
        pad="<pad>",
        bos="<bos>",
    ),
}


def real_shape_config(name: str) -> dict[str, Any]:
    """The ``config.json`` content of the real-shape ``name`` (a fresh copy)."""
    if name not in _CONFIGS:
        raise ConfigError(f"unknown real shape {name!r}; known: {', '.join(REAL_SHAPES)}")
    return copy.deepcopy(_CONFIGS[name])


def write_real_shape(out_dir: str | Path, name: str) -> Path:
    """Write the config-only directory of ``name`` (see the module docstring) to ``out_dir``."""
    config = real_shape_config(name)  # validates the name before anything is written
    files = _FILES[name]
    path = prepare_dir(out_dir)
    write_json(path / "config.json", config)
    write_json(path / "generation_config.json", files.generation)
    write_json(path / "preprocessor_config.json", files.preprocessor)
    if files.processor is not None:
        write_json(path / "processor_config.json", files.processor)

    vocab_size = config.get("vocab_size") or config["text_config"]["vocab_size"]
    tokenizer = wrap_tokenizer(
        build_tokenizer(vocab_size, files.special_tokens, plain_tokens=files.plain_tokens),
        chat_template=files.chat_template,
        model_max_length=files.model_max_length,
        eos=files.eos,
        pad=files.pad,
        bos=files.bos,
        named=files.named_tokens,
    )
    tokenizer.init_kwargs["processor_class"] = files.processor_class
    tokenizer.save_pretrained(str(path))
    return path

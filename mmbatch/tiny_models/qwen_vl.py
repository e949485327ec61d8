"""Tiny random-weight Qwen2-VL and Qwen2.5-VL checkpoints that vLLM loads.

Text tower: 2 layers of hidden 128 (2 heads of 64, 1 kv head), M-RoPE sections [8, 12, 12].
Vision tower: 2 blocks, patch 14, spatial merge 2, temporal patch 2, merger output 128.
Images are resized to 28*28 .. 8*28*28 pixels, so one image is 1 to 8 tokens; a video is kept
as small. Weights are written in the original hub layout (``model.*``, ``visual.*``,
``lm_head.*``), which both vLLM and transformers read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mmbatch.tiny_models._common import (
    ROPE_THETA,
    TINY_MROPE_SECTION,
    TINY_TEXT,
    generation_config,
    prepare_dir,
    tiny_tokenizer,
    write_checkpoint,
    write_json,
)
from mmbatch.tiny_models.chat_templates import QWEN_CHAT_TEMPLATE
from mmbatch.tiny_models.tokenizer import (
    TINY_SPECIAL_TOKENS,
)

if TYPE_CHECKING:
    from pathlib import Path

PATCH_SIZE = 14
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
FACTOR = PATCH_SIZE * MERGE_SIZE  # 28: one merged token covers 28x28 pixels

IMAGE_MIN_PIXELS = FACTOR * FACTOR  # 1 token
IMAGE_MAX_PIXELS = 8 * FACTOR * FACTOR  # 8 tokens
VIDEO_MIN_PIXELS = FACTOR * FACTOR
VIDEO_MAX_PIXELS = 4 * FACTOR * FACTOR  # per frame pair
VIDEO_MAX_FRAMES = 8

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

_HUB_LAYOUT = {"model.visual.": "visual.", "model.language_model.": "model."}

# A (vision_config kwargs, config class, model class, processor class) per family.
_VISION = {
    "qwen2_vl": {
        "depth": 2,
        "embed_dim": 64,
        "hidden_size": TINY_TEXT["hidden_size"],
        "num_heads": 2,
        "mlp_ratio": 4,
        "hidden_act": "quick_gelu",
        "in_channels": 3,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
    },
    "qwen2_5_vl": {
        "depth": 2,
        "hidden_size": 64,
        "out_hidden_size": TINY_TEXT["hidden_size"],
        "intermediate_size": 128,
        "num_heads": 2,
        "hidden_act": "silu",
        "in_channels": 3,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "window_size": 112,  # 4x4 merged tokens per window
        "fullatt_block_indexes": [1],
        "tokens_per_second": 2,
    },
}


def _classes(family: str) -> tuple[Any, Any, Any]:
    if family == "qwen2_vl":
        from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor

        return Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
    )

    return Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor


def tiny_vl_config(family: str) -> Any:
    """The transformers config object of the tiny ``qwen2_vl`` / ``qwen2_5_vl`` model."""
    config_cls, model_cls, _ = _classes(family)
    special = TINY_SPECIAL_TOKENS
    text = dict(
        TINY_TEXT,
        max_window_layers=TINY_TEXT["num_hidden_layers"],
        rope_parameters={
            "rope_type": "default",
            "rope_theta": ROPE_THETA,
            "mrope_section": TINY_MROPE_SECTION,
        },
        bos_token_id=special["<|endoftext|>"],
        eos_token_id=special["<|im_end|>"],
        pad_token_id=special["<|endoftext|>"],
    )
    config = config_cls(
        text_config=text,
        vision_config=dict(_VISION[family]),
        image_token_id=special["<|image_pad|>"],
        video_token_id=special["<|video_pad|>"],
        vision_start_token_id=special["<|vision_start|>"],
        vision_end_token_id=special["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    config.architectures = [model_cls.__name__]
    return config


def build_tiny_vl(out_dir: str | Path, family: str, seed: int) -> Path:
    """Write the tiny ``family`` checkpoint (config, weights, tokenizer, processor)."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    path = prepare_dir(out_dir)
    config = tiny_vl_config(family)
    _, model_cls, processor_cls = _classes(family)

    write_checkpoint(path, config, model_cls, seed, _HUB_LAYOUT)
    write_json(path / "generation_config.json", generation_config(TINY_SPECIAL_TOKENS))

    tokenizer = tiny_tokenizer(TINY_SPECIAL_TOKENS, QWEN_CHAT_TEMPLATE)
    image_processor = Qwen2VLImageProcessor(
        **_image_processor_kwargs(IMAGE_MIN_PIXELS, IMAGE_MAX_PIXELS)
    )
    video_processor = Qwen2VLVideoProcessor(
        **_image_processor_kwargs(VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS),
        min_frames=2,
        max_frames=VIDEO_MAX_FRAMES,
        fps=2.0,
    )
    processor = processor_cls(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=QWEN_CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(path))
    return path


def _image_processor_kwargs(min_pixels: int, max_pixels: int) -> dict[str, Any]:
    return {
        "min_pixels": min_pixels,
        "max_pixels": max_pixels,
        "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels},
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "merge_size": MERGE_SIZE,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
    }

"""A tiny random-weight Qwen3-VL checkpoint (images and video) that vLLM loads.

Vision tower: 2 blocks of width 64, 16-pixel patches merged 2x2 (one token covers 32x32
pixels), temporal patch 2, a 4x4 learned position grid, DeepStack features from block 0.
Images are resized to 1 to 8 tokens, video frames to at most 4 tokens a frame pair; vLLM
writes each pair of frames after its time stamp (``<0.5 seconds>``). Text tower: the tiny
one as Qwen3 (head_dim 64, interleaved M-RoPE sections [8, 12, 12]), with the Qwen special
tokens and chat template of the other Qwen families. Weights in the hub layout
(``model.visual.*``, ``model.language_model.*``, ``lm_head.*``), as transformers names them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mmbatch.tiny_models._common import (
    HALF_NORM,
    TINY_MROPE_SECTION,
    TINY_TEXT,
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

PATCH_SIZE = 16
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
FACTOR = PATCH_SIZE * MERGE_SIZE  # 32: one merged token covers 32x32 pixels

IMAGE_MAX_PIXELS = 8 * FACTOR * FACTOR
VIDEO_MAX_PIXELS = 4 * FACTOR * FACTOR


def build_tiny_qwen3_vl(out_dir: str | Path, seed: int) -> Path:
    """Write the tiny ``qwen3_vl`` checkpoint (config, weights, tokenizer, processor)."""
    from transformers import Qwen3VLForConditionalGeneration

    path = prepare_dir(out_dir)
    write_checkpoint(path, _config(), Qwen3VLForConditionalGeneration, seed, {})
    write_json(path / "generation_config.json", {"bos_token_id": 0, "eos_token_id": [2, 0]})
    _processor().save_pretrained(str(path))
    return path


def _config() -> Any:
    """The model: the tiny text tower as Qwen3's (interleaved M-RoPE) and a 2-block vision
    tower with DeepStack features from block 0, with the Qwen special tokens."""
    from transformers import Qwen3VLConfig

    special = TINY_SPECIAL_TOKENS
    text = {key: value for key, value in TINY_TEXT.items() if key != "use_sliding_window"}
    text.update(
        head_dim=TINY_TEXT["hidden_size"] // TINY_TEXT["num_attention_heads"],
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 5_000_000.0,
            "mrope_section": TINY_MROPE_SECTION,
            "mrope_interleaved": True,
        },
        bos_token_id=special["<|endoftext|>"],
        eos_token_id=special["<|im_end|>"],
        pad_token_id=special["<|endoftext|>"],
    )
    config = Qwen3VLConfig(
        text_config=text,
        vision_config={
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": TEMPORAL_PATCH_SIZE,
            "out_hidden_size": TINY_TEXT["hidden_size"],
            "num_position_embeddings": 16,
            "deepstack_visual_indexes": [0],
        },
        image_token_id=special["<|image_pad|>"],
        video_token_id=special["<|video_pad|>"],
        vision_start_token_id=special["<|vision_start|>"],
        vision_end_token_id=special["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    return config


def _processor() -> Any:
    """The tokenizer, and the image and video processors: pictures resized to 1 to 8
    tokens, video frames to at most 4 tokens a frame pair."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    cells = {
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "merge_size": MERGE_SIZE,
        "image_mean": HALF_NORM,
        "image_std": HALF_NORM,
    }
    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": FACTOR * FACTOR, "longest_edge": IMAGE_MAX_PIXELS}, **cells
    )
    video_processor = Qwen3VLVideoProcessor(
        size={"shortest_edge": FACTOR * FACTOR, "longest_edge": VIDEO_MAX_PIXELS},
        min_frames=2,
        max_frames=16,
        fps=2.0,
        # Frames keep the video processor's own pixel bounds (transformers 5.22 will cap
        # them by clip length by default; set now, so the counts do not move then).
        cap_pixels_per_frame=False,
        **cells,
    )
    return Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tiny_tokenizer(TINY_SPECIAL_TOKENS, QWEN_CHAT_TEMPLATE),
        video_processor=video_processor,
        chat_template=QWEN_CHAT_TEMPLATE,
    )

"""A tiny random-weight Gemma 3 checkpoint (images) that vLLM loads.

Vision tower: SigLIP, 2 layers of width 64, one 56-pixel square of 14-pixel patches, average
pooled 2x2: 4 image tokens a picture, whatever its size (no pan-and-scan). vLLM writes each
picture as ``\\n\\n<start_of_image>`` + 4 soft tokens + ``<end_of_image>\\n\\n``. Text tower: Gemma
3 (one sliding-window and one global layer, head_dim 64), embeddings tied as in every Gemma.

The tokenizer holds ``"\\n"`` .. ``"\\n\\n\\n\\n"`` as whole ordinary tokens, as Gemma's
does: vLLM's Gemma 3 processor merges the newlines it adds around a picture through them.
Weights are written in the hub layout of ``google/gemma-3-*-it``:
``vision_tower.vision_model.*``, ``multi_modal_projector.*``, ``language_model.model.*``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mmbatch.tiny_models._common import (
    HALF_NORM,
    TINY_TEXT,
    prepare_dir,
    tiny_tokenizer,
    write_checkpoint,
    write_json,
)
from mmbatch.tiny_models.chat_templates import GEMMA3_CHAT_TEMPLATE
from mmbatch.tiny_models.llava_onevision import TINY_SIGLIP

if TYPE_CHECKING:
    from pathlib import Path

SPECIAL_TOKENS = {
    "<pad>": 0,
    "<eos>": 1,
    "<bos>": 2,
    "<start_of_turn>": 3,
    "<end_of_turn>": 4,
    "<start_of_image>": 5,
    "<end_of_image>": 6,
    "<image_soft_token>": 7,
}
NEWLINE_TOKENS = {"\n": 8, "\n\n": 9, "\n\n\n": 10, "\n\n\n\n": 11}
NAMED_TOKENS = {
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}
IMAGE_TOKENS = 4  # per picture: 4x4 patches pooled to 2x2

_HUB_LAYOUT = {
    "model.vision_tower.": "vision_tower.vision_model.",
    "model.multi_modal_projector.": "multi_modal_projector.",
    "model.language_model.": "language_model.model.",
}


def build_tiny_gemma3(out_dir: str | Path, seed: int) -> Path:
    """Write the tiny ``gemma3`` checkpoint (config, weights, tokenizer, processor)."""
    from transformers import Gemma3ForConditionalGeneration

    path = prepare_dir(out_dir)
    write_checkpoint(path, _config(), Gemma3ForConditionalGeneration, seed, _HUB_LAYOUT)
    write_json(
        path / "generation_config.json",
        {"bos_token_id": 2, "eos_token_id": [1, 4], "pad_token_id": 0},
    )
    _processor().save_pretrained(str(path))
    return path


def _config() -> Any:
    """The model: the tiny text tower as Gemma 3's (one sliding-window layer and one global,
    head_dim 64) and the tiny SigLIP, with Gemma's special tokens."""
    from transformers import Gemma3Config

    special = SPECIAL_TOKENS
    head_dim = TINY_TEXT["hidden_size"] // TINY_TEXT["num_attention_heads"]
    text = {
        key: TINY_TEXT[key]
        for key in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        )
    }
    text.update(
        head_dim=head_dim,
        query_pre_attn_scalar=head_dim,
        sliding_window=256,
        layer_types=["sliding_attention", "full_attention"],
        pad_token_id=special["<pad>"],
        eos_token_id=special["<eos>"],
        bos_token_id=special["<bos>"],
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=dict(TINY_SIGLIP),
        mm_tokens_per_image=IMAGE_TOKENS,
        boi_token_index=special["<start_of_image>"],
        eoi_token_index=special["<end_of_image>"],
        image_token_index=special["<image_soft_token>"],
    )
    config.architectures = ["Gemma3ForConditionalGeneration"]
    return config


def _processor() -> Any:
    """The tokenizer (newlines as whole tokens) and the image processor: one 56-pixel tile
    a picture, normalised to [-1, 1]."""
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    tokenizer = tiny_tokenizer(
        SPECIAL_TOKENS,
        GEMMA3_CHAT_TEMPLATE,
        plain_tokens=NEWLINE_TOKENS,
        eos="<eos>",
        pad="<pad>",
        bos="<bos>",
        named=NAMED_TOKENS,
    )
    tile = TINY_SIGLIP["image_size"]
    image_processor = Gemma3ImageProcessor(
        size={"height": tile, "width": tile}, image_mean=HALF_NORM, image_std=HALF_NORM
    )
    return Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=GEMMA3_CHAT_TEMPLATE,
        image_seq_length=IMAGE_TOKENS,
    )

"""A tiny random-weight Idefics3 (the architecture of SmolVLM) checkpoint that vLLM loads.

Vision tower: SigLIP-style, 2 layers of width 64, 56-pixel tiles of 14-pixel patches, pixel
shuffle 2: 4 tokens a tile. A picture is resized to at most 112 pixels on its longest side and
cut into up to 2x2 tiles, plus a global tile; vLLM writes each tile between
``<fake_token_around_image>`` markers with its ``<row_i_col_j>`` tag (``<global-img>`` for the
last). Text tower: the tiny one as a Llama. Weights are written as transformers names them
(``model.vision_model.*``, ``model.connector.*``, ``model.text_model.*``, ``lm_head.*``),
which is also the hub layout of ``HuggingFaceTB/SmolVLM-*``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mmbatch.tiny_models._common import (
    HALF_NORM,
    TINY_VISION,
    llama_text,
    prepare_dir,
    tiny_tokenizer,
    write_checkpoint,
    write_json,
)
from mmbatch.tiny_models.chat_templates import IDEFICS3_CHAT_TEMPLATE

if TYPE_CHECKING:
    from pathlib import Path

SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": 0,
    "<|im_start|>": 1,
    "<end_of_utterance>": 2,
    "<fake_token_around_image>": 3,
    "<image>": 4,
    "<global-img>": 5,
    # The processor looks up a tag for each tile position of a 6x6 grid.
    **{f"<row_{i}_col_{j}>": 5 + 6 * (i - 1) + j for i in range(1, 7) for j in range(1, 7)},
}

TILE = 56
TOKENS_PER_TILE = 4  # (56 / 14) ** 2 patches, pixel-shuffled by 2 a side
LONGEST_EDGE = 2 * TILE


def build_tiny_idefics3(out_dir: str | Path, seed: int) -> Path:
    """Write the tiny ``idefics3`` checkpoint (config, weights, tokenizer, processor)."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
    )

    path = prepare_dir(out_dir)
    special = SPECIAL_TOKENS
    config = Idefics3Config(
        text_config=llama_text(
            model_type="llama",
            rope_parameters={"rope_type": "default", "rope_theta": 100_000.0},
            bos_token_id=special["<|im_start|>"],
            eos_token_id=special["<end_of_utterance>"],
            pad_token_id=special["<|endoftext|>"],
        ),
        vision_config={
            **TINY_VISION,
            "image_size": TILE,
            "patch_size": 14,
        },
        scale_factor=2,
        image_token_id=special["<image>"],
        pad_token_id=special["<|endoftext|>"],
        tie_word_embeddings=False,
    )
    config.architectures = ["Idefics3ForConditionalGeneration"]
    write_checkpoint(path, config, Idefics3ForConditionalGeneration, seed, {})
    write_json(path / "generation_config.json", {"bos_token_id": 1, "eos_token_id": [2, 0]})

    tokenizer = tiny_tokenizer(
        special,
        IDEFICS3_CHAT_TEMPLATE,
        eos="<end_of_utterance>",
        bos="<|im_start|>",
    )
    image_processor = Idefics3ImageProcessor(
        size={"longest_edge": LONGEST_EDGE},
        max_image_size={"longest_edge": TILE},
        do_image_splitting=True,
        image_mean=HALF_NORM,
        image_std=HALF_NORM,
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=TOKENS_PER_TILE,
        chat_template=IDEFICS3_CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(path))
    return path

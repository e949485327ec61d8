"""A tiny random-weight Audio Flamingo 3 checkpoint (audio) that vLLM loads.

Audio encoder: Whisper-style, 128 mel bins, width 64, 2 layers, 1500 positions (30 s) with
Whisper's fixed sinusoids, then pooled: 25 ``<sound>`` tokens a second of 16 kHz audio. The
processor takes clips of up to 30 s (the real model's 600 s would make vLLM profile a prompt
of 15000 tokens). Text tower: the tiny Qwen2. Weights in the hub layout of
``nvidia/audio-flamingo-3-hf``: ``audio_tower.*``, ``multi_modal_projector.*``,
``language_model.model.*``, ``language_model.lm_head.*``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mmbatch.tiny_models._common import (
    WHISPER_POSITIONS,
    prepare_dir,
    qwen2_text,
    tiny_tokenizer,
    whisper_features,
    whisper_positions,
    write_checkpoint,
    write_json,
)
from mmbatch.tiny_models.chat_templates import chatml_template

if TYPE_CHECKING:
    from pathlib import Path

SPECIAL_TOKENS = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<sound>": 3}
CHAT_TEMPLATE = chatml_template(audio="<sound>")

SAMPLING_RATE = 16_000
MEL_BINS = 128
MAX_SOURCE_POSITIONS = 1500
WIDTH = 64

_HUB_LAYOUT = {
    "model.audio_tower.": "audio_tower.",
    "model.multi_modal_projector.": "multi_modal_projector.",
    "model.language_model.": "language_model.model.",
    "lm_head.": "language_model.lm_head.",
}


def build_tiny_audioflamingo3(out_dir: str | Path, seed: int) -> Path:
    """Write the tiny ``audioflamingo3`` checkpoint (config, weights, tokenizer, processor)."""
    from transformers import (
        AudioFlamingo3Config,
        AudioFlamingo3ForConditionalGeneration,
        AudioFlamingo3Processor,
    )

    path = prepare_dir(out_dir)
    special = SPECIAL_TOKENS
    config = AudioFlamingo3Config(
        text_config=qwen2_text(special["<|endoftext|>"], special["<|im_end|>"], 0),
        audio_config={
            "hidden_size": WIDTH,
            "intermediate_size": 2 * WIDTH,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_mel_bins": MEL_BINS,
            "max_source_positions": MAX_SOURCE_POSITIONS,
        },
        audio_token_id=special["<sound>"],
    )
    config.architectures = ["AudioFlamingo3ForConditionalGeneration"]

    write_checkpoint(
        path,
        config,
        AudioFlamingo3ForConditionalGeneration,
        seed,
        _HUB_LAYOUT,
        keep=lambda name: name == WHISPER_POSITIONS,
        fill=whisper_positions,
    )
    write_json(path / "generation_config.json", {"bos_token_id": 0, "eos_token_id": [2, 0]})

    tokenizer = tiny_tokenizer(special, CHAT_TEMPLATE)
    feature_extractor = whisper_features(MEL_BINS, SAMPLING_RATE)
    processor = AudioFlamingo3Processor(
        feature_extractor=feature_extractor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        max_audio_len=30,
    )
    processor.save_pretrained(str(path))
    return path

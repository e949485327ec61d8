"""A tiny random-weight Qwen2-Audio checkpoint that vLLM loads.

Audio encoder: Whisper-style, 128 mel bins, d_model 64, 2 layers, 2 heads, 1500 positions (30 s).
Text tower: the same tiny Qwen2 (hidden 128, 2 layers) as the VL models, with plain RoPE.
Audio goes through ``WhisperFeatureExtractor`` at 16 kHz; one second becomes 25 audio tokens.

transformers 5.19 names the weights ``model.audio_tower.*``, ``model.language_model.*`` and
``lm_head.*`` (and its own ``save_pretrained`` writes ``language_model.model.model.*``, which
vLLM 0.32 does not load); they are saved here in the original hub layout instead:
``audio_tower.*``, ``multi_modal_projector.*``, ``language_model.model.*`` and
``language_model.lm_head.*``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from mmbatch.tiny_models._common import (
    WHISPER_POSITIONS,
    generation_config,
    prepare_dir,
    qwen2_text,
    tiny_tokenizer,
    whisper_features,
    whisper_positions,
    write_checkpoint,
    write_json,
)
from mmbatch.tiny_models.chat_templates import QWEN_CHAT_TEMPLATE
from mmbatch.tiny_models.tokenizer import (
    TINY_SPECIAL_TOKENS,
)

if TYPE_CHECKING:
    from pathlib import Path

SAMPLING_RATE = 16_000
NUM_MEL_BINS = 128
MAX_SOURCE_POSITIONS = 1500  # 30 s of 10 ms frames after the stride-2 conv

TINY_AUDIO: dict[str, Any] = {
    "model_type": "qwen2_audio_encoder",
    "d_model": 64,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 128,
    "num_mel_bins": NUM_MEL_BINS,
    "max_source_positions": MAX_SOURCE_POSITIONS,
    "activation_function": "gelu",
    "scale_embedding": False,
}

_HUB_LAYOUT = {
    "model.audio_tower.": "audio_tower.",
    "model.multi_modal_projector.": "multi_modal_projector.",
    "model.language_model.": "language_model.model.",
    "lm_head.": "language_model.lm_head.",
}


def tiny_audio_config() -> Any:
    """The transformers config object of the tiny ``qwen2_audio`` model."""
    from transformers import Qwen2AudioConfig

    special = TINY_SPECIAL_TOKENS
    config = Qwen2AudioConfig(
        text_config=qwen2_text(
            special["<|endoftext|>"], special["<|im_end|>"], special["<|endoftext|>"]
        ),
        audio_config=dict(TINY_AUDIO),
        audio_token_index=special["<|AUDIO|>"],
    )
    config.architectures = ["Qwen2AudioForConditionalGeneration"]
    return config


def build_tiny_audio(out_dir: str | Path, seed: int) -> Path:
    """Write the tiny ``qwen2_audio`` checkpoint (config, weights, tokenizer, processor)."""
    from transformers import (
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
    )

    path = prepare_dir(out_dir)
    config = tiny_audio_config()

    write_checkpoint(
        path,
        config,
        Qwen2AudioForConditionalGeneration,
        seed,
        _HUB_LAYOUT,
        keep=lambda name: name == WHISPER_POSITIONS,
        fill=whisper_positions,
    )
    write_json(path / "generation_config.json", generation_config(TINY_SPECIAL_TOKENS))

    tokenizer = tiny_tokenizer(TINY_SPECIAL_TOKENS, QWEN_CHAT_TEMPLATE)
    feature_extractor = whisper_features(NUM_MEL_BINS, SAMPLING_RATE)
    processor = Qwen2AudioProcessor(
        feature_extractor=feature_extractor,
        tokenizer=tokenizer,
        chat_template=QWEN_CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(path))
    return path


def audio_token_count(num_samples: int, sampling_rate: int = SAMPLING_RATE) -> int:
    """How many ``<|AUDIO|>`` tokens a clip of ``num_samples`` becomes (1 s -> 25)."""
    frames = math.ceil(num_samples * SAMPLING_RATE / sampling_rate / 160)
    frames = min(frames, 2 * MAX_SOURCE_POSITIONS)
    return (((frames - 1) // 2 + 1) - 2) // 2 + 1

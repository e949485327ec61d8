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

from mmbatch.testing.tiny_models._common import (
    ROPE_THETA,
    TINY_TEXT,
    clean_config_dict,
    generation_config,
    init_weights,
    prepare_dir,
    rename_prefixes,
    save_weights,
    sinusoids,
    whisper_features,
    write_json,
)
from mmbatch.testing.tiny_models.chat_templates import QWEN_CHAT_TEMPLATE
from mmbatch.testing.tiny_models.tokenizer import (
    TINY_SPECIAL_TOKENS,
    build_tokenizer,
    wrap_tokenizer,
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
    text = dict(
        TINY_TEXT,
        model_type="qwen2",
        max_window_layers=TINY_TEXT["num_hidden_layers"],
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        bos_token_id=special["<|endoftext|>"],
        eos_token_id=special["<|im_end|>"],
        pad_token_id=special["<|endoftext|>"],
    )
    config = Qwen2AudioConfig(
        text_config=text,
        audio_config=dict(TINY_AUDIO),
        audio_token_index=special["<|AUDIO|>"],
    )
    config.architectures = ["Qwen2AudioForConditionalGeneration"]
    return config


def build_tiny_audio(out_dir: str | Path, seed: int) -> Path:
    """Write the tiny ``qwen2_audio`` checkpoint (config, weights, tokenizer, processor)."""
    import torch
    from transformers import (
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
    )

    path = prepare_dir(out_dir)
    config = tiny_audio_config()

    torch.manual_seed(seed)
    model = Qwen2AudioForConditionalGeneration(config).eval()
    init_weights(model, seed, keep=lambda name: name.endswith("embed_positions.weight"))
    positions = dict(model.named_parameters())["model.audio_tower.embed_positions.weight"]
    with torch.no_grad():
        positions.copy_(sinusoids(MAX_SOURCE_POSITIONS, TINY_AUDIO["d_model"]))
    save_weights(path, model.state_dict(), rename_prefixes(_HUB_LAYOUT))
    del model

    write_json(path / "config.json", clean_config_dict(config))
    write_json(path / "generation_config.json", generation_config(TINY_SPECIAL_TOKENS))

    tokenizer = wrap_tokenizer(
        build_tokenizer(TINY_TEXT["vocab_size"], TINY_SPECIAL_TOKENS),
        chat_template=QWEN_CHAT_TEMPLATE,
        model_max_length=TINY_TEXT["max_position_embeddings"],
    )
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

"""Helpers shared by the tiny-model builders: seeded weights, byte-stable files, the text tower.

Everything that touches torch imports it inside the function.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

# The tiny text tower every family shares (head_dim 64: a size vLLM's CPU attention has).
TINY_TEXT: dict[str, Any] = {
    "vocab_size": 1024,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
}
TINY_VISION: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
}
"""The tiny vision tower of the ViT-style families (SigLIP, InternViT, Pixtral's): each adds
its image and patch sizes."""
HALF_NORM = [0.5, 0.5, 0.5]
"""Pixel mean and std that map [0, 1] to [-1, 1], as SigLIP-style processors normalise."""
TINY_MROPE_SECTION = [8, 12, 12]  # sums to head_dim / 2 = 32
ROPE_THETA = 1_000_000.0

INIT_STD = 0.02  # every matrix, embedding and conv kernel
LM_HEAD_STD = 0.5  # large on purpose: greedy argmax gets clear margins


def init_weights(
    model: Any, seed: int, *, keep: Callable[[str], bool] = lambda name: False
) -> None:
    """Overwrite every parameter from one seeded generator, in sorted-name order.

    Norm weights become 1, biases 0, ``lm_head`` weights N(0, 0.5), everything else N(0, 0.02).
    Names for which ``keep`` is true keep the values the model was built with (e.g. fixed
    sinusoidal position tables). The result depends only on the seed and the parameter shapes,
    not on how transformers initialises a model.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in sorted(params):
            if keep(name):
                continue
            p = params[name]
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "bias":
                p.zero_()
            elif p.ndim == 1:  # LayerNorm / RMSNorm scales
                p.fill_(1.0)
            else:
                std = LM_HEAD_STD if name.endswith("lm_head.weight") else INIT_STD
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)


def save_weights(
    out_dir: Path, state_dict: Mapping[str, Any], rename: Callable[[str], str]
) -> Path:
    """Write ``model.safetensors`` (float32, keys renamed, sorted) with fixed metadata."""
    from safetensors.torch import save_file

    tensors = {}
    for key, value in state_dict.items():
        new = rename(key)
        if new in tensors:
            raise ValueError(f"two weights map to {new!r}")
        tensors[new] = value.detach().to("cpu").float().contiguous().clone()
    path = out_dir / "model.safetensors"
    save_file(dict(sorted(tensors.items())), str(path), metadata={"format": "pt"})
    return path


def rename_prefixes(mapping: Mapping[str, str]) -> Callable[[str], str]:
    """A key renamer that swaps the first matching prefix (tried in the order given)."""

    def rename(key: str) -> str:
        for old, new in mapping.items():
            if key.startswith(old):
                return new + key[len(old) :]
        return key

    return rename


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Stable JSON: sorted keys, two-space indent, trailing newline."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def clean_config_dict(config: Any) -> dict[str, Any]:
    """A config's ``to_diff_dict`` with the dtype pinned, ready for :func:`write_json`."""
    data: dict[str, Any] = config.to_diff_dict()
    data["dtype"] = "float32"
    return data


def generation_config(special_tokens: Mapping[str, int]) -> dict[str, Any]:
    """A minimal ``generation_config.json``: stop on ``<|im_end|>`` or ``<|endoftext|>``."""
    return {
        "bos_token_id": special_tokens["<|endoftext|>"],
        "eos_token_id": [special_tokens["<|im_end|>"], special_tokens["<|endoftext|>"]],
        "pad_token_id": special_tokens["<|endoftext|>"],
    }


def prepare_dir(out_dir: str | Path) -> Path:
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def qwen2_text(bos: int, eos: int, pad: int) -> dict[str, Any]:
    """The tiny text tower as a Qwen2 ``text_config`` with plain RoPE (the LLaVA-OneVision,
    InternVL, Qwen2-Audio and Audio Flamingo 3 families build on Qwen2)."""
    return dict(
        TINY_TEXT,
        model_type="qwen2",
        max_window_layers=TINY_TEXT["num_hidden_layers"],
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
    )


def llama_text(**overrides: Any) -> dict[str, Any]:
    """The tiny text tower as a Llama-style ``text_config`` (Llama, Mistral: no sliding
    window flag, an explicit head_dim), ``overrides`` on top."""
    text = {k: v for k, v in TINY_TEXT.items() if k != "use_sliding_window"}
    head_dim = TINY_TEXT["hidden_size"] // TINY_TEXT["num_attention_heads"]
    return {**text, "head_dim": head_dim, **overrides}


def tiny_tokenizer(
    special_tokens: Mapping[str, int],
    chat_template: str,
    *,
    plain_tokens: Mapping[str, int] | None = None,
    **names: Any,
) -> Any:
    """The tiny text tower's tokenizer: ``TINY_TEXT``'s vocabulary with the family's
    ``special_tokens`` (and ``plain_tokens``) at their ids, its chat template and context;
    ``names`` (eos, pad, bos, named) as ``wrap_tokenizer`` takes them."""
    from mmbatch.tiny_models.tokenizer import build_tokenizer, wrap_tokenizer

    return wrap_tokenizer(
        build_tokenizer(TINY_TEXT["vocab_size"], special_tokens, plain_tokens=plain_tokens),
        chat_template=chat_template,
        model_max_length=TINY_TEXT["max_position_embeddings"],
        **names,
    )


def write_checkpoint(
    out_dir: Path,
    config: Any,
    model_cls: Any,
    seed: int,
    layout: Mapping[str, str],
    *,
    keep: Callable[[str], bool] = lambda name: False,
    fill: Callable[[Any], None] = lambda model: None,
) -> None:
    """Build ``model_cls(config)``, seed its weights (:func:`init_weights`; ``fill`` then sets
    what must not be random), and write ``model.safetensors`` with the keys renamed by the
    prefix map ``layout`` (the hub's names, which vLLM loads), tied weights once, and
    ``config.json``."""
    import torch

    torch.manual_seed(seed)
    model = model_cls(config).eval()
    init_weights(model, seed, keep=keep)
    with torch.no_grad():
        fill(model)
    # A tied weight (Gemma's lm_head is its embedding) is stored once, as the hub has it.
    every = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    tied = every - dict(model.named_parameters()).keys()
    state = {k: v for k, v in model.state_dict().items() if k not in tied}
    save_weights(out_dir, state, rename_prefixes(layout))
    del model
    write_json(out_dir / "config.json", clean_config_dict(config))


def sinusoids(length: int, channels: int) -> Any:
    """Whisper's fixed sinusoidal position table (its audio encoders learn none)."""
    import torch

    increment = math.log(10000) / (channels // 2 - 1)
    inv_timescales = torch.exp(-increment * torch.arange(channels // 2, dtype=torch.float32))
    scaled = torch.arange(length, dtype=torch.float32)[:, None] * inv_timescales[None, :]
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)


WHISPER_POSITIONS = "model.audio_tower.embed_positions.weight"
"""An audio tower's position table: Whisper's fixed sinusoids, never random."""


def whisper_positions(model: Any) -> None:
    """Set the audio tower's position table to Whisper's sinusoids: the ``fill`` of
    ``write_checkpoint``, whose ``keep`` spares ``WHISPER_POSITIONS`` the random init."""
    table = dict(model.named_parameters())[WHISPER_POSITIONS]
    table.copy_(sinusoids(*table.shape))


def whisper_features(mel_bins: int, sampling_rate: int) -> Any:
    """Whisper's feature extractor as the audio families' processors use it: 10 ms hops,
    30 s windows, ``mel_bins`` as the audio tower's config says."""
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(
        feature_size=mel_bins,
        sampling_rate=sampling_rate,
        hop_length=160,
        chunk_length=30,
        n_fft=400,
        padding_value=0.0,
        return_attention_mask=True,
    )

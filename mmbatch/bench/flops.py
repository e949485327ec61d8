"""A FLOPs model for Qwen2-VL / Qwen2.5-VL and Gemma 3, to state how far a run is from the
compute bound.

Counted as 2 FLOPs per multiply-accumulate of the matrix products (attention scores
included, norms and activations left out):

* language model, per token at context length ``ctx``, with ``a`` = heads * head_dim and
  ``kv`` = kv heads * head_dim (``a`` = ``h`` on Qwen; Gemma's heads are wider):
  ``2 * L * (2*h*a + 2*h*kv + 3*h*I + 2*ctx*a) + 2*h*V``
  (q and o projections, k and v projections, the gated MLP, scores and weighted values, lm_head);
* Qwen's vision encoder, per image of ``P`` patches (14x14, two temporal copies):
  ``2 * P * (1176*hv + depth*(4*hv*hv + k*hv*Iv + 2*W*hv)) + 2 * P/4 * (16*hv*hv + 4*hv*h)``
  (patch embedding, blocks with attention over windows of ``W`` patches, the 2x2 merger),
  where ``k`` is 3 for Qwen2.5-VL's gated MLP and 2 for Qwen2-VL's;
* a SigLIP vision tower (Gemma 3), every picture resized to its ``image_size`` square of
  ``P`` patches: ``2 * P * (3*p*p*hv + L*(4*hv*hv + 2*hv*Iv + 2*P*hv)) + 2 * T*hv*h``
  (patch embedding, full-attention blocks, the projection of the ``T`` pooled tokens).

The minimal work of a workload counts each distinct image's encoder pass and shared prefix
(template head and image tokens) once, and every request's own suffix and output tokens.
"""

from __future__ import annotations

from typing import Any


def lm_flops_per_token(config: dict[str, Any], ctx: int) -> float:
    text = config.get("text_config") or config
    h = text["hidden_size"]
    layers = text["num_hidden_layers"]
    heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or h // heads
    attn = heads * head_dim
    kv = text.get("num_key_value_heads", heads) * head_dim
    inter = text["intermediate_size"]
    vocab = text["vocab_size"]
    per_layer = 2 * h * attn + 2 * h * kv + 3 * h * inter + 2 * ctx * attn
    return float(2 * layers * per_layer + 2 * h * vocab)


def vision_flops_per_image(config: dict[str, Any], height: int, width: int) -> float:
    vision = config["vision_config"]
    text = config.get("text_config") or config
    if "depth" not in vision:  # a SigLIP tower (Gemma 3): every picture becomes one square
        return _siglip_flops(vision, text["hidden_size"], config.get("mm_tokens_per_image", 256))
    patch = vision.get("patch_size", 14)
    patches = (height // patch) * (width // patch)
    hv = vision.get("hidden_size") if "out_hidden_size" in vision else vision["embed_dim"]
    depth = vision["depth"]
    gated = "out_hidden_size" in vision  # Qwen2.5-VL
    inter = vision.get("intermediate_size") or int(hv * vision.get("mlp_ratio", 4))
    window = min(patches, (vision.get("window_size", 112) // patch) ** 2 if gated else patches)
    per_patch = 1176 * hv + depth * (
        4 * hv * hv + (3 if gated else 2) * hv * inter + 2 * window * hv
    )
    merger = (patches // 4) * (16 * hv * hv + 4 * hv * text["hidden_size"])
    return float(2 * patches * per_patch + 2 * merger)


def _siglip_flops(vision: dict[str, Any], h: int, tokens: int) -> float:
    patch = vision.get("patch_size", 14)
    patches = (vision["image_size"] // patch) ** 2
    hv = vision["hidden_size"]
    inter = vision["intermediate_size"]
    per_patch = 3 * patch * patch * hv + vision["num_hidden_layers"] * (
        4 * hv * hv + 2 * hv * inter + 2 * patches * hv
    )
    return float(2 * patches * per_patch + 2 * tokens * hv * h)


def minimal_flops(
    config: dict[str, Any],
    *,
    distinct_images: int,
    requests: int,
    image_size: tuple[int, int],
    prefix_tokens: float,
    mean_prompt_tokens: float,
    mean_output_tokens: float,
) -> float:
    """FLOPs a perfect engine must spend on a workload (see the module docstring)."""
    ctx = mean_prompt_tokens + mean_output_tokens / 2
    per_token = lm_flops_per_token(config, int(ctx))
    suffix = max(0.0, mean_prompt_tokens - prefix_tokens)
    shared = distinct_images * (
        vision_flops_per_image(config, *image_size) + per_token * prefix_tokens
    )
    own = requests * per_token * (suffix + mean_output_tokens)
    return shared + own

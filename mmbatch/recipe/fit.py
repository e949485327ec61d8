"""What a recipe needs of a model, and the engine sized to it: one recipe, any model.

A recipe states its needs in what it already says: the media it reads and how large they
may be ([media]: pictures of up to ``max_pixels``, clips of ``num_frames`` frames, audio
windows of ``window_s`` seconds), its questions and system prompt, and its longest answer
([sampling] ``max_tokens``). With the model's chat template and vLLM's own token counts for
it (read from the model folder and vLLM's processing info; no engine started),
``recipe_needs`` counts the longest prompt one of its items can make, answer included.
``fit_engine`` then checks that against the model's context (as vLLM reads it from the
model's config) and sets ``max_model_len`` to what the recipe needs, rounded up: a model
too small for the recipe is refused before anything runs, saying by how much, and a
large-context model reserves KV cache for what the job uses, not its whole context. A
``max_model_len`` the user gives is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from mmbatch.engine.budget import ItemCount, PromptBudget
from mmbatch.engine.config import EngineConfig
from mmbatch.errors import ConfigError
from mmbatch.media.options import scaled_size
from mmbatch.recipe.requests import audio_options, video_options
from mmbatch.recipe.spec import Recipe
from mmbatch.types import Modality

CONTEXT_STEP = 256
"""``max_model_len`` is what a recipe needs, rounded up to a multiple of this."""

ASPECTS = ((1, 1), (4, 3), (3, 4), (16, 9), (9, 16), (2, 1), (1, 2), (3, 1), (1, 3))
"""The picture shapes tried for the most tokens under a pixel limit."""


@dataclass(frozen=True)
class Needs:
    """The longest prompt one item of a recipe can make, and its answer, in tokens."""

    text: int
    """The chat template's text around the longest question, system prompt included."""
    media: int
    """The item's media at the largest size the recipe lets them be."""
    answer: int
    what: str
    """The media, in words: ``a clip of 8 frames of up to 200704 pixels``."""

    @property
    def total(self) -> int:
        return self.text + self.media + self.answer

    def describe(self) -> str:
        return (
            f"{self.total} tokens (text {self.text} + {self.what} {self.media} + "
            f"answer {self.answer})"
        )


def request_modality(recipe: Recipe) -> Modality:
    """What one request of the recipe sends: a picture (images and single video frames), a
    clip, or a window of audio."""
    kind = recipe.media.kind
    if kind == "video" and not recipe.media.options.get("as_clip", False):
        return "image"
    return kind


def recipe_needs(recipe: Recipe, config: EngineConfig) -> Needs | None:
    """What ``recipe`` needs of the model ``config`` names; None where vLLM's processing info
    does not say how many tokens its media become (only its template is known then).
    ``ConfigError`` if the model takes no media of the recipe's kind."""
    from mmbatch.engine.processor import ChatTemplate
    from mmbatch.engine.vllm_settings import processing_counts

    trust = bool(config.engine_kwargs.get("trust_remote_code", False))
    template = ChatTemplate(config.model, trust)
    processor = template.processor
    modality = request_modality(recipe)
    part = {"image": "image_processor", "video": "video_processor", "audio": "feature_extractor"}
    if getattr(processor, part[modality], None) is None:
        raise ConfigError(
            f"the model {config.model!r} takes no {modality} input, which the recipe "
            f"{recipe.name!r} sends ([media] kind = {recipe.media.kind!r})"
        )
    counts = processing_counts(config, template.render)
    budget = PromptBudget.from_processor(processor, template.render, counts, 1 << 30)
    media = _media_tokens(recipe, modality, budget)
    if media is None:
        return None
    text = max(budget.text_tokens(recipe.system, q.text, (modality,)) for q in recipe.questions)
    return Needs(text, media[0], recipe.sampling.max_tokens, media[1])


def fit_engine(recipe: Recipe, config: EngineConfig) -> tuple[EngineConfig, str | None]:
    """``config`` with ``max_model_len`` set to what ``recipe`` needs of its model (unless
    the user set it), and a line saying what was chosen and why (None: nothing to say).
    ``ConfigError`` when the model's context cannot hold the recipe."""
    from mmbatch.engine.vllm_settings import preflight

    if "max_model_len" in config.engine_kwargs:
        return config, None
    needs = recipe_needs(recipe, config)
    if needs is None:
        return config, (
            f"the token rules of {config.model!r} are not known here, so max_model_len is the "
            "model's own (set [engine] max_model_len to hold less)"
        )
    context = preflight(config, {request_modality(recipe): 1}).max_model_len
    if needs.total > context:
        raise ConfigError(
            f"the model {config.model!r} holds {context} tokens of context; the recipe "
            f"{recipe.name!r} needs {needs.describe()}: lower [media] sizes or frames or "
            "[sampling] max_tokens, or use a model with a longer context"
        )
    length = min(context, math.ceil(needs.total / CONTEXT_STEP) * CONTEXT_STEP)
    fitted = replace(config, engine_kwargs={**config.engine_kwargs, "max_model_len": length})
    return fitted, (
        f"max_model_len {length}: the recipe needs {needs.describe()}; the model holds {context}"
    )


def _media_tokens(
    recipe: Recipe, modality: Modality, budget: PromptBudget
) -> tuple[int, str] | None:
    """The most tokens one item's media become, and the media in words."""
    counts = budget.counts
    if counts is None:
        return None
    if modality == "audio":
        window = audio_options(recipe).window_s
        rate = budget.audio_rate
        audio = counts.audio(math.ceil(window * rate)) if rate else None
        return None if audio is None else (audio.tokens, f"{window:g} s of audio")
    cap = budget.max_pixels(modality)
    limit = recipe.media.options.get("max_pixels")
    pixels = min(int(limit), cap) if limit and cap else int(limit) if limit else cap
    frames = None
    if modality == "video":
        clip = video_options(recipe)
        frames = clip.num_frames if clip.sampling == "num_frames" else clip.clip_max_frames
        frames = min(frames, clip.clip_max_frames)
    tokens = _most_tokens(budget, pixels, frames)
    if tokens is None:
        return None
    size = f"of up to {pixels} pixels" if pixels else "of any size"
    what = f"a picture {size}" if frames is None else f"a clip of {frames} frames {size}"
    return tokens, what


def _most_tokens(budget: PromptBudget, pixels: int | None, frames: int | None) -> int | None:
    """The most tokens a picture (or a clip of ``frames`` frames) of at most ``pixels``
    pixels becomes, as the loader decodes it (scaled down to ``pixels``) and vLLM counts it:
    the largest over common aspect ratios and the size vLLM profiles the model with."""
    assert budget.counts is not None
    counts = budget.counts
    sizes = []
    largest = counts.largest_image()
    if largest is not None:
        sizes.append(scaled_size(*largest, pixels))
    if pixels is not None:
        big = 1 << 14  # any picture larger than the limit is scaled down to it
        sizes += [
            scaled_size(big * w // max(w, h), big * h // max(w, h), pixels) for w, h in ASPECTS
        ]
    found: list[ItemCount | None] = [
        counts.image(w, h) if frames is None else counts.video(w, h, frames) for w, h in sizes
    ]
    known = [c.tokens for c in found if c is not None]
    return max(known) if known else None


def describe_fit(recipe: Recipe, config: EngineConfig) -> str:
    """``mmbatch check RECIPE --model M``: whether the model can run the recipe, in one line
    (``ConfigError`` when it cannot), from its config and processor; no engine is started."""
    from mmbatch.engine.vllm_settings import preflight

    fitted, note = fit_engine(recipe, config)
    # Every engine argument as vLLM reads it, a given max_model_len against the model's.
    preflight(fitted, {request_modality(recipe): 1})
    if note is not None:
        return f"{config.model} can run it: {note}"
    given = int(config.engine_kwargs["max_model_len"])
    needs = recipe_needs(recipe, config)
    if needs is not None and needs.total > given:
        return (
            f"{config.model} with max_model_len {given}: its items may be shrunk or refused, "
            f"the recipe needs {needs.describe()}"
        )
    return f"{config.model} can run it with max_model_len {given}"

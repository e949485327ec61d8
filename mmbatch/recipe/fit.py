"""What a recipe needs of a model, and the engine sized to it: one recipe, any model.

A recipe states its needs in what it already says: the media it reads and how large they
may be ([media]: pictures of up to ``max_pixels``, clips of ``num_frames`` frames, audio
windows of ``window_s`` seconds), its questions and system prompt, and its longest answer
([sampling] ``max_tokens``). With the model's own processor (its resize rules and chat
template, read from the model folder; no engine started), ``recipe_needs`` counts the longest
prompt one of its items can make, answer included. ``fit_engine`` then checks that against
the model's context (as vLLM reads it from the model's config) and sets ``max_model_len``
to what the recipe needs, rounded up: a model too small for the recipe is refused before
anything runs, saying by how much, and a large-context model reserves KV cache for what
the job uses, not its whole context. A ``max_model_len`` the user gives is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from mmbatch.engine.budget import PromptBudget, VisionRules
from mmbatch.engine.config import EngineConfig
from mmbatch.errors import ConfigError
from mmbatch.recipe.requests import audio_options, video_options
from mmbatch.recipe.spec import Recipe
from mmbatch.types import Modality

CONTEXT_STEP = 256
"""``max_model_len`` is what a recipe needs, rounded up to a multiple of this."""


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


def recipe_needs(recipe: Recipe, model: str, trust_remote_code: bool = False) -> Needs | None:
    """What ``recipe`` needs of ``model``'s context; None where the model's processor does
    not say how many tokens its media become (only its template is known then).
    ``ConfigError`` if the model takes no media of the recipe's kind."""
    from mmbatch.engine.processor import chat_messages, load_processor

    processor = load_processor(model, trust_remote_code)
    if getattr(processor, "chat_template", None) is None:
        raise ConfigError(f"the model {model!r} has no chat template")

    def render(system: str | None, prompt: str, modalities: tuple[str, ...]) -> str:
        messages = chat_messages(system, prompt, modalities)
        return str(
            processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        )

    budget = PromptBudget.from_processor(processor, render, max_model_len=1 << 30)
    modality = request_modality(recipe)
    part = {"image": "image_processor", "video": "video_processor", "audio": "feature_extractor"}
    if getattr(processor, part[modality], None) is None:
        raise ConfigError(
            f"the model {model!r} takes no {modality} input, which the recipe "
            f"{recipe.name!r} sends ([media] kind = {recipe.media.kind!r})"
        )
    media = _media_tokens(recipe, modality, budget)
    if media is None:
        return None
    text = max(budget.text_tokens(recipe.system, q.text, (modality,)) for q in recipe.questions)
    return Needs(text, media[0], recipe.sampling.max_tokens, media[1])


def fit_engine(recipe: Recipe, config: EngineConfig) -> tuple[EngineConfig, str | None]:
    """``config`` with ``max_model_len`` set to what ``recipe`` needs of its model (unless
    the user set it), and a line saying what was chosen and why (None: nothing to say).
    ``ConfigError`` when the model's context cannot hold the recipe."""
    from mmbatch.engine.vllm import preflight

    if "max_model_len" in config.engine_kwargs:
        return config, None
    trust = bool(config.engine_kwargs.get("trust_remote_code", False))
    needs = recipe_needs(recipe, config.model, trust)
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
    options = recipe.media.options
    if modality == "audio":
        if budget.audio is None:
            return None
        window = audio_options(recipe).window_s
        tokens = budget.audio.tokens(math.ceil(window * budget.audio.sample_rate))
        return tokens, f"{window:g} s of audio"
    rules = budget.video if modality == "video" else budget.image
    if rules is None:
        return None
    pixels = min(int(options.get("max_pixels") or rules.max_pixels), rules.max_pixels)
    per_frame = _most_tokens(rules, pixels)
    if modality == "image":
        return per_frame, f"a picture of up to {pixels} pixels"
    clip = video_options(recipe)
    frames = clip.num_frames if clip.sampling == "num_frames" else clip.clip_max_frames
    frames = min(frames, clip.clip_max_frames)
    groups = math.ceil(frames / rules.temporal_patch_size) if frames > 1 else 1
    return groups * per_frame, f"a clip of {frames} frames of up to {pixels} pixels"


def _most_tokens(rules: VisionRules, pixels: int) -> int:
    """The most tokens a picture of at most ``pixels`` pixels becomes: the processor resizes
    it into cells of ``patch_size * merge_size`` pixels a side, within its own bounds."""
    cell = (rules.patch_size * rules.merge_size) ** 2
    return max(pixels, rules.min_pixels) // cell


def describe_fit(recipe: Recipe, config: EngineConfig) -> str:
    """``mmbatch check RECIPE --model M``: whether the model can run the recipe, in one line
    (``ConfigError`` when it cannot), from its config and processor; no engine is started."""
    from mmbatch.engine.vllm import preflight

    fitted, note = fit_engine(recipe, config)
    # Every engine argument as vLLM reads it, a given max_model_len against the model's.
    preflight(fitted, {request_modality(recipe): 1})
    if note is not None:
        return f"{config.model} can run it: {note}"
    given = int(config.engine_kwargs["max_model_len"])
    trust = bool(config.engine_kwargs.get("trust_remote_code", False))
    needs = recipe_needs(recipe, config.model, trust)
    if needs is not None and needs.total > given:
        return (
            f"{config.model} with max_model_len {given}: its items may be shrunk or refused, "
            f"the recipe needs {needs.describe()}"
        )
    return f"{config.model} can run it with max_model_len {given}"

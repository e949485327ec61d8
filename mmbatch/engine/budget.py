"""Pre-flight token budget: measure each prompt before the engine sees it (the loader's
``mmbatch.media.limits.PromptLimits``, implemented from the model's processor).

A prompt longer than ``max_model_len``, or a media item larger than the engine's encoder
cache, is refused by vLLM at best and loops forever at worst (vLLM issues #15136, #26223);
either way the cost of decoding it was wasted. So the loader asks this module first:

* ``fit_clip``, before a clip is decoded: if its frames would not fit, take fewer frames
  (down to ``VideoOptions.min_frames``), then smaller frames (down to ``min_pixels``); if it
  still does not fit, refuse it, saying by how many tokens it is over;
* ``check``, after decoding: the prompt length of every request; over is an error row.

Measuring is part of one item's work: whatever it raises (Qwen's resize refuses an aspect
ratio over 200, as in a 1x201 strip or a 16x3600 clip) is that item's ``RequestRejected``,
never the job's end.

How many tokens an item becomes is not decided here: ``TokenCounts`` answers it, and the
engine side implements it from vLLM's own per-model processing info
(``mmbatch.engine.vllm_counts``), so every family vLLM serves is counted as vLLM counts it.
The text part is the model's chat template rendered and tokenized, each media placeholder
taken out (the item's count includes it). An item whose count is unknown (``None``) is let
through: vLLM's own checks then refuse the request if it does not fit, as an error row. The
slow tests compare these numbers with the prompt lengths vLLM reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Protocol

from mmbatch.errors import ItemFailure, RequestRejected
from mmbatch.media.options import VideoOptions, scaled_size
from mmbatch.media.video import VideoIndex, select_frames
from mmbatch.types import MediaItem, Modality, Request

SHRINK_STEP = 0.8
"""Each pixel-shrinking try keeps this share of the previous frame area."""


class ItemCount(NamedTuple):
    """What one media item takes of the engine."""

    tokens: int
    """Prompt tokens the item adds in place of its placeholder token."""
    encoder: int | None
    """Encoder outputs it needs in the encoder cache (None: not known; vLLM checks)."""


class TokenCounts(Protocol):
    """How many tokens a media item of a given size becomes on the model (None: unknown)."""

    def image(self, width: int, height: int) -> ItemCount | None:
        """A picture (or a single video frame) of ``width`` x ``height`` pixels."""
        ...

    def video(self, width: int, height: int, frames: int) -> ItemCount | None:
        """A clip of ``frames`` frames of ``width`` x ``height`` pixels."""
        ...

    def audio(self, samples: int) -> ItemCount | None:
        """``samples`` samples of audio at the model's sample rate."""
        ...

    def largest_image(self) -> tuple[int, int] | None:
        """The picture size that takes the most tokens (None: not known)."""
        ...


@dataclass(frozen=True)
class Over:
    """How a prompt breaks the budget, in words a user can act on."""

    message: str


class PromptBudget:
    """The engine's limits, the model's token counts and its template, to measure prompts up
    front."""

    def __init__(
        self,
        text_tokens: Callable[[str | None, str, tuple[Modality, ...]], int],
        max_model_len: int,
        max_item_tokens: int | None = None,
        counts: TokenCounts | None = None,
        pixel_caps: Mapping[Modality, int] | None = None,
        audio_rate: int | None = None,
    ) -> None:
        self.text_tokens = text_tokens
        """Tokens of the rendered prompt, not counting the media placeholders."""
        self.max_model_len = max_model_len
        self.max_item_tokens = max_item_tokens
        self.counts = counts
        self.pixel_caps = dict(pixel_caps or {})
        self.audio_rate = audio_rate
        """The sample rate the model's audio features expect; None for a model without audio."""

    @classmethod
    def from_processor(
        cls,
        processor: Any,
        render: Callable[[str | None, str, tuple[str, ...]], str],
        counts: TokenCounts | None,
        max_model_len: int,
        max_item_tokens: int | None = None,
    ) -> PromptBudget:
        """The budget of a Hugging Face ``processor`` (its tokenizer, its pixel caps, its
        audio rate) and ``counts``; ``render`` is the engine's template."""
        tokenizer = getattr(processor, "tokenizer", processor)

        def text_tokens(system: str | None, prompt: str, modalities: tuple[Modality, ...]) -> int:
            # Each media placeholder in the rendered text is one token that vLLM expands.
            return len(tokenizer.encode(render(system, prompt, modalities))) - len(modalities)

        parts: tuple[tuple[Modality, str], ...] = (
            ("image", "image_processor"),
            ("video", "video_processor"),
        )
        caps = {
            modality: cap
            for modality, part in parts
            if (cap := pixel_cap(getattr(processor, part, None))) is not None
        }
        features = getattr(processor, "feature_extractor", None)
        rate = getattr(features, "sampling_rate", None)
        return cls(
            text_tokens,
            max_model_len,
            max_item_tokens,
            counts,
            caps,
            int(rate) if rate else None,
        )

    def max_pixels(self, modality: Modality) -> int | None:
        """The processor's own pixel cap for a picture or a video frame (None: it states
        none, and pictures are decoded whole)."""
        return self.pixel_caps.get(modality)

    def item_tokens(self, item: MediaItem) -> ItemCount | None:
        """What ``item`` takes, or None where it is not known."""
        meta, counts = item.meta, self.counts
        if counts is None:
            return None
        if item.modality == "image":
            return self._vision(int(meta["width"]), int(meta["height"]))
        if item.modality == "video":
            return self._vision(int(meta["width"]), int(meta["height"]), int(meta["frames"]))
        return counts.audio(int(meta["samples"]))

    def _vision(self, width: int, height: int, frames: int | None = None) -> ItemCount | None:
        assert self.counts is not None
        try:
            if frames is None:
                return self.counts.image(width, height)
            return self.counts.video(width, height, frames)
        except ValueError as exc:  # "absolute aspect ratio must be smaller than 200"
            raise RequestRejected(
                f"{width}x{height} pixels cannot be resized for this model's vision encoder: {exc}"
            ) from None

    def measure(
        self, request: Request, items: Sequence[tuple[Modality, ItemCount | None]]
    ) -> Over | None:
        """``None`` if the request fits, else why not: the prompt length against
        ``max_model_len`` (one token is kept for the answer) and each item against the
        encoder cache."""
        if self.max_item_tokens is not None:
            for modality, item in items:
                n = None if item is None else item.encoder
                if n is not None and n > self.max_item_tokens:
                    return Over(
                        f"the {modality} takes {n} tokens, {n - self.max_item_tokens} over the "
                        f"engine's encoder cache of {self.max_item_tokens} tokens per item"
                    )
        modalities = tuple(m for m, _ in items)
        tokens = [(m, item.tokens) for m, item in items if item is not None]
        text = self.text_tokens(request.system, request.prompt, modalities)
        total = text + sum(n for _, n in tokens)
        limit = self.max_model_len - 1
        if total <= limit:
            return None
        parts = " + ".join([f"text {text}", *(f"{m} {n}" for m, n in tokens)])
        return Over(
            f"the prompt takes {total} tokens ({parts}), {total - limit} over max_model_len "
            f"{self.max_model_len} (less 1 token for the answer)"
        )

    def check(self, request: Request, media: Sequence[MediaItem]) -> None:
        """Raise ``RequestRejected`` if ``request`` with its decoded ``media`` is over, or
        cannot be measured."""
        with _measuring():
            over = self.measure(request, [(m.modality, self.item_tokens(m)) for m in media])
        if over is not None:
            raise RequestRejected(over.message, kind="too_long")

    def fit_clip(self, request: Request, index: VideoIndex, options: VideoOptions) -> VideoOptions:
        """``options``, or options that sample a smaller clip that fits, within the bounds
        ``options`` allow; ``RequestRejected`` (saying by how much) if none does."""
        with _measuring():
            return self._fit_clip(request, index, options)

    def _fit_clip(self, request: Request, index: VideoIndex, options: VideoOptions) -> VideoOptions:
        if self.counts is None:
            return options
        others: list[tuple[Modality, ItemCount | None]] = [
            (r.modality, None) for r in request.media if r.modality != "video"
        ]
        unknown = False

        def over(opts: VideoOptions) -> Over | None:
            nonlocal unknown
            frames = len(select_frames(index, opts))
            width, height = scaled_size(*index.display_size, opts.max_pixels)
            count = self._vision(width, height, frames)
            unknown = unknown or count is None
            return self.measure(request, [("video", count), *others])

        first = over(options)
        if first is None:
            return options
        if unknown:  # over on the text (and other items) alone, whatever the clip takes
            raise RequestRejected(first.message, kind="too_long")
        frames = len(select_frames(index, options))
        floor = min(options.min_frames or frames, frames)
        for n in range(frames - 1, floor - 1, -1):
            shrunk = replace(options, max_frames=n)
            if over(shrunk) is None:
                return shrunk
        fewest = replace(options, max_frames=floor)
        if options.min_pixels is not None:
            width, height = index.display_size
            area = width * height if options.max_pixels is None else options.max_pixels
            while area * SHRINK_STEP >= options.min_pixels:
                area = int(area * SHRINK_STEP)
                shrunk = replace(fewest, max_pixels=area)
                if over(shrunk) is None:
                    return shrunk
        last = over(replace(fewest, max_pixels=options.min_pixels or options.max_pixels))
        raise RequestRejected((last or first).message + _bounds_hint(options), kind="too_long")


@contextmanager
def _measuring() -> Iterator[None]:
    """Whatever measuring one request raises is that request's refusal: the processor's
    rules meet every shape of input, and one they cannot take must cost one row."""
    try:
        yield
    except ItemFailure:
        raise
    except Exception as exc:
        raise RequestRejected(f"cannot measure the prompt: {type(exc).__name__}: {exc}") from None


def _bounds_hint(options: VideoOptions) -> str:
    if options.min_frames is None and options.min_pixels is None:
        return "; allow shrinking with min_frames / min_pixels, or sample fewer frames"
    return "; even the fewest frames and pixels allowed do not fit"


def pixel_cap(processor: Any) -> int | None:
    """The most pixels an image or video processor keeps of a picture or frame, where it
    states it: the processors that resize by area (the Qwen2-VL family's: ``size`` holds
    ``shortest_edge`` and ``longest_edge`` in pixels, tokens of ``merge_size`` squared
    patches). Others state sizes as edges (a 384x384 square, a longest side), which no pixel
    cap describes without cutting detail from some aspect ratio: None, decode whole."""
    if processor is None or not hasattr(processor, "merge_size"):
        return None
    size = getattr(processor, "size", None)
    try:
        longest = getattr(size, "longest_edge", None) or size["longest_edge"]  # type: ignore[index]
        shortest = getattr(size, "shortest_edge", None) or size["shortest_edge"]  # type: ignore[index]
    except (KeyError, TypeError):
        return None
    return int(longest) if longest and shortest else None

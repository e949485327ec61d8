"""Pre-flight token budget: measure each prompt before the engine sees it (the loader's
``mmbatch.media.limits.PromptLimits``, implemented from the model's processor).

A prompt longer than ``max_model_len``, or a media item larger than the engine's encoder
cache, is refused by vLLM at best and loops forever at worst (vLLM issues #15136, #26223);
either way the cost of decoding it was wasted. So the loader asks this module first:

* ``fit_clip``, before a clip is decoded: if its frames would not fit, take fewer frames
  (down to ``VideoOptions.min_frames``), then smaller frames (down to ``min_pixels``); if it
  still does not fit, refuse it, saying by how many tokens it is over;
* ``check``, after decoding: the exact prompt length of every request; over is an error row.

Measuring is part of one item's work: whatever it raises (``smart_resize`` refuses an aspect
ratio over 200, as in a 1x201 strip or a 16x3600 clip) is that item's ``RequestRejected``,
never the job's end.

The lengths follow the processor's own rules (the Qwen2-VL family's ``smart_resize`` into
28-pixel cells, two frames per temporal patch; Qwen2-Audio's two stride-2 reductions of the
Whisper frames), and the text part is the model's chat template rendered and tokenized, with
each media placeholder replaced by the item's token count. The slow tests compare these
numbers with the prompt lengths vLLM reports.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from mmbatch.errors import ItemFailure, RequestRejected
from mmbatch.media.options import VideoOptions, scaled_size
from mmbatch.media.video import VideoIndex, select_frames
from mmbatch.types import MediaItem, Modality, Request

SHRINK_STEP = 0.8
"""Each pixel-shrinking try keeps this share of the previous frame area."""


@dataclass(frozen=True)
class VisionRules:
    """The Qwen2-VL family's resize rules for one kind of input (image or video)."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int

    @classmethod
    def of(cls, processor: Any) -> VisionRules:
        size = processor.size
        return cls(
            patch_size=int(processor.patch_size),
            merge_size=int(processor.merge_size),
            temporal_patch_size=int(processor.temporal_patch_size),
            min_pixels=int(getattr(size, "shortest_edge", None) or size["shortest_edge"]),
            max_pixels=int(getattr(size, "longest_edge", None) or size["longest_edge"]),
        )

    def tokens(self, width: int, height: int, frames: int = 1) -> int:
        """Tokens for ``frames`` frames of ``width`` x ``height`` pixels (1 frame: an image)."""
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

        factor = self.patch_size * self.merge_size
        try:
            h, w = smart_resize(height, width, factor, self.min_pixels, self.max_pixels)
        except ValueError as exc:  # "absolute aspect ratio must be smaller than 200"
            raise RequestRejected(
                f"{width}x{height} pixels cannot be resized for this model's vision encoder: {exc}"
            ) from None
        cells = (h // self.patch_size) * (w // self.patch_size) // self.merge_size**2
        groups = math.ceil(frames / self.temporal_patch_size) if frames > 1 else 1
        return int(groups * cells)


@dataclass(frozen=True)
class AudioRules:
    """Qwen2-Audio's token count: Whisper frames (one per ``hop_length`` samples, at most
    ``max_frames``), halved by a stride-2 convolution and halved again by pooling."""

    hop_length: int
    max_frames: int
    sample_rate: int
    """The rate the feature extractor expects; audio is resampled to it before it is sent."""

    def tokens(self, samples: int) -> int:
        frames = min(math.ceil(samples / self.hop_length), self.max_frames)
        conv = (frames - 1) // 2 + 1
        return max(0, (conv - 2) // 2 + 1)


@dataclass(frozen=True)
class Over:
    """How a prompt breaks the budget, in words a user can act on."""

    message: str


class PromptBudget:
    """The engine's limits and the processor's token rules, to measure prompts up front."""

    def __init__(
        self,
        text_tokens: Callable[[str | None, str, tuple[Modality, ...]], int],
        max_model_len: int,
        max_item_tokens: int | None = None,
        image: VisionRules | None = None,
        video: VisionRules | None = None,
        audio: AudioRules | None = None,
    ) -> None:
        self.text_tokens = text_tokens
        """Tokens of the rendered prompt, not counting the media placeholders."""
        self.max_model_len = max_model_len
        self.max_item_tokens = max_item_tokens
        self.image, self.video, self.audio = image, video, audio

    @classmethod
    def from_processor(
        cls,
        processor: Any,
        render: Callable[[str | None, str, tuple[str, ...]], str],
        max_model_len: int,
        max_item_tokens: int | None = None,
    ) -> PromptBudget:
        """Rules read from a Hugging Face processor; ``render`` is the engine's template."""
        tokenizer = getattr(processor, "tokenizer", processor)

        def text_tokens(system: str | None, prompt: str, modalities: tuple[Modality, ...]) -> int:
            # Each media placeholder in the rendered text is one token that vLLM expands.
            return len(tokenizer.encode(render(system, prompt, modalities))) - len(modalities)

        image_proc = getattr(processor, "image_processor", None)
        video_proc = getattr(processor, "video_processor", None)
        features = getattr(processor, "feature_extractor", None)
        return cls(
            text_tokens,
            max_model_len,
            max_item_tokens,
            image=_vision_rules(image_proc),
            video=_vision_rules(video_proc),
            audio=AudioRules(
                int(features.hop_length), int(features.nb_max_frames), int(features.sampling_rate)
            )
            if features is not None and hasattr(features, "nb_max_frames")
            else None,
        )

    def max_pixels(self, modality: Modality) -> int | None:
        """The processor's own pixel cap for a picture or a video frame."""
        rules = self.image if modality == "image" else self.video if modality == "video" else None
        return rules.max_pixels if rules is not None else None

    @property
    def audio_rate(self) -> int | None:
        """The sample rate the model's audio features expect; None for a model without audio."""
        return self.audio.sample_rate if self.audio is not None else None

    def item_tokens(self, item: MediaItem) -> int | None:
        """The tokens ``item`` becomes, or None where the rules are not known."""
        meta = item.meta
        if item.modality == "image" and self.image is not None:
            return self.image.tokens(int(meta["width"]), int(meta["height"]))
        if item.modality == "video" and self.video is not None:
            return self.video.tokens(int(meta["width"]), int(meta["height"]), int(meta["frames"]))
        if item.modality == "audio" and self.audio is not None:
            return self.audio.tokens(int(meta["samples"]))
        return None

    def measure(
        self, request: Request, tokens: Sequence[tuple[Modality, int | None]]
    ) -> Over | None:
        """``None`` if the request fits, else why not: the prompt length against
        ``max_model_len`` (one token is kept for the answer) and each item against the
        encoder cache."""
        if self.max_item_tokens is not None:
            for modality, n in tokens:
                if n is not None and n > self.max_item_tokens:
                    return Over(
                        f"the {modality} takes {n} tokens, {n - self.max_item_tokens} over the "
                        f"engine's encoder cache of {self.max_item_tokens} tokens per item"
                    )
        modalities = tuple(m for m, _ in tokens)
        text = self.text_tokens(request.system, request.prompt, modalities)
        total = text + sum(n or 0 for _, n in tokens)
        limit = self.max_model_len - 1
        if total <= limit:
            return None
        parts = " + ".join([f"text {text}", *(f"{m} {n}" for m, n in tokens if n is not None)])
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
        if self.video is None:
            return options
        others = [(r.modality, None) for r in request.media if r.modality != "video"]

        def over(opts: VideoOptions) -> Over | None:
            frames = len(select_frames(index, opts))
            width, height = scaled_size(*index.display_size, opts.max_pixels)
            assert self.video is not None
            tokens = self.video.tokens(width, height, frames)
            return self.measure(request, [("video", tokens), *others])

        first = over(options)
        if first is None:
            return options
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


def _vision_rules(processor: Any) -> VisionRules | None:
    if processor is None or not hasattr(processor, "merge_size"):
        return None
    try:
        return VisionRules.of(processor)
    except (AttributeError, KeyError, TypeError):
        return None

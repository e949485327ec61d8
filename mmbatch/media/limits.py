"""What the loader asks of the model's limits, without knowing the engine that sets them.

The engine side (``mmbatch.engine.budget.PromptBudget``) knows the model's context length,
its encoder cache and its processor's token rules; the loader only needs the three answers
below. Declaring them here, as a protocol, keeps the dependency pointing down: the loader is
handed an implementation and never imports the engine. ``failure_of`` is the last check
before a request whose media are decoded goes to the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from mmbatch.errors import RequestRejected
from mmbatch.media.options import MediaOptions, VideoOptions
from mmbatch.types import ItemError, LoadedRequest, MediaItem, Modality, Request, Result

if TYPE_CHECKING:
    from mmbatch.media.video import VideoIndex


class PromptLimits(Protocol):
    """The model's limits, as the loader uses them before a request reaches the engine."""

    @property
    def audio_rate(self) -> int | None:
        """The sample rate the model's audio features expect (None: it takes no audio)."""
        ...

    def max_pixels(self, modality: Modality) -> int | None:
        """The most pixels the model's processor keeps of a picture (``"image"``) or of a
        video frame (``"video"``): it resizes anything larger down to this anyway."""
        ...

    def fit_clip(self, request: Request, index: VideoIndex, options: VideoOptions) -> VideoOptions:
        """``options``, or options sampling a smaller clip that fits the model; raise
        ``RequestRejected`` (saying by how much it is over) when none does."""
        ...

    def check(self, request: Request, media: Sequence[MediaItem]) -> None:
        """Raise ``RequestRejected`` if ``request`` with its decoded ``media`` does not fit."""
        ...


def settle(options: MediaOptions, limits: PromptLimits | None) -> MediaOptions:
    """``options`` with what the user left open settled by the model: audio at the model's
    rate, and pictures and frames decoded no larger than its processor keeps them, so that
    nothing larger than needed is decoded and held (an option the user set wins)."""
    if limits is None:
        return replace(options, audio=options.audio.at_model_rate(None))
    image_cap = options.image.max_pixels or limits.max_pixels("image")
    frame_cap = options.video.max_pixels or limits.max_pixels("image")
    clip_cap = options.video.max_pixels or limits.max_pixels("video")
    return replace(
        options,
        image=replace(options.image, max_pixels=image_cap),
        video=replace(options.video, max_pixels=clip_cap),
        frame_pixels=frame_cap,
        audio=options.audio.at_model_rate(limits.audio_rate),
    )


def failure_of(
    loaded: LoadedRequest,
    media: dict[str, MediaItem],
    errors: dict[str, ItemError],
    limits: PromptLimits | None,
) -> Result | None:
    """Why ``loaded`` cannot go to the engine: one of its media failed to decode
    (``errors``), or, with the model's ``limits``, its prompt with its decoded ``media`` is
    measured not to fit; None when it can go."""
    bad = next((errors[k] for k in loaded.media_keys if k in errors), None)
    if bad is not None:
        return Result(loaded.id, error=bad)
    if limits is not None:
        try:
            limits.check(loaded.request, [media[k] for k in loaded.media_keys])
        except RequestRejected as exc:
            return Result.failure(loaded.id, exc.stage, str(exc), exc.kind)
        except Exception as exc:  # the processor's rules refuse this input in their own way
            message = f"the model's processor cannot take it: {type(exc).__name__}: {exc}"
            return Result.failure(loaded.id, "validate", message, "rejected")
    return None

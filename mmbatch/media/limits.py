"""What the loader asks of the model's limits, without knowing the engine that sets them.

The engine side (``mmbatch.engine.budget.PromptBudget``) knows the model's context length,
its encoder cache and its processor's token rules; the loader only needs the three answers
below. Declaring them here, as a protocol, keeps the dependency pointing down: the loader is
handed an implementation and never imports the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from mmbatch.media.options import VideoOptions
from mmbatch.types import MediaItem, Request

if TYPE_CHECKING:
    from mmbatch.media.video import VideoIndex


class PromptLimits(Protocol):
    """The model's limits, as the loader uses them before a request reaches the engine."""

    @property
    def audio_rate(self) -> int | None:
        """The sample rate the model's audio features expect (None: it takes no audio)."""
        ...

    def fit_clip(self, request: Request, index: VideoIndex, options: VideoOptions) -> VideoOptions:
        """``options``, or options sampling a smaller clip that fits the model; raise
        ``RequestRejected`` (saying by how much it is over) when none does."""
        ...

    def check(self, request: Request, media: Sequence[MediaItem]) -> None:
        """Raise ``RequestRejected`` if ``request`` with its decoded ``media`` does not fit."""
        ...

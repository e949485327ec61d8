"""Load some requests' media in one call: key them, decode each distinct item once, measure.

The one-shot path, for tests that want the decoded items in hand: a job's pipeline streams
through ``mmbatch.media.feeder`` instead, which runs the same three steps (``Keyer``,
``decode``, the model's ``PromptLimits``: ``failure_of``) on worker threads and processes,
bounded in bytes. Failures become error ``Result``s for exactly the requests that use the
failing media.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mmbatch.media.decode import decode
from mmbatch.media.keys import Keyer
from mmbatch.media.limits import PromptLimits, failure_of, settle
from mmbatch.media.options import MediaOptions
from mmbatch.media.store import MediaStore
from mmbatch.types import ItemError, LoadedRequest, MediaItem, Request, Result


@dataclass
class LoadedWindow:
    """Requests with their media keys and decoded media, plus the requests that failed."""

    requests: list[LoadedRequest] = field(default_factory=list)
    media: dict[str, MediaItem] = field(default_factory=dict)
    failures: list[Result] = field(default_factory=list)
    bytes_read: int = 0


class MediaLoader:
    """Turns requests into ``LoadedRequest``s whose media are decoded and held in a store."""

    def __init__(
        self,
        options: MediaOptions | None = None,
        limits: PromptLimits | None = None,
        store: MediaStore | None = None,
    ) -> None:
        self.options = settle(options or MediaOptions(), limits)
        self.limits = limits
        self.keyer = Keyer(self.options, limits)
        self.store = store if store is not None else MediaStore()

    def load(self, requests: Sequence[Request]) -> LoadedWindow:
        unit = self.keyer.key(requests)
        window = LoadedWindow(failures=unit.failures, bytes_read=unit.bytes_read)
        errors: dict[str, ItemError] = {}
        for job in unit.jobs:
            held = [self.store.get(key) for key in job.keys]
            if all(item is not None for item in held):
                window.media.update((item.key, item) for item in held if item is not None)
                continue
            for key, made in decode(job).items():
                if isinstance(made, ItemError):
                    errors[key] = made
                else:
                    self.store.put(made)
                    window.media[key] = made
        for loaded in unit.loaded:
            result = failure_of(loaded, window.media, errors, self.limits)
            if result is None:
                window.requests.append(loaded)
            else:
                window.failures.append(result)
        return window

"""Decoded media by key: held while requests use them, kept while there is room.

Decoding is the expensive host-side step; the store makes "decode each distinct item once"
hold across a whole job as long as the item fits, and keeps memory bounded when the media
do not. An item is *pinned* while requests that use it are on their way to the engine (it
cannot be dropped then: the engine still needs it); once unpinned it stays, least recently
used first out, while the store is under its byte limit, so a repeat of the same bytes later
in the job is not decoded again. ``decodes`` counts the items put in, which tests use to
prove that identical bytes under two names were decoded once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from mmbatch.types import MediaItem

DEFAULT_STORE_BYTES = 2 * 1024**3


def item_bytes(item: MediaItem) -> int:
    return int(item.meta.get("nbytes", 0))


class MediaStore:
    """``MediaItem``s by key, pinned by the requests that use them, within ``max_bytes``
    for the unpinned ones."""

    def __init__(self, max_bytes: int = DEFAULT_STORE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.decodes = 0
        self.hits = 0
        self.held_bytes = 0
        self._items: OrderedDict[str, MediaItem] = OrderedDict()
        self._pins: dict[str, int] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> MediaItem | None:
        """The item for ``key`` if held (and then the most recently used)."""
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
                self.hits += 1
            return item

    def put(self, item: MediaItem) -> None:
        """Hold a freshly decoded ``item``; unpinned items beyond the limit go."""
        with self._lock:
            self.decodes += 1
            if item.key not in self._items:
                self._items[item.key] = item
                self.held_bytes += item_bytes(item)
            self._evict()

    def pin(self, key: str, count: int = 1) -> None:
        """``count`` more requests use ``key``: it stays until they ``unpin`` it."""
        with self._lock:
            self._pins[key] = self._pins.get(key, 0) + count

    def unpin(self, key: str, count: int = 1) -> None:
        with self._lock:
            left = self._pins.get(key, 0) - count
            if left > 0:
                self._pins[key] = left
            else:
                self._pins.pop(key, None)
                self._evict()

    def _evict(self) -> None:
        if self.held_bytes <= self.max_bytes:
            return
        for key in list(self._items):
            if self.held_bytes <= self.max_bytes:
                return
            if key not in self._pins:
                self.held_bytes -= item_bytes(self._items.pop(key))

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items

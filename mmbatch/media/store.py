"""A byte-bounded, least-recently-used store of decoded media, keyed by media key.

Decoding is the expensive host-side step; the store makes "decode each distinct item once"
hold across windows as long as the item fits in the budget, and keeps memory bounded when a
dataset is larger than RAM. ``decodes`` counts real decodes, which tests use to prove that
identical bytes under two names were decoded once.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from mmbatch.types import MediaItem

DEFAULT_STORE_BYTES = 2 * 1024**3


class MediaStore:
    """Decoded ``MediaItem``s by key, evicting the least recently used beyond ``max_bytes``."""

    def __init__(self, max_bytes: int = DEFAULT_STORE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.decodes = 0
        self.decode_seconds = 0.0
        self.hits = 0
        self._items: OrderedDict[str, tuple[MediaItem, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get_or_decode(self, key: str, decode: Callable[[], MediaItem]) -> MediaItem:
        """The item for ``key``, decoding it with ``decode`` only if it is not held."""
        with self._lock:
            held = self._items.get(key)
            if held is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return held[0]
        started = time.perf_counter()
        item = decode()
        elapsed = time.perf_counter() - started
        size = int(item.meta.get("nbytes", 0))
        with self._lock:
            self.decodes += 1
            self.decode_seconds += elapsed
            if key not in self._items:
                self._items[key] = (item, size)
                self._bytes += size
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, (_, evicted) = self._items.popitem(last=False)
                self._bytes -= evicted
        return item

    def __len__(self) -> int:
        return len(self._items)

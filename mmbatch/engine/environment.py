"""Environment variables set for one block, then given back as they were.

vLLM reads some of its settings from the environment as an engine is built (where its engine
core runs, where it logs), and the processes it starts then inherit the environment (torch's
threads). mmbatch sets such variables for that moment only, so that the process it runs in,
a notebook's or a kept engine's, is left as it was. Where the variable is one of mmbatch's
defaults, a user's own value wins.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def environment(values: Mapping[str, str], *, users_win: bool = False) -> Iterator[set[str]]:
    """``values`` in ``os.environ`` while the block runs, each variable given back as it was
    (or removed) afterwards. With ``users_win`` a variable already set is left alone. Yields
    the names this block set."""
    chosen = {
        name: value for name, value in values.items() if not users_win or name not in os.environ
    }
    saved = {name: os.environ.get(name) for name in chosen}
    os.environ.update(chosen)
    try:
        yield set(chosen)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

"""Rows in input order in every finished output, whatever order their items finished in.

The engine finishes requests in its own order, and the sinks write each row as its item
completes (so that a killed job keeps everything it finished). When a sink closes, its rows
are put in the order of the job's items: ``RowOrder.apply`` rewrites the JSON lines of a
finished output (or of a columnar output's spool, before it is converted) atomically, by
byte ranges, without decoding more of each row than its id. Rows of items that are not the
job's (an output appended to with ``--force``) keep their order after the job's.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from mmbatch.jsonl import write_bytes_atomic


@dataclass(frozen=True)
class RowOrder:
    """The order of a job's items (``ids``, as its requests list them), and how a row
    names its item (``RowShape.row_id``)."""

    ids: Sequence[str]
    row_id: Callable[[Mapping[str, Any]], str]

    def rank(self) -> dict[str, int]:
        rank: dict[str, int] = {}
        for item_id in self.ids:
            rank.setdefault(item_id, len(rank))
        return rank

    def sorted(self, rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """``rows`` in this order (a run's rows held in memory)."""
        rank = self.rank()
        listed = list(rows)
        return sorted(listed, key=lambda row: rank.get(self.row_id(row), len(rank)))

    def apply(self, path: Path) -> bool:
        """Rewrite the JSON lines at ``path`` in this order; False if they already were."""
        rank = self.rank()
        keys, starts, sizes = array("q"), array("q"), array("q")
        with path.open("rb") as handle:
            offset = 0
            for line in handle:
                if line.strip():
                    item = self.row_id(json.loads(line))
                    keys.append(rank.get(item, len(rank) + len(keys)))
                    starts.append(offset)
                    sizes.append(len(line))
                offset += len(line)
        order = sorted(range(len(keys)), key=keys.__getitem__)
        if order == list(range(len(keys))):
            return False
        with path.open("rb") as source:
            write_bytes_atomic(path, _ranges(source, order, starts, sizes))
        return True


def _ranges(
    source: BinaryIO, order: Sequence[int], starts: array[int], sizes: array[int]
) -> Iterable[bytes]:
    for i in order:
        source.seek(starts[i])
        line = source.read(sizes[i])
        yield line if line.endswith(b"\n") else line + b"\n"

"""What listing the inputs passed over or changed, for the job's summary.

A folder walk takes the files a job can use and passes over the rest; a frame job's cap may
cut the frames a sampling asked for; a video may hold less than its header declares. None of
that is an error of any one item, and none of it may go unsaid: the sources record it here,
by reason, and the job's summary (``OUT.summary.json`` and the lines the command prints at
the end) says it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mmbatch.words import counted_phrase

MAX_NOTES = 20
"""Notes kept word for word; past this many, only their number is."""


@dataclass
class ListingLog:
    """Files passed over, counted by reason, and notes on what listing changed."""

    skipped: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    more_notes: int = 0

    def skip(self, reason: str) -> None:
        """Count one file (or folder) a walk or glob passed over, and why."""
        self.skipped[reason] += 1

    def note(self, text: str) -> None:
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text)
        else:
            self.more_notes += 1

    def lines(self) -> list[str]:
        """What the command prints about its inputs."""
        lines = []
        if self.skipped:
            ranked = sorted(self.skipped.items(), key=lambda c: (-c[1], c[0]))
            counts = ", ".join(counted_phrase(n, reason) for reason, n in ranked)
            lines.append(f"passed over while listing the inputs: {counts}")
        return lines + self.note_lines()

    def note_lines(self) -> list[str]:
        more = [f"and {self.more_notes} more notes like these"] if self.more_notes else []
        return self.notes + more

    def to_dict(self) -> dict[str, Any]:
        """What the summary records (its ``job`` section)."""
        return {"skipped": dict(self.skipped), "notes": self.note_lines()}

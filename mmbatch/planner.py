"""Plan the whole job before any media is read: which requests reach the engine together.

vLLM's encoder cache and prefix cache only help when requests that share an image (and the
text before it) reach the engine close together. Users rarely write them that way: a loop
over tasks emits every image for prompt 1, then every image for prompt 2. So the plan groups
requests by *source identity*, over the whole job, whatever the input order: the file or URL
each media reference names (a video's frames and an audio file's windows together), or, for
media already in memory, the request itself. Groups keep the order in which their source
first appeared; within a group, requests follow their place in the source (a frame's time, a
window's or a clip's start), then their system prompt and prompt, so that neighbours share the
longest prefix. Nothing has been read yet, so two files with the same bytes are two groups here; the
feeder merges them when their content keys turn out equal.

The plan is two arrays of request positions, eight bytes a request, so a million-row job
plans in a few megabytes. It is pure: it sees ids, sources and prompts, never pixels.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass

from mmbatch.types import ClipSpan, FrameAt, Request, TimeSpan


@dataclass(frozen=True)
class Plan:
    """Request positions in planned order; group ``g`` is ``order[starts[g]:starts[g + 1]]``."""

    order: array[int]
    starts: array[int]

    def __len__(self) -> int:
        return len(self.starts) - 1

    def group(self, g: int) -> array[int]:
        return self.order[self.starts[g] : self.starts[g + 1]]

    def groups(self) -> Iterator[array[int]]:
        return (self.group(g) for g in range(len(self)))


def plan(requests: Sequence[Request]) -> Plan:
    """Group ``requests`` by source identity; groups in order of first appearance, members
    by place in the source, system prompt and prompt (ties keep input order)."""
    group_ids: dict[Hashable, int] = {}
    group_of = array("L")
    for position, request in enumerate(requests):
        identity = source_identity(request, position)
        group_of.append(group_ids.setdefault(identity, len(group_ids)))

    def rank(i: int) -> tuple[int, float, str, str, int]:
        request = requests[i]
        return (group_of[i], place(request), request.system or "", request.prompt, i)

    order = array("L", sorted(range(len(requests)), key=rank))
    starts = array("L", [0])
    for n in range(1, len(order)):
        if group_of[order[n]] != group_of[order[n - 1]]:
            starts.append(n)
    if order:
        starts.append(len(order))
    return Plan(order, starts)


def source_identity(request: Request, position: int) -> Hashable:
    """What a request reads: the sources of its media, or its own position when any of them
    is already in memory (such bytes are identified only once hashed). Text-only requests
    share one identity, and so one group, sorted by prompt for the prefix cache."""
    if any(ref.data is not None or ref.image is not None for ref in request.media):
        return ("memory", position)
    return tuple(ref.source for ref in request.media)


def place(request: Request) -> float:
    """Where in its source a request looks: a frame's time, a window's or a clip's start,
    else 0."""
    part = request.media[0].part if request.media else None
    if isinstance(part, FrameAt):
        return part.pts
    if isinstance(part, (TimeSpan, ClipSpan)):
        return part.start
    return 0.0

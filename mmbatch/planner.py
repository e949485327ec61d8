"""Order requests so vLLM's caches hit: pure, and blind to pixels.

vLLM's encoder-output cache and prefix cache only help when requests that share an image
(and the text before it) reach the engine close together. Users rarely write them that way:
a loop over tasks emits every image for prompt 1, then every image for prompt 2. The planner
groups requests by their media keys, and within a group by system prompt and prompt, so
that the rendered prompts' longest common prefix (template, system, image tokens) is shared
by neighbours. Groups keep the order in which their media first appeared, which keeps output
roughly in input order and makes the plan deterministic.

It imports nothing heavy: it sees ids and keys, never pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mmbatch.types import LoadedRequest


@dataclass(frozen=True)
class Group:
    """Requests that share their media (and hence their cacheable prompt prefix)."""

    media_keys: tuple[str, ...]
    request_ids: tuple[str, ...]


def plan(requests: Sequence[LoadedRequest]) -> list[Group]:
    """Group ``requests`` by media, order groups by first appearance, members by prefix."""
    members: dict[tuple[str, ...], list[LoadedRequest]] = {}
    for loaded in requests:
        members.setdefault(loaded.media_keys, []).append(loaded)
    groups = []
    for media_keys, group in members.items():
        # sorted() is stable, so requests with identical prompts keep their input order.
        group = sorted(group, key=lambda r: (r.request.system or "", r.request.prompt))
        groups.append(Group(media_keys, tuple(r.id for r in group)))
    return groups


def ordered(requests: Sequence[LoadedRequest]) -> list[LoadedRequest]:
    """``requests`` in planned order: the flattening of ``plan``."""
    by_id = {r.id: r for r in requests}
    if len(by_id) != len(requests):
        raise ValueError("request ids must be unique within a window")
    return [by_id[request_id] for group in plan(requests) for request_id in group.request_ids]

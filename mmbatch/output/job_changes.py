"""What differs between the job that wrote an output and the job asked to add to it, said
in the user's words: one table from the job record's fields (``mmbatch.jobs.fingerprint``)
to what the user set, so that a refused rerun reads "--max-tokens 64 -> 128" or "the
prompt changed", never the record's own field names and digests.

It also decides what is compared: a local model is the same model whatever its path is
spelled as (``.tiny``, ``/work/.tiny``, a link to it): its content (``model_content``, a
digest of its files) is what counts, and its spelling is only what the message names it by.
A hub name is its name (and revision).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MOST_SAID = 3
"""Changes named at most; more are counted ("and 2 more settings")."""
SHOWN_CHARS = 40
"""A value longer than this is said to have changed, not quoted."""

_SAID_AS = {
    "command": "the command",
    "model": "the model",
    "prompt": "the prompt",
    "system": "the system prompt",
    "questions": "the recipe's questions",
    "media": "the recipe's [media] table",
    "output": "the recipe's [output] table",
    "keep_columns": "--keep-columns",
    "as_clip": "--as-clip",
    "clips": "how videos are cut into clips",
    "task": "the DatasetMap's settings",
    "data": "the dataset",
    "batch_invariant": "--batch-invariant",
    "max_tokens": "--max-tokens",
}
"""A job record's top-level field -> what the user knows it as."""
_OPTIONS = {"image_options": "picture", "video_options": "video", "audio_options": "audio"}
"""Decode-option tables -> the media they decode."""
_TEXTS = {"prompt", "system", "questions", "task", "data", "json_schema"}
"""Fields said to have changed, without their values (long texts, digests)."""


def comparable(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """``fingerprint`` as two runs are compared: a local model by its content alone (its
    path's spelling dropped), as JSON reads it back (a tuple is a list)."""
    compared = json.loads(json.dumps(dict(fingerprint), default=str))
    if str(compared.get("model_content", "")).startswith("dir:"):
        compared.pop("model", None)
    return dict(compared)


def differences(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """What changed from the job record ``before`` to the job ``after``, in the user's words,
    at most ``MOST_SAID`` lines' worth (empty: the same job)."""
    old, new = comparable(before), comparable(after)
    said = []
    if old.get("model_content") != new.get("model_content") or old.get("model") != new.get("model"):
        said.append(_model_change(before, after))
    for name, was, now in _leaves(old, new):
        if name.split(".")[0] not in ("model", "model_content"):
            said.append(_said(name, was, now))
    if len(said) > MOST_SAID:
        more = len(said) - MOST_SAID + 1
        said = [*said[: MOST_SAID - 1], f"and {more} more settings"]
    return said


def _model_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    was, now = before.get("model"), after.get("model")
    if was == now or was is None:
        return f"the model's files changed ({now})"
    return f"the model changed: {was} -> {now or 'no model'}"


def _said(name: str, was: Any, now: Any) -> str:
    table, _, leaf = name.partition(".")
    if table == "sampling" and leaf:
        what = "--" + leaf.split(".")[0].replace("_", "-")
        if leaf.startswith("json_schema"):
            what = "the JSON schema"
    elif table in _OPTIONS and leaf:
        what = f"the {_OPTIONS[table]} decode option {leaf}"
    else:
        what = _SAID_AS.get(table, name)
    if table in _TEXTS or leaf in _TEXTS or not (_short(was) and _short(now)):
        return f"{what} changed"
    return f"{what} {_value(was)} -> {_value(now)}"


def _short(value: Any) -> bool:
    return len(_value(value)) <= SHOWN_CHARS


def _value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _leaves(before: Any, after: Any, name: str = "") -> list[tuple[str, Any, Any]]:
    """The settings that differ between two fingerprints, each named by its path
    (``video_options.fps``) with its two values: the leaves that changed, not the whole
    tables that hold them. A setting one side does not record reads as ``None``."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        changes = []
        for key in sorted(before.keys() | after.keys()):
            path = f"{name}.{key}" if name else str(key)
            changes += _leaves(before.get(key), after.get(key), path)
        return changes
    return [] if before == after else [(name, before, after)]

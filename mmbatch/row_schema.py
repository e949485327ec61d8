"""The columns mmbatch's own rows may hold, declared once: what each is called, how its
values are typed and what it means.

A leaf (it imports nothing of mmbatch's but ``types``, whose ``Usage`` names the token
columns), so that whatever needs to know the columns asks here, at any floor: the row
shapes that write them (``mmbatch.output.rows``), the columnar writers, which type a column
that is null in every row by it (``mmbatch.output.tables``), a source that keeps an input
column of one of these names as ``input_NAME`` (``mmbatch.sources.files``), the review
gallery, which lists every other field under "more", and ``DatasetMap``, which names its
usage columns by it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from mmbatch.types import Usage

ColumnType = Literal["string", "integer", "float", "error", "value"]
"""How a column's values are typed where they are not null: text, a whole number, a number,
an ``ItemError`` as ``{stage, kind, message}``, or any JSON value (left to the writer)."""


@dataclass(frozen=True)
class Column:
    """One column of mmbatch's rows: its name, the type of its values, and what it holds."""

    name: str
    type: ColumnType
    meaning: str


TOKEN_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Usage))
"""The token counts of a row (and of a recipe's answer), named as ``Usage`` names them."""

FLAT_COLUMNS: tuple[Column, ...] = (
    Column("id", "string", "the item: what resume skips and the output is keyed by"),
    Column("source", "string", "the media the item points at (a list for several)"),
    Column("media_hash", "string", "the content key of the item's media (a list for several)"),
    Column("prompt", "string", "what was asked"),
    Column("text", "string", "the answer (a list of n with Sampling.n > 1); null on error"),
    Column("finish_reason", "string", "why the text ended (stop, length)"),
    *(Column(name, "integer", "tokens, as the engine counted them") for name in TOKEN_COLUMNS),
    Column("error", "error", "null, or why the item has no answer: stage, kind and message"),
)
"""The columns of a flat row (``mmbatch caption``), in the order it writes them."""

RECIPE_COLUMNS: tuple[Column, ...] = (
    Column("outputs", "value", "a recipe item's answers by name, each with its own fields"),
    Column("parsed", "value", "an answer's text read as its format's value (JSON)"),
)
"""What a recipe's rows hold besides: their answers, and an answer's parsed value."""

MEDIA_COLUMNS: tuple[Column, ...] = (
    Column("video", "string", "the video a frame or clip comes from"),
    Column("frame_index", "integer", "a frame's place in the video, in presentation order"),
    Column("pts", "float", "a frame's time in the video, in seconds"),
    Column("frame_path", "string", "the file a frame was written to"),
    Column("start", "float", "where a clip or an audio window begins, in seconds"),
    Column("end", "float", "where a clip or an audio window ends, in seconds"),
    Column(
        "warning",
        "string",
        "why the video holds less than its header declares (cut short, damaged)",
    ),
)
"""What rows of a part of a video or a recording say about where that part is."""

COLUMNS: tuple[Column, ...] = FLAT_COLUMNS + RECIPE_COLUMNS + MEDIA_COLUMNS
"""Every column mmbatch's own rows may hold, each named once."""
COLUMN_NAMES = frozenset(column.name for column in COLUMNS)

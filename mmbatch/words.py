"""How counts are said: ``counted(1, "item")`` is "1 item", ``counted(2, "item")`` "2 items".
Every line that prints a count of things says it through ``counted``, so that no line reads
"1 items"."""

from __future__ import annotations


def counted(count: int, one: str, many: str | None = None) -> str:
    """``count`` and the noun, singular for exactly one: ``one``; else ``many`` (by default
    ``one`` with an ``s``)."""
    return f"{count} {one if count == 1 else (many or one + 's')}"


def agreeing(count: int, one: str, many: str) -> str:
    """Of ``one`` and ``many``, the word that agrees with ``count``, said without it: the
    verb or pronoun after a ``counted`` noun ("1 row is", "2 rows are")."""
    return one if count == 1 else many


_SINGULAR = {"files": "file", "folders": "folder", "videos": "video", "them": "it"}


def counted_phrase(count: int, phrase: str) -> str:
    """``count`` and ``phrase``, a plural phrase (``hidden folders (not walked)``), with its
    plural words made singular for exactly one: "1 hidden folder (not walked)"."""
    if count != 1:
        return f"{count} {phrase}"
    words = [_SINGULAR.get(word, word) for word in phrase.split(" ")]
    return f"{count} {' '.join(words)}"

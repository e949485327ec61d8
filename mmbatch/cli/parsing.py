"""The command line's parser: argparse, with a mistake said the way every other mistake is.

One line, ``mmbatch: error: ...``, exit code 2, pointing at the ``--help`` of the command the
mistake was made in (``mmbatch caption --help``, not the top level's). A flag is taken only
as spelled in full (``--max-token`` is not ``--max-tokens``: a prefix that happens to match
today may match two flags tomorrow); a misspelt flag, command or choice gets the nearest
ones the parser knows ("did you mean --max-tokens?").
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from mmbatch.cli.options import EXIT_JOB_FAILED


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` without prefix matching, with one-line errors that
    suggest what was meant. Every command's parser is one (``parser_class``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_JOB_FAILED, f"mmbatch: error: {message} (see {self.prog} --help)\n")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """As argparse's, with arguments no parser took said by the command that was given
        them, with the flags it has that come nearest."""
        parsed, extras = self.parse_known_args(args, namespace)
        command = self._command_parser(parsed)
        if extras:
            (command or self).unrecognized(extras)
        if command is not None:
            command.check_parsed(parsed)
        return parsed

    def unrecognized(self, extras: Sequence[str]) -> NoReturn:
        flags = [a.split("=", 1)[0] for a in extras if a.startswith("-") and not _number(a)]
        hint = suggestion(flags, self._option_string_actions)
        self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")

    def check_parsed(self, parsed: argparse.Namespace) -> None:
        """What argparse cannot say by itself: a job command's ``--out`` is needed, except by
        a dry run (a command without ``--dry-run``, such as ``bench``, has its own default)."""
        if hasattr(parsed, "dry_run") and getattr(parsed, "out", "") is None and not parsed.dry_run:
            self.error("the following arguments are required: --out (or --dry-run)")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's own check of a choice (a command's name, --out-format's value), with
        # the nearest choices named.
        choices = action.choices
        if choices is None or value in choices:
            return
        shown = ", ".join(map(repr, choices))
        hint = suggestion([str(value)], map(str, choices), quoted=True)
        raise argparse.ArgumentError(
            action, f"invalid choice: {value!r} (choose from {shown}){hint}"
        )

    def _command_parser(self, parsed: argparse.Namespace) -> Parser | None:
        """The parser of the command ``parsed`` holds (None: this parser has no commands)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                found = action.choices.get(getattr(parsed, action.dest, None) or "")
                return found if isinstance(found, Parser) else None
        return None


def suggestion(given: Sequence[str], known: Iterable[str], quoted: bool = False) -> str:
    """``"; did you mean --max-tokens?"`` for the first of ``given`` near one of ``known``
    (difflib's ratio), else ``""``."""
    # Compared without their dashes, which every flag shares: --colour is not near --out.
    by_word = {name.lstrip("-"): name for name in known}
    for word in given:
        near = difflib.get_close_matches(word.lstrip("-"), list(by_word), n=1, cutoff=0.6)
        if near:
            name = by_word[near[0]]
            return f"; did you mean {name!r}?" if quoted else f"; did you mean {name}?"
    return ""


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True

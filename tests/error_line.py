"""The one error line a command prints for a configuration mistake."""

from __future__ import annotations

import pytest


def one_error(capsys: pytest.CaptureFixture[str]) -> str:
    """The command's one error line (and nothing else on stderr but its own notes)."""
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if line.startswith("mmbatch: error: ")]
    assert len(errors) == 1, lines
    assert lines[-1] == errors[0], lines
    assert all(line.startswith("mmbatch: ") for line in lines), lines  # no traceback
    return errors[0].removeprefix("mmbatch: error: ")

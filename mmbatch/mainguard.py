"""A script that starts mmbatch's processes from its top level, said at once.

mmbatch starts its engine processes (one per GPU) and its decode workers with ``spawn``: a
fresh interpreter that imports the script that started it, running its top-level code
again. Code under ``if __name__ == "__main__":`` does not run there; code outside it runs
in every child, which then starts processes of its own. Python refuses that, in the child,
with a traceback in the middle of the engine's start-up log; the parent only sees its
engine process die, restarts it, and gives up a minute and a half later, never having said
why. So before starting any, mmbatch looks at the stack: a call made from the script's
top level, outside the guard, is a ``ConfigError`` naming the line and the fix.
"""

from __future__ import annotations

import ast
import sys
from functools import lru_cache
from types import FrameType

from mmbatch.errors import ConfigError


def check_main_guard() -> None:
    """``ConfigError`` if this call comes from the top-level code of the script being run
    (``python script.py``, ``python -m module``) outside ``if __name__ == "__main__":``,
    which every process started with spawn would run again. Calls from a notebook, from
    ``python -c`` and from under the guard pass: nothing re-runs them."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str):
        return
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and not (
        frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"
    ):
        frame = frame.f_back
    guarded = _guarded_lines(path)
    if frame is None or guarded is None or frame.f_lineno in guarded:
        return
    raise ConfigError(
        f"{path}, line {frame.f_lineno}, starts mmbatch's processes from the script's top "
        "level, which each process started with spawn runs again: put the script's work "
        'under `if __name__ == "__main__":`'
    )


@lru_cache(maxsize=8)
def _guarded_lines(path: str) -> frozenset[int] | None:
    """The lines of ``path`` inside an ``if __name__ == "__main__":`` block; None when the
    file cannot be read or parsed (better no word than a wrong one)."""
    try:
        with open(path, encoding="utf-8") as file:
            tree = ast.parse(file.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.body:
            end = node.body[-1].end_lineno or node.body[-1].lineno
            lines.update(range(node.body[0].lineno, end + 1))
    return frozenset(lines)


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"``, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    if not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    texts = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and texts == ["__main__"]

"""Size budgets, kept as the layer rules are (``test_layers.py``): each written down once,
each breach named by where it is.

* **A function is at most 60 lines**: from its ``def`` line to the last line of its body,
  everything between included (docstring, comments, blank lines); its decorators are not
  counted. A function defined inside another counts within it, and on its own.
* **A signature takes at most 8 parameters**: every parameter a caller can pass counts
  (positional-only, positional, keyword-only; ``*args`` and ``**kwargs`` one each: they are
  ways in too), except a method's own ``self`` or ``cls``. More options than that are
  grouped into a value (a small frozen dataclass) that names what they have in common.
  A dataclass's fields are not a written signature, so they are outside this rule.

``OVER_BUDGET`` names the functions allowed over a budget for now, each with the reason; an
allowance that is no longer needed fails its own test, so it is dropped when its function is
mended.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from repo_paths import PACKAGE

MOST_LINES = 60
MOST_PARAMETERS = 8

OVER_BUDGET: dict[str, str] = {}
"""``module:qualified name`` -> the budget it is allowed over (``lines`` or ``parameters``)."""


class Function(NamedTuple):
    """One function or method of the package, measured."""

    name: str
    """``module:Qualified.name``, the module's path inside the package."""
    lines: int
    parameters: int


def functions(package: Path) -> Iterator[Function]:
    """Every function and method written in ``package``, measured by the rules above."""
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        yield from _measured(ast.parse(path.read_text()), f"{module}:", in_class=False)


def _measured(node: ast.AST, prefix: str, in_class: bool) -> Iterator[Function]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            yield from _measured(child, f"{prefix}{child.name}.", in_class=True)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{child.name}"
            assert child.end_lineno is not None
            yield Function(name, child.end_lineno - child.lineno + 1, _parameters(child, in_class))
            yield from _measured(child, f"{name}.", in_class=False)
        else:
            yield from _measured(child, prefix, in_class)


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> int:
    args = function.args
    named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    static = any(
        isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list
    )
    if method and not static and named and named[0].arg in ("self", "cls"):
        named = named[1:]
    return len(named) + (args.vararg is not None) + (args.kwarg is not None)


def over(budget: str) -> list[str]:
    """The functions over ``budget`` that ``OVER_BUDGET`` does not allow, with their size."""
    found = []
    for function in functions(PACKAGE):
        size = function.lines if budget == "lines" else function.parameters
        most = MOST_LINES if budget == "lines" else MOST_PARAMETERS
        if size > most and OVER_BUDGET.get(function.name) != budget:
            found.append(f"mmbatch/{function.name}: {size} {budget}")
    return found


def test_no_function_is_over_60_lines() -> None:
    assert over("lines") == []


def test_no_signature_takes_over_8_parameters() -> None:
    assert over("parameters") == []


def test_each_allowance_is_still_needed() -> None:
    """An allowance for a function that is back within its budget (or gone) is dropped."""
    measured = {function.name: function for function in functions(PACKAGE)}
    for name, budget in OVER_BUDGET.items():
        assert name in measured, f"mmbatch/{name} is gone: drop its allowance"
        size = measured[name].lines if budget == "lines" else measured[name].parameters
        assert size > (MOST_LINES if budget == "lines" else MOST_PARAMETERS), name


def test_the_walk_measures_as_the_rules_say(tmp_path: Path) -> None:
    """Decorators are left out of a function's lines, its docstring and a nested function
    counted in; ``self`` and ``cls`` are not parameters, ``*args`` and ``**kwargs`` are, a
    static method's first parameter too."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text(
        "import functools\n"
        "@functools.cache\n"
        "def f(a, /, b, *args, c, **kwargs):\n"
        '    """Doc."""\n'
        "    def g(x):\n"
        "        return x\n"
        "\n"
        "    return g\n"
        "class C:\n"
        "    def m(self, a): ...\n"
        "    @classmethod\n"
        "    def k(cls): ...\n"
        "    @staticmethod\n"
        "    def s(self, a): ...\n"
        "    async def w(self, *, a, b): ...\n"
    )
    assert sorted(functions(package)) == [
        Function("a.py:C.k", 1, 0),
        Function("a.py:C.m", 1, 1),
        Function("a.py:C.s", 1, 2),
        Function("a.py:C.w", 1, 2),
        Function("a.py:f", 6, 5),
        Function("a.py:f.g", 2, 1),
    ]

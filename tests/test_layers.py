"""The layout keeps its promises, each written down as a pair: which part of mmbatch may
import which. A part is a top-level module or package (``sources``, ``engine``, ``jobs``);
``MAY_IMPORT`` lists, for each, the parts it may import, and every pair it does not list is
forbidden (``FORBIDDEN``). Each forbidden pair is a test of its own, named as the rule reads
(``sources may not import engine``, ``recipe may not import jobs``), so an import the design
forbids fails by name; ``NARROWED`` lets through the few single imports a forbidden pair
allows all the same.
Besides the pairs: no circle of imports among mmbatch's modules, only the vLLM adapter imports
vllm, only the Ray integration imports ray.

Every import counts, including those inside functions and under ``TYPE_CHECKING``: a lazy
import that reaches up is still a dependency that reaches up, and a lazy import that closes a
circle is still a circle.
"""

from __future__ import annotations

import ast
import itertools
from functools import cache
from pathlib import Path
from typing import NamedTuple

import pytest
from repo_paths import PACKAGE

BASE = frozenset(
    {"types", "errors", "jsonl", "planner", "lifetime", "validation", "mainguard", "clock"}
    | {"words"}
    | {"row_schema", "storage"}
)
"""The leaves every stage uses: the values that flow, the exception tree, JSON lines, the
whole-job plan, helper processes' lifetime, validation messages, the main-guard check, the
process's clock, how counts are said, the columns of mmbatch's rows, and object storage (URLs
and the file systems behind them)."""

MAY_IMPORT: dict[str, frozenset[str]] = {
    "types": frozenset(),
    "errors": frozenset({"types"}),
    "jsonl": frozenset({"types", "errors"}),
    "planner": frozenset({"types", "errors"}),
    "lifetime": frozenset({"types", "errors"}),
    "validation": frozenset({"types", "errors"}),
    "mainguard": frozenset({"types", "errors"}),
    "clock": frozenset(),
    "words": frozenset(),
    # The row schema is a leaf, so that every floor may name the columns it reads or writes.
    "row_schema": frozenset({"types"}),
    # Sources and outputs ask it for every URL; it knows nothing of what they hold (a
    # located input reads its JSON lines as a local file's are read, ``jsonl``).
    "storage": frozenset({"types", "errors", "jsonl"}),
    # Stages: reading media and writing rows know nothing of each other, of where requests
    # come from, or of the engine.
    "media": BASE,
    "output": BASE,
    # Turning inputs into requests and running an engine are two sides that never meet: a
    # source reads no engine setting, an engine lists no input. Neither writes rows: what
    # they know of rows is the row schema's (a leaf), so output is a floor above them.
    "sources": BASE | {"media"},
    "engine": BASE | {"media"},
    # One file format both ways (the reader's requests, the writer's rows), above both.
    "openai_batch": BASE | {"output", "sources"},
    # Which requests are one question (``mmbatch.repeats``): the pipeline's to ask.
    "repeats": frozenset({"types", "errors"}),
    "pipeline": BASE | {"media", "output", "engine", "repeats"},
    # The runner takes requests made elsewhere: it lists no input and reads no recipe.
    "jobs": BASE | {"media", "output", "engine", "pipeline"},
    # A recipe makes requests and engine settings; it does not know the runner.
    "recipe": BASE | {"media", "output", "sources", "engine"},
    "notebook": BASE | {"media", "output", "sources", "engine", "pipeline", "jobs"},
    "review": BASE | {"media", "output", "sources", "openai_batch"},
    # Integrations take their rows from a dataset, not from listing inputs (see NARROWED).
    "integrations": BASE | {"media", "output", "engine", "pipeline", "jobs", "recipe"},
    # Tooling, apart from the runtime: nothing above imports it but the faces that run it.
    # Tiny models are model directories written from nothing of mmbatch's but its errors.
    "tiny_models": frozenset({"errors"}),
    "bench": BASE | {"media", "output", "sources", "engine", "pipeline", "jobs", "integrations"},
    # Faces.
    "cli": BASE
    | {"media", "output", "sources", "engine", "pipeline", "jobs", "recipe", "notebook"}
    | {"review", "integrations", "tiny_models", "bench", "mmbatch", "openai_batch"},
    "mmbatch": BASE
    | {"media", "output", "sources", "engine", "pipeline", "jobs", "recipe", "notebook"}
    | {"review", "integrations"},
    "__main__": frozenset({"cli"}),
}
"""Each part, and the parts it may import. ``mmbatch`` is the public API
(``mmbatch/__init__.py``), ``__main__`` is ``python -m mmbatch``."""

NARROWED: dict[tuple[str, str], frozenset[tuple[str, str]]] = {
    ("integrations", "sources"): frozenset(
        {
            ("integrations/hf_datasets.py", "mmbatch.sources.cells"),
            ("integrations/hf_datasets.py", "mmbatch.sources.paths"),
            ("integrations/dataset_origin.py", "mmbatch.sources.paths"),
            ("integrations/dataset_tables.py", "mmbatch.sources.cells"),
        }
    ),
}
"""Forbidden pairs with the imports allowed all the same, one module to one module:
a ``DatasetMap`` turns each dataset cell into a media reference (``sources/cells.py``), under
the rule on where paths may lead (``sources/paths.py``), as a manifest row's path is."""

ONLY_HERE = {
    "vllm": {
        "engine/vllm.py",
        "engine/vllm_settings.py",
        "engine/vllm_counts.py",
        "openai_batch/vllm_protocol.py",
        "bench/worker.py",
        "bench/naive_job.py",
        "bench/datasets_naive.py",
        "bench/frames_naive.py",
    },
    "ray": {
        "integrations/ray_data.py",
        "integrations/ray_replica.py",
        "bench/ray_data_llm_job.py",
    },
}
"""Third-party packages that only these modules may import. Besides the engine adapter and
its settings (``engine/vllm_settings.py``: what an engine starts with, checked as vLLM reads
it before any engine starts), vllm is imported by ``engine/vllm_counts.py`` (the pre-flight
budget's token counts come from vLLM's per-model processing info, read in a module of their
own beside the adapter) and by
``openai_batch/vllm_protocol.py``, for vLLM's pydantic models of OpenAI chat completions alone
(no engine): they describe the OpenAI batch format, whose reader and writer both need them,
and the module finds them wherever the installed vLLM keeps them. The benchmark's naive
sides, a worker's and a whole job's, are what a user writes with vLLM directly, so they import
vllm too; its Ray Data LLM side is what a user writes with Ray Data LLM, so it imports ray."""


def module_names(package: Path) -> dict[str, Path]:
    """Every module of ``package`` by dotted name (a package by its own name)."""
    names = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, with its line: ``import a.b`` names ``a.b``, and
    ``from a import b`` names ``a.b`` too (callers keep the longest name that is a module)."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            assert node.level == 0, f"{path}:{node.lineno}: use absolute imports"
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def graph(package: Path) -> dict[str, dict[str, int]]:
    """Module -> the modules of ``package`` it imports, each with the line of its first
    import."""
    names = module_names(package)

    def resolve(name: str) -> str | None:
        while name and name not in names:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, dict[str, int]] = {}
    for module, path in names.items():
        edges[module] = {}
        for line, name in imports(path):
            target = resolve(name)
            if target is not None and target != module:
                edges[module][target] = min(line, edges[module].get(target, line))
    return edges


def part_of(module: str) -> str:
    """``mmbatch.sources.files`` -> ``sources``; the public API ``mmbatch`` -> ``mmbatch``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


class Import(NamedTuple):
    """One import of one part by another: where it is, and the module it names."""

    module: str
    """The importing module's path inside the package (``sources/files.py``)."""
    line: int
    target: str

    def __str__(self) -> str:
        return f"mmbatch/{self.module}:{self.line} imports {self.target}"


@cache
def arrows() -> dict[tuple[str, str], list[Import]]:
    """(importing part, imported part) -> each import that draws that arrow."""
    found: dict[tuple[str, str], list[Import]] = {}
    names = module_names(PACKAGE)
    for module, targets in graph(PACKAGE).items():
        rel = names[module].relative_to(PACKAGE).as_posix()
        for target, line in targets.items():
            pair = (part_of(module), part_of(target))
            if pair[0] != pair[1]:
                found.setdefault(pair, []).append(Import(rel, line, target))
    return found


FORBIDDEN = [
    (importer, imported)
    for importer, imported in itertools.permutations(MAY_IMPORT, 2)
    if imported not in MAY_IMPORT[importer]
]
"""Every pair ``MAY_IMPORT`` does not allow."""


def rule(pair: tuple[str, str]) -> str:
    return f"{pair[0]} may not import {pair[1]}"


def test_every_part_has_its_rules() -> None:
    parts = {part_of(module) for module in module_names(PACKAGE)}
    assert parts == set(MAY_IMPORT)
    for importer, allowed in MAY_IMPORT.items():
        assert allowed <= set(MAY_IMPORT) - {importer}, importer


@pytest.mark.parametrize("pair", FORBIDDEN, ids=rule)
def test_each_forbidden_pair(pair: tuple[str, str]) -> None:
    allowed = NARROWED.get(pair, frozenset())
    breaking = [str(i) for i in arrows().get(pair, []) if (i.module, i.target) not in allowed]
    assert breaking == [], rule(pair)


def test_each_narrowed_allowance_is_still_used() -> None:
    """An allowance that nothing uses any more is a hole left open: drop it."""
    for pair, allowed in NARROWED.items():
        assert allowed <= {(i.module, i.target) for i in arrows().get(pair, [])}, rule(pair)


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One circle of imports through each group of modules that reach each other."""
    reach: dict[str, set[str]] = {}
    for start in edges:
        seen: set[str] = set()
        todo = list(edges[start])
        while todo:
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo += edges.get(module, {})
        reach[start] = seen
    found, placed = [], set()
    for start in sorted(edges):
        if start in placed or start not in reach[start]:
            continue
        group = {m for m in reach[start] if start in reach[m]}
        placed |= group
        found.append(_circle(start, group, edges))
    return found


def _circle(start: str, group: set[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """A shortest path from ``start`` back to itself within ``group``."""
    paths = {start: [start]}
    todo = [start]
    while todo:
        module = todo.pop(0)
        for target in sorted(edges[module]):
            if target == start:
                return [*paths[module], start]
            if target in group and target not in paths:
                paths[target] = [*paths[module], target]
                todo.append(target)
    raise AssertionError(f"{start} is in no circle")


def test_no_circle_of_imports() -> None:
    assert [" -> ".join(circle) for circle in cycles(graph(PACKAGE))] == []


def test_vllm_and_ray_are_imported_in_one_place_each() -> None:
    strays = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        for line, name in imports(path):
            top = name.split(".")[0]
            if top in ONLY_HERE and rel not in ONLY_HERE[top]:
                strays.append(f"mmbatch/{rel}:{line} imports {name}")
    assert strays == []


def test_the_walk_sees_lazy_and_type_checking_imports_and_circles(tmp_path: Path) -> None:
    """The walk reads what a planted violation would look like: an import under
    ``TYPE_CHECKING``, one inside a function, ``from package import module``, and a circle
    that only a lazy import closes."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.sub.c import C\n"
        "def f():\n    from pkg import b\n"
    )
    (package / "b.py").write_text("import pkg.sub\n")
    (package / "sub" / "c.py").write_text("def g():\n    import pkg.b\n")
    (package / "sub" / "d.py").write_text("from pkg.sub import c\n")
    edges = graph(package)
    assert edges["pkg.a"] == {"pkg.sub.c": 3, "pkg.b": 5}
    assert edges["pkg.b"] == {"pkg.sub": 1}
    assert edges["pkg.sub.d"] == {"pkg.sub.c": 1}
    assert cycles(edges) == []
    (package / "b.py").write_text("def h():\n    from pkg.a import f\n")
    assert cycles(graph(package)) == [["pkg.a", "pkg.b", "pkg.a"]]
    (package / "b.py").write_text("from pkg.sub.c import g\n")
    assert cycles(graph(package)) == [["pkg.b", "pkg.sub.c", "pkg.b"]]


STORAGE_URL_ASKED_ONLY_IN = ("storage/", "sources/paths.py", "output/target.py")
"""Where "local or in a store?" may be asked of a text: the storage package, the path rule
(its roots and named paths are either), and the output's target. Everywhere else a named
input is a located value (``mmbatch.storage.located``) and an output has a target
(``mmbatch.output.target``), and each step asks the value, not the text."""


def storage_url_uses(package: Path) -> list[str]:
    """Every import or call of ``is_storage_url`` outside ``STORAGE_URL_ASKED_ONLY_IN``."""
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package).as_posix()
        if where.startswith(STORAGE_URL_ASKED_ONLY_IN):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            named = ([a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []) + (
                [node.id] if isinstance(node, ast.Name) else []
            )
            named += [node.attr] if isinstance(node, ast.Attribute) else []
            if "is_storage_url" in named:
                found.append(f"{where}:{node.lineno}")
    return sorted(set(found))


def test_where_the_bytes_live_is_asked_once() -> None:
    uses = storage_url_uses(PACKAGE)
    assert not uses, (
        "is_storage_url asked outside the storage package, the path rule and the output's "
        "target (locate the input once: mmbatch.storage.located; an output has a target: "
        f"mmbatch.output.target): {', '.join(uses)}"
    )

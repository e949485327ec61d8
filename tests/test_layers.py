"""The layout keeps its promises: each layer imports only layers below it (or itself), only
the vLLM adapter imports vllm, only the Ray integration imports ray.

Every import counts, including those inside functions and under ``TYPE_CHECKING``: a lazy
import that reaches up is still a dependency that reaches up.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "mmbatch"

LAYERS = [
    {"types", "errors", "jsonl", "planner", "lifetime", "validation", "mainguard"},
    {"media"},
    {"out"},
    {"sources", "engine"},
    {"pipeline"},
    {"jobs"},
    {"recipe", "notebook"},
    {"review", "integrations"},
    {"testing", "bench"},
    {"cli"},
]
"""From the bottom up. ``mmbatch/__init__.py`` (the public API) and ``__main__`` sit apart."""

ONLY_HERE = {
    "vllm": {
        "engine/vllm.py",
        "engine/vllm_counts.py",
        "out/vllm_protocol.py",
        "bench/worker.py",
        "bench/naive_job.py",
    },
    "ray": {"integrations/ray_data.py"},
}
"""Third-party packages that only these modules may import. Besides the engine adapter, vllm
is imported by ``engine/vllm_counts.py`` (the pre-flight budget's token counts come from
vLLM's per-model processing info, read in a module of their own beside the adapter) and by
``out/vllm_protocol.py``, for vLLM's pydantic models of OpenAI chat completions alone (no
engine): they describe the OpenAI batch format, whose reader (``sources``) and writer
(``out``, a layer below the engine) both need them, and the module finds them wherever the
installed vLLM keeps them. The benchmark's naive sides, a worker's and a whole job's, are
what a user writes with vLLM directly, so they import vllm too."""


def layer_of(name: str) -> int | None:
    """The layer of ``mmbatch.<name>...`` (its first component), or None outside the layers."""
    first = name.split(".")[0]
    return next((i for i, layer in enumerate(LAYERS) if first in layer), None)


def imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, with its line: absolute names, relative ones resolved."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            assert node.level == 0, f"{path}:{node.lineno}: use absolute imports"
            found.append((node.lineno, node.module))
    return found


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))


def test_every_module_is_in_a_layer() -> None:
    for path in modules():
        rel = path.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".")
        assert layer_of(rel) is not None, f"mmbatch/{path.relative_to(PACKAGE)} is in no layer"


def test_no_module_imports_a_layer_above_it() -> None:
    upward = []
    for path in modules():
        rel = path.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".")
        own = layer_of(rel)
        assert own is not None
        for line, name in imports(path):
            if not name.startswith("mmbatch."):
                continue
            target = layer_of(name.removeprefix("mmbatch."))
            if target is not None and target > own:
                upward.append(f"mmbatch/{path.relative_to(PACKAGE)}:{line} imports {name}")
    assert upward == []


def test_vllm_and_ray_are_imported_in_one_place_each() -> None:
    strays = []
    for path in modules():
        rel = path.relative_to(PACKAGE).as_posix()
        for line, name in imports(path):
            top = name.split(".")[0]
            if top in ONLY_HERE and rel not in ONLY_HERE[top]:
                strays.append(f"mmbatch/{rel}:{line} imports {name}")
    assert strays == []


def test_the_layer_walk_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from mmbatch.jobs import Job\n"
        "def f():\n    import mmbatch.cli.options\n"
    )
    names = [name for _, name in imports(module)]
    assert "mmbatch.jobs" in names
    assert "mmbatch.cli.options" in names

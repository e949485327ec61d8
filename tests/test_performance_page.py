"""The performance page is a reference: each table of figures has one line saying where they
come from (date, commit, vLLM version, machine) and names its reports, which exist in
``benchmarks/results/``; the code gives a default's reason and links to the page's section
rather than repeating its figures, and those links lead to a section that exists."""

from __future__ import annotations

import json
import re

from repo_paths import MANUAL, PACKAGE, REPO
from test_docs import anchors

PAGE = MANUAL / "performance.md"
RESULTS = REPO / "benchmarks" / "results"
REPORT = re.compile(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.json")
PROVENANCE = re.compile(
    r"^Measured: \d{4}-\d{2}-\d{2}, commits? [0-9a-f]{7}\b.*\bvLLM\b.*\b(H100|H200|CPU|VM)\b"
)
FIGURE = re.compile(r"\d[\d.,]* (images|frames)/s|\d\.\d+x (naive|of vLLM)")


def sections() -> dict[str, str]:
    """Each heading of the page, with the text up to the next heading."""
    parts = re.split(r"^(#+ .+)$", PAGE.read_text(), flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_each_table_of_figures_has_one_provenance_line_and_its_reports() -> None:
    with_tables = {h: body for h, body in sections().items() if "\n| --- |" in body}
    assert len(with_tables) >= 15
    for heading, body in with_tables.items():
        measured = [line for line in body.splitlines() if line.startswith("Measured:")]
        assert len(measured) == 1, f"{heading}: {len(measured)} provenance lines"
        assert PROVENANCE.match(measured[0]), f"{heading}: {measured[0]}"
        reports = REPORT.findall(body)
        assert reports, f"{heading} names no report"
        for name in reports:
            assert (RESULTS / name).is_file(), f"{heading}: no {name} in benchmarks/results"


def test_every_report_is_json_and_its_note_text() -> None:
    for path in RESULTS.glob("*.json"):
        report = json.loads(path.read_text())
        note = report.get("note", "-")
        assert isinstance(note, str), path.name
        assert note, path.name


def test_the_code_links_to_sections_of_the_page_and_leaves_the_figures_there() -> None:
    headings = anchors(PAGE)
    links, figures = [], []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "bench":  # the benchmark's own code describes its workloads
            continue
        text = path.read_text()
        links += [(path, anchor) for anchor in re.findall(r"performance\.md#([\w-]+)", text)]
        figures += [f"{path.relative_to(REPO)}: {m.group(0)}" for m in FIGURE.finditer(text)]
    assert links, "no module links to the page"
    assert [f"{p.relative_to(REPO)}#{a}" for p, a in links if a not in headings] == []
    assert figures == []

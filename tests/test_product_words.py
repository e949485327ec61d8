"""The product speaks of itself: its behaviour, its reasons and its measurements, each with
its date, version and hardware. Words about how it is developed (rounds of work and their
ordinals, internal issue numbers, the notebook measurements were once kept in, the machines
its developers use) belong in commit messages, not in code, tests, docs or configuration.

Each pattern names one kind of such word precisely enough that the product's own words pass:
a process ``session`` (``start_new_session``, pytest's session fixtures), ``this machine``
(where a job's engines run), a decoded ``payload``, ``helper`` processes, and another
project's issue cited by its number sign (``vLLM issue #15136``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from repo_paths import REPO

ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
    r"\d+(?:st|nd|rd|th)"
)
DEVELOPMENT_WORDS = {
    # A phrase may break across lines, a comment's too ("ninth\n# session").
    "a development round's ordinal": rf"\b(?:{ORDINALS}|this|next|last|previous|earlier|later)"
    r"(?:[-\s]|#)+(?:sessions?|rounds?)\b",
    "a development round's number": r"\b(?:session|round) \d+\b",
    "an internal issue number": r"\bissues? \d+",
    "a round's file name": r"\bs\d{1,2}-(?:w\d|whole|kill|gemma|\*)",
    "the benchmark notebook": r"\bNOTES\.md\b",
    "the project's own machine": r"\bthis (?:project|workplace)\b|\bdevelopment machine\b",
    "the GPU lending tool": r"\bdevice (?:tool|time)\b|\b(?:lent|borrowed) (?:GPU|host|machine)",
}
PATTERN = re.compile("|".join(f"(?:{p})" for p in DEVELOPMENT_WORDS.values()), re.IGNORECASE)

ROOTS = ("mmbatch", "tests", "docs", "recipes", "samples", ".ci", "benchmarks")
FILES = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md", "pyproject.toml", ".gitignore")
NOT_PROSE = (
    # The measurement reports, kept as the benchmark wrote them (their commands and paths).
    "benchmarks/results/",
    # This file, which has to spell the words it looks for.
    "tests/test_product_words.py",
)


def product_texts() -> list[Path]:
    """Every text file of the product: code, tests, docs, configuration, samples."""
    paths = [REPO / name for name in FILES]
    for root in ROOTS:
        paths += [p for p in (REPO / root).rglob("*") if p.is_file()]
    texts = []
    for path in sorted(paths):
        relative = path.relative_to(REPO).as_posix()
        if "__pycache__" in relative or any(relative.startswith(n) for n in NOT_PROSE):
            continue
        try:
            path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a picture, a video, a sound
            continue
        texts.append(path)
    return texts


def development_words(text: str) -> list[str]:
    return [match.group(0) for match in PATTERN.finditer(text)]


def test_the_product_has_no_development_words() -> None:
    found = []
    for path in product_texts():
        text = path.read_text(encoding="utf-8")
        for match in PATTERN.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(REPO)}:{line}: {match.group(0)!r}")
    assert found == [], "\n".join(found)


def test_the_search_reaches_code_tests_docs_and_configuration() -> None:
    names = {path.relative_to(REPO).as_posix() for path in product_texts()}
    assert {"mmbatch/engine/layout.py", "tests/test_layers.py", "docs/pages/performance.md"} <= (
        names
    )
    assert {"README.md", "pyproject.toml", ".ci/setup", "benchmarks/README.md"} <= names
    assert not any(name.startswith("benchmarks/results/") for name in names)


@pytest.mark.parametrize(
    "words",
    [
        "measured in the ninth session",
        "(90.88% on a clean clone, 2026-12-01, ninth\n# session)",
        "(Fourteenth session)",
        "Twelfth session (`...-s12-*.json`)",
        "later sessions measured it",
        "Issue 3's video loader options",
        "# issue 24's attacks",
        "results/2026-12-03-h200-s14-w3-product.json",
        "see mmbatch/bench/results/NOTES.md",
        "on this project's 2-core CPU",
        "the H200 of this workplace",
        "30 minutes of device time",
    ],
)
def test_each_kind_of_development_word_is_found(words: str) -> None:
    assert development_words(words), words


@pytest.mark.parametrize(
    "words",
    [
        "start_new_session=True",
        "the session's engine, kept for the session",
        "in_session(job.pid)",
        "2 engines on this machine (no GPU)",
        "the decoded payload",
        "helper processes end with their job",
        "otherwise a clip of 7200 frames (vLLM issue #15136)",
        "rounded up to a multiple of 256",
        "benchmarks/results/2026-12-03-h200-w3-decode-graphs.json",
        "a 2-core CPU, vLLM 0.32's CPU build, 2026-12-01",
        "s3-compatible storage",
    ],
)
def test_the_products_own_words_pass(words: str) -> None:
    assert development_words(words) == [], words

"""Every tiny family through ``mmbatch caption`` with the budget's counts: the families
``tests/testing/test_families.py`` leaves to this tier (it runs two)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_families import FAMILIES_HERE, NEW_FAMILIES, caption_family

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("family", [f for f in NEW_FAMILIES if f not in FAMILIES_HERE])
def test_family_captions_with_the_budgets_counts(
    family: str, samples: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    caption_family(family, samples, tmp_path_factory)

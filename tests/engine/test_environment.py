"""Variables set for a block are given back as they were, and a user's own value wins where
asked: what the engine core's place, torch's threads and vLLM's log rely on."""

from __future__ import annotations

import os

import pytest

from mmbatch.engine.environment import environment

NAME = "MMBATCH_TEST_ENVIRONMENT"
OTHER = "MMBATCH_TEST_ENVIRONMENT_OTHER"


def test_a_variable_set_for_a_block_is_removed_or_restored_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(NAME, raising=False)
    monkeypatch.setenv(OTHER, "before")
    with environment({NAME: "1", OTHER: "during"}) as chosen:
        assert (os.environ[NAME], os.environ[OTHER]) == ("1", "during")
        assert chosen == {NAME, OTHER}
    assert NAME not in os.environ
    assert os.environ[OTHER] == "before"


def test_a_users_value_wins_when_asked_and_is_never_touched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(NAME, "users")
    monkeypatch.delenv(OTHER, raising=False)
    with environment({NAME: "ours", OTHER: "ours"}, users_win=True) as chosen:
        assert (os.environ[NAME], os.environ[OTHER]) == ("users", "ours")
        assert chosen == {OTHER}
    assert os.environ[NAME] == "users"
    assert OTHER not in os.environ


def test_the_environment_is_given_back_when_the_block_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(NAME, raising=False)
    with pytest.raises(RuntimeError), environment({NAME: "1"}):
        raise RuntimeError("the engine failed to build")
    assert NAME not in os.environ

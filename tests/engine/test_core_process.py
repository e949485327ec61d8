"""Where vLLM's engine core runs: in the engine's process on the CPU build, unless the user
says otherwise; a GPU's left to vLLM (``mmbatch.engine.core_process``)."""

from __future__ import annotations

import os

import pytest

from mmbatch.engine.core_process import CORE_PROCESSES, core_in_this_process


def test_a_cpu_engine_is_built_with_its_core_here_and_the_setting_given_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CORE_PROCESSES, raising=False)
    with core_in_this_process(on_cpu=True):
        assert os.environ[CORE_PROCESSES] == "0"
    assert CORE_PROCESSES not in os.environ
    with core_in_this_process(on_cpu=False):  # a GPU's engine core: vLLM's own process
        assert CORE_PROCESSES not in os.environ


@pytest.mark.parametrize("given", ["0", "1"])
def test_a_users_own_setting_wins(monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    monkeypatch.setenv(CORE_PROCESSES, given)
    for on_cpu in (True, False):
        with core_in_this_process(on_cpu):
            assert os.environ[CORE_PROCESSES] == given
        assert os.environ[CORE_PROCESSES] == given

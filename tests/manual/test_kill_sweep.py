"""The exhaustive kills (``tests/test_kill_resume.py`` runs a smaller set at fixed seeds):
fifty SIGKILLs of a job and of its engine process at random moments, six of ``frames`` and
of ``run-openai-batch`` each, at a random seed that a failure names, and a SIGKILL of the
real command on vLLM while it generates (``tests/test_end_to_end.py`` interrupts it)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from test_end_to_end import check_stopped_while_decoding_then_resumed
from test_kill_resume import check_killed_and_rerun, kill_cycles


def test_fifty_kills_of_the_job_and_its_engine_lose_nothing_and_end_in_input_order(
    tmp_path: Path,
) -> None:
    seed = random.randrange(1 << 30)
    kills, engine_kills, torn_tails, killed_mid_job = kill_cycles(tmp_path, 5, seed)
    # The kills did land: on the job and on its engine, inside the work, not only around it.
    assert kills + engine_kills >= 50, f"seed {seed}: {kills} + {engine_kills} kills"
    assert engine_kills >= 10, f"seed {seed}: only {engine_kills} engine kills"
    assert torn_tails >= 5, f"seed {seed}"
    assert killed_mid_job >= 10, f"seed {seed}: only {killed_mid_job} kills landed mid-job"


@pytest.mark.parametrize("command", ["frames", "run-openai-batch"])
def test_frames_and_batch_files_killed_six_times_end_with_every_row_once(
    tmp_path: Path, command: str
) -> None:
    check_killed_and_rerun(tmp_path, command, rounds=6, seed=random.randrange(1 << 30))


@pytest.mark.slow
def test_the_real_command_killed_while_decoding_resumes_to_the_uninterrupted_texts(
    vl_engine,  # type: ignore[no-untyped-def]
    tiny_vl_model: Path,
    samples: Path,
    tmp_path: Path,
) -> None:
    check_stopped_while_decoding_then_resumed(
        vl_engine, tiny_vl_model, samples, tmp_path, "SIGKILL"
    )

"""Ray's driver checks the engine settings as vLLM reads them before any replica starts; a
check that passed on the host is remembered, by the model's content, the settings and the
versions, so the same job run again does not import vLLM for it. Anything else is checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_ENGINE_KWARGS

from mmbatch.engine.builder import check_engine_without_devices
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.passed_checks import FOLDER, pass_key
from mmbatch.errors import ConfigError

CHECK = """
import json, sys
from mmbatch.engine.builder import check_engine_without_devices
from mmbatch.engine.config import EngineConfig
check_engine_without_devices(EngineConfig(sys.argv[1], json.loads(sys.argv[2])))
print(json.dumps("vllm" in sys.modules))
"""


def checked_in_a_new_process(model: Path, kwargs: dict[str, object], cache: Path) -> bool:
    """Check the settings in a process of their own; whether it imported vLLM to do so."""
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(model), json.dumps(kwargs)],
        env=os.environ | {"MMBATCH_CACHE_DIR": str(cache)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return bool(json.loads(done.stdout.strip().splitlines()[-1]))


def test_settings_that_passed_on_the_host_are_not_checked_again_by_the_next_process(
    tiny_vl_model: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    assert checked_in_a_new_process(tiny_vl_model, TINY_ENGINE_KWARGS, cache)
    assert len(list((cache / FOLDER).iterdir())) == 1
    assert not checked_in_a_new_process(tiny_vl_model, TINY_ENGINE_KWARGS, cache)


def test_a_local_jobs_check_is_remembered_for_a_ray_driver_of_the_same_settings(
    tiny_vl_model: Path, tmp_path: Path
) -> None:
    """A local job checks more than the driver does (the whole engine config, with its
    media): a ``--ray`` run after it on the host skips the driver's check."""
    cache = tmp_path / "cache"
    local = (
        "import json, sys\n"
        "from mmbatch.engine.builder import check_engine\n"
        "from mmbatch.engine.config import EngineConfig\n"
        "check_engine(EngineConfig(sys.argv[1], json.loads(sys.argv[2])), {'image': 1})\n"
    )
    subprocess.run(
        [sys.executable, "-c", local, str(tiny_vl_model), json.dumps(TINY_ENGINE_KWARGS)],
        env=os.environ | {"MMBATCH_CACHE_DIR": str(cache)},
        capture_output=True,
        timeout=300,
        check=True,
    )
    assert not checked_in_a_new_process(tiny_vl_model, TINY_ENGINE_KWARGS, cache)
    other = {**TINY_ENGINE_KWARGS, "max_model_len": 512}  # not what the local job passed
    assert checked_in_a_new_process(tiny_vl_model, other, cache)


def test_a_pass_is_kept_for_the_model_by_content_and_the_settings_only(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    key = pass_key(EngineConfig(str(model), {"max_model_len": 1024}))
    assert key is not None
    assert key == pass_key(EngineConfig(str(model), {"max_model_len": 1024}))
    assert key != pass_key(EngineConfig(str(model), {"max_model_len": 2048}))
    (model / "config.json").write_text('{"hidden_size": 16}')
    assert key != pass_key(EngineConfig(str(model), {"max_model_len": 1024}))
    # A hub model's files are the hub's to change: its passes are not kept.
    assert pass_key(EngineConfig("Qwen/Qwen2.5-VL-3B-Instruct", {})) is None


def test_settings_vllm_refuses_are_refused_however_often_asked_and_never_kept(
    tiny_vl_model: Path,
) -> None:
    cache = Path(os.environ["MMBATCH_CACHE_DIR"]) / FOLDER
    config = EngineConfig(str(tiny_vl_model), {**TINY_ENGINE_KWARGS, "max_model_len": 99999})
    for _ in range(2):
        with pytest.raises(ConfigError, match="longer than the context of the model"):
            check_engine_without_devices(config)
    assert not (cache / str(pass_key(config))).exists()

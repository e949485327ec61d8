"""A script that starts mmbatch's processes from its top level, outside
``if __name__ == "__main__":``, is told so in one line before any process starts: each
spawned process would run that code again (it took 90 s and 89 lines that never said so)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

GUARD = 'under `if __name__ == "__main__":`'


def run_script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )


def test_a_dataset_map_script_without_the_guard_is_told_at_once(
    tiny_vl_model: Path, samples: Path, tmp_path: Path
) -> None:
    done = run_script(
        tmp_path,
        f"""
        import atexit, sys
        import datasets
        from mmbatch import DatasetMap

        atexit.register(lambda: print("vllm imported:", "vllm" in sys.modules))
        ds = datasets.Dataset.from_dict({{"image": [{str(samples / "sunset.jpg")!r}]}})
        captioner = DatasetMap(
            {str(tiny_vl_model)!r}, "Describe.", allowed_paths=[{str(samples)!r}]
        )
        ds.map(captioner, batched=True)
        """,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("mmbatch.errors.ConfigError: ")
    assert "job.py, line 11, starts mmbatch's processes from the script's top level" in last
    assert last.endswith(GUARD)
    assert "bootstrapping phase" not in done.stderr  # no process was started to fail
    # Told before the engine's start-up began (not a minute and a half into it): vLLM, which
    # any engine's start imports, was not imported by the time the script ended.
    assert done.stdout == "vllm imported: False\n"


def test_the_guard_a_notebook_and_python_c_pass(tmp_path: Path) -> None:
    body = """
    from mmbatch.mainguard import check_main_guard

    def work():
        check_main_guard()
        print("ok")

    if __name__ == "__main__":
        work()
        if True:
            work()
    """
    guarded = run_script(tmp_path, body)
    assert (guarded.returncode, guarded.stdout) == (0, "ok\nok\n"), guarded.stderr
    unguarded = run_script(tmp_path, body.replace('if __name__ == "__main__":', "if True:"))
    assert unguarded.returncode == 1
    assert "job.py, line 9, starts mmbatch's processes" in unguarded.stderr
    inline = subprocess.run(
        [sys.executable, "-c", "from mmbatch.mainguard import check_main_guard as c; c()"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert inline.stderr == ""

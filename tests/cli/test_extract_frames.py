"""``mmbatch frames`` without a model: the sampled frames written out and listed, one row
each, with no engine started (vLLM is not even imported)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from PIL import Image

FIELDS = ("id", "video", "frame_index", "pts", "frame_path")


def test_frames_without_a_model_are_saved_and_listed(samples: Path, tmp_path: Path) -> None:
    from mmbatch.cli import EXIT_ITEMS_FAILED, main

    out, frames = tmp_path / "frames.jsonl", tmp_path / "frames"
    still = tmp_path / "still.jpg"
    still.write_bytes((samples / "sunset.jpg").read_bytes())
    argv = ["frames", str(samples / "clip.mp4"), str(still), "--fps", "1"]
    argv += ["--save-frames", str(frames), "--out", str(out), "--no-progress"]
    assert main(argv) == EXIT_ITEMS_FAILED  # the still image is not a video: its row says so
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    clip, bad = rows[:-1], rows[-1]
    assert len(clip) >= 2
    for row in clip:
        assert set(row) == {*FIELDS, "media_hash", "error"}
        assert row["error"] is None
        with Image.open(row["frame_path"]) as frame:
            assert frame.size[0] > 0
    assert [row["pts"] for row in clip] == sorted(row["pts"] for row in clip)
    assert sorted(p.name for p in frames.iterdir()) == sorted(
        Path(row["frame_path"]).name for row in clip
    )
    assert "a still image, not a video" in bad["error"]["message"]
    # Sampling needs a model to sample with.
    assert main([*argv, "--max-tokens", "5"]) == 2


def test_frames_without_a_model_import_no_vllm(samples: Path, tmp_path: Path) -> None:
    argv = [str(samples / "clip.mp4"), "--num-frames", "2", "--out", str(tmp_path / "f.jsonl")]
    code = (
        "import sys\nfrom mmbatch.cli import main\n"
        f"code = main(['frames', *{argv!r}, '--no-progress'])\n"
        "print('vllm imported' if 'vllm' in sys.modules else 'no vllm')\nsys.exit(code)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "no vllm"
    assert "no model: extracting (add --save-frames DIR to keep them)" in proc.stderr


def test_frame_rows_of_a_captioning_job_name_their_saved_frame(
    samples: Path, tmp_path: Path
) -> None:
    from fake_cli import main
    from fake_engine import FakeEngine

    out, frames = tmp_path / "c.jsonl", tmp_path / "frames"
    argv = ["frames", str(samples / "clip.mp4"), "--num-frames", "2", "--model", "m"]
    argv += ["--save-frames", str(frames), "--out", str(out), "--no-progress"]
    assert main(argv, FakeEngine()) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [Path(row["frame_path"]).is_file() for row in rows] == [True, True]
    assert all(row["text"] for row in rows)

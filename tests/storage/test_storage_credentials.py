"""Credentials come from the store's own chain and go nowhere else: with a marker secret key
and session token in the standard AWS environment, and a store that quotes them back in an
error (as a misbehaving or verbose server may), no line the command prints, no file of a
local output folder and no object the job writes in the store holds either marker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from repo_paths import FAKE_CLI
from s3_server import SECRET_MARKER, Bucket, S3Server, faulty_proxy

TOKEN_MARKER = "MARKERsessionTOKEN9876543210zyxwvuDONOTLEAK"


def run(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, str(FAKE_CLI), *argv, "--model", "fake", "--no-progress", "-v"],
        env=os.environ | env,
        capture_output=True,
        timeout=300,
        check=False,
    )
    return done.returncode, done.stdout.decode() + done.stderr.decode()


def test_no_credential_is_printed_or_written_anywhere(
    s3: Bucket, s3_server: S3Server, samples: Path, tmp_path: Path
) -> None:
    for name in ("sunset.jpg", "checkerboard.png", "truncated.jpg", "secret.jpg"):
        source = samples / ("sunset.jpg" if name == "secret.jpg" else name)
        s3.put(f"in/{name}", source.read_bytes())
    s3.put("in/missing.jsonl", b'{"path": "nothing.jpg"}\n')
    with faulty_proxy(s3_server) as proxy:
        proxy.deny.add(f"/{s3.name}/in/secret.jpg")
        proxy.denied_message = f"denied for key {SECRET_MARKER} token {TOKEN_MARKER}"
        env = {"AWS_ENDPOINT_URL": proxy.endpoint, "AWS_SESSION_TOKEN": TOKEN_MARKER}
        local = tmp_path / "local-out"
        said = []
        for out in (s3.url("out/rows.jsonl"), str(local / "rows.parquet")):
            code, output = run(["caption", s3.url("in"), "--out", out], env)
            assert code == 1, output[-3000:]
            said.append(output)
        code, output = run(["caption", s3.url("in/missing.jsonl"), "--out", str(local / "m")], env)
        said.append(output)
        code, output = run(["caption", "s3://no-such-bucket-at-all/x", "--out", "o.jsonl"], env)
        assert code == 2
        said.append(output)

    written = [p.read_bytes() for p in local.rglob("*") if p.is_file()]
    assert any(b"access denied" in data for data in written)  # the denial is a row, said
    assert any(b"***" in data for data in written)  # with what it quoted taken out
    for marker in (SECRET_MARKER, TOKEN_MARKER):
        for text in said:
            assert marker not in text
        for data in written:
            assert marker.encode() not in data
        assert marker.encode() not in s3.everything()

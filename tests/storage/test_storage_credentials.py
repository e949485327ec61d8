"""Credentials come from the store's own chain and go nowhere else: with a marker secret key
and session token in the standard AWS environment, and a store that quotes them back in an
error (as a misbehaving or verbose server may), no line the command prints, no file of a
local output folder and no object the job writes in the store holds either marker.

The same holds for credentials the environment does not hold: keys and a session token in
a credentials file (as a profile, SSO or an instance role gives them), and a store whose
denial quotes the signed request's headers back (``Authorization: ... Credential=KEY/...``,
``X-Amz-Security-Token: TOKEN``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from repo_paths import FAKE_CLI
from s3_server import SECRET_MARKER, Bucket, FaultyProxy, S3Server, faulty_proxy

TOKEN_MARKER = "MARKERsessionTOKEN9876543210zyxwvuDONOTLEAK"


def run(argv: list[str], env: dict[str, str], without: tuple[str, ...] = ()) -> tuple[int, str]:
    environment = {k: v for k, v in (os.environ | env).items() if k not in without}
    done = subprocess.run(
        [sys.executable, str(FAKE_CLI), *argv, "--model", "fake", "--no-progress", "-v"],
        env=environment,
        capture_output=True,
        timeout=300,
        check=False,
    )
    return done.returncode, done.stdout.decode() + done.stderr.decode()


def put_inputs(s3: Bucket, samples: Path) -> None:
    for name in ("sunset.jpg", "checkerboard.png", "truncated.jpg", "secret.jpg"):
        source = samples / ("sunset.jpg" if name == "secret.jpg" else name)
        s3.put(f"in/{name}", source.read_bytes())
    s3.put("in/missing.jsonl", b'{"path": "nothing.jpg"}\n')


def run_every_way(
    s3: Bucket, proxy: FaultyProxy, local: Path, env: dict[str, str], without: tuple[str, ...] = ()
) -> list[str]:
    """What the command says when it reads the inputs through ``proxy`` (which denies one
    object) to an output in the store and to a local one, reads a manifest naming nothing,
    and names a bucket that does not exist."""
    proxy.deny.add(f"/{s3.name}/in/secret.jpg")
    env = env | {"AWS_ENDPOINT_URL": proxy.endpoint}
    said = []
    for out in (s3.url("out/rows.jsonl"), str(local / "rows.parquet")):
        code, output = run(["caption", s3.url("in"), "--out", out], env, without)
        assert code == 1, output[-3000:]
        said.append(output)
    code, output = run(
        ["caption", s3.url("in/missing.jsonl"), "--out", str(local / "m")], env, without
    )
    said.append(output)
    code, output = run(
        ["caption", "s3://no-such-bucket-at-all/x", "--out", "o.jsonl"], env, without
    )
    assert code == 2
    said.append(output)
    return said


def assert_nowhere(markers: tuple[str, ...], said: list[str], local: Path, s3: Bucket) -> None:
    """No marker in what was said, in a file of the local output, or in the store; the
    denial is a row, with what it quoted taken out."""
    written = [p.read_bytes() for p in local.rglob("*") if p.is_file()]
    assert any(b"access denied" in data for data in written)
    assert any(b"***" in data for data in written)
    for marker in markers:
        for text in said:
            assert marker not in text
        for data in written:
            assert marker.encode() not in data
        assert marker.encode() not in s3.everything()


def test_no_credential_is_printed_or_written_anywhere(
    s3: Bucket, s3_server: S3Server, samples: Path, tmp_path: Path
) -> None:
    put_inputs(s3, samples)
    with faulty_proxy(s3_server) as proxy:
        proxy.denied_message = f"denied for key {SECRET_MARKER} token {TOKEN_MARKER}"
        said = run_every_way(s3, proxy, tmp_path, {"AWS_SESSION_TOKEN": TOKEN_MARKER})
    assert_nowhere((SECRET_MARKER, TOKEN_MARKER), said, tmp_path, s3)


FILE_KEY_ID = "AKIAFILEMARKERKEY0042"
FILE_SECRET = "MARKERfileSECRET0123456789abcdefDONOTLEAK"
FILE_TOKEN = "MARKERfileTOKEN/9876543210+zyxwvutsrqDONOTLEAK=="


def test_credentials_from_a_file_are_not_printed_or_written_either(
    s3: Bucket, s3_server: S3Server, samples: Path, tmp_path: Path
) -> None:
    put_inputs(s3, samples)
    credentials = tmp_path / "aws-credentials"
    credentials.write_text(
        f"[default]\naws_access_key_id = {FILE_KEY_ID}\n"
        f"aws_secret_access_key = {FILE_SECRET}\naws_session_token = {FILE_TOKEN}\n"
    )
    env = {"AWS_SHARED_CREDENTIALS_FILE": str(credentials)}
    in_environment = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    local = tmp_path / "out"
    with faulty_proxy(s3_server) as proxy:
        proxy.denied_message = f"denied for key {FILE_KEY_ID} token {FILE_TOKEN}"
        proxy.denial_quotes_request = True
        said = run_every_way(s3, proxy, local, env, without=in_environment)
    assert_nowhere((FILE_KEY_ID, FILE_SECRET, FILE_TOKEN), said, local, s3)

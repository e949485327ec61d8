"""What a store's failure may say: no credential of the environment, none that a file system
resolved elsewhere (a credentials file, the Hub's token file), and nothing that follows the
headers a signed request carries them in."""

from __future__ import annotations

from pathlib import Path

import pytest
from s3_server import Bucket

from mmbatch.storage.objects import kind_of, redacted
from mmbatch.storage.redaction import redact

KEY_ID = "AKIAFILEKEYFORREDACT1"
SECRET = "fileSECRETvalue/0123456789+abcdefghijklmn"
TOKEN = "fileSESSIONtoken/ABCDEFGHIJ+0123456789=="


def test_the_shapes_that_carry_credentials_lose_their_values() -> None:
    said = redact(
        "Authorization: AWS4-HMAC-SHA256 Credential=AKIAANYKEY/20261205/us-east-1/s3/aws4_request, "
        "SignedHeaders=host, Signature=0123abcd\n"
        "X-Amz-Security-Token: sometoken+/=\n"
        "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAANYKEY%2F2026&X-Amz-Signature=ffee"
        "&X-Amz-Security-Token=urltoken&x=1\n"
        "{'authorization': 'Bearer hf_abcdefghijklmnop'} access_token=ya29.gcs"
    )
    for value in ("AKIAANYKEY", "0123abcd", "sometoken", "ffee", "urltoken", "hf_abc", "ya29"):
        assert value not in said
    assert "X-Amz-Security-Token: ***" in said
    assert "&x=1" in said  # the query's other fields stay


def test_credentials_an_s3_session_resolved_from_a_file_are_never_said(
    s3: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[default]\naws_access_key_id = {KEY_ID}\n"
        f"aws_secret_access_key = {SECRET}\naws_session_token = {TOKEN}\n"
    )
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    s3.put("x.jpg", b"x")
    assert kind_of(s3.url("x.jpg")) == "object"  # a request made with the file's keys
    said = redacted(f"{KEY_ID} signed, {SECRET} kept, {TOKEN} sent")
    assert said == "*** signed, *** kept, *** sent"


def test_the_token_the_hub_file_system_finds_in_its_file_is_never_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    from mmbatch.storage.objects import file_system

    token = "hf_TOKENfromTHEfileONLY0123456789"
    (tmp_path / "token").write_text(token)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    for variable in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    file_system("hf://datasets/someone/something/x.parquet")
    assert redacted(f"401 for {token}: not allowed") == "401 for ***: not allowed"

"""What is said of a store's failure never holds a credential.

A store's error may quote what it was sent (a verbose server or gateway puts the signed
request in its message), and an error becomes a row, a quarantine line in the bucket, a
summary or a line on the terminal. So every such text is said without:

* the value of every secret-looking environment variable (``SECRET_NAMES``);
* the credentials each file system actually resolved, wherever its library found them
  (``resolved``): for ``s3``, the key id, secret and session token of its botocore
  session (the environment, a credentials file or profile, SSO, an instance role); for
  ``gs``, gcsfs's access and refresh tokens; for ``hf``, the token huggingface_hub sends
  (``HF_TOKEN`` or its token file);
* whatever follows the shapes a signed request carries credentials in (``SHAPES``):
  ``Authorization:``, ``X-Amz-Security-Token:``, ``Credential=``, ``Signature=``,
  ``Bearer``, ``access_token=``, whatever their value.

Each is replaced by ``***``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

HIDDEN = "***"
SECRET_NAMES = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|PRIVATE|ACCESS_KEY|API_KEY")
"""Environment variables whose values are never said."""
SHORTEST = 6
"""A value shorter than this is not looked for (it would hide ordinary words)."""
SHAPES = (
    re.compile(r"(?i)(\bauthorization\b['\"]?\s*[:=]\s*['\"]?)[^'\"\r\n<>]+"),
    re.compile(r"(?i)(\bx-amz-security-token\b['\"]?\s*[:=]\s*['\"]?)[^'\"\s&<>,]+"),
    re.compile(r"(?i)(\b(?:credential|signature|access_token)=)[^'\"\s&<>,]+"),
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]+"),
)
"""Where a request carries a credential, whatever its value: the value goes."""
_GCS_METHODS = frozenset({"google_default", "cache", "anon", "browser", "cloud"})
"""gcsfs's ``token`` option names a way to find credentials, not a credential, in these."""


def redact(text: str, file_systems: Iterable[tuple[str, AbstractFileSystem]] = ()) -> str:
    """``text`` without a credential (the module's docstring): those of the environment,
    those each of ``file_systems`` (protocol, file system) resolved, and every shape."""
    values = {v for k, v in os.environ.items() if SECRET_NAMES.search(k.upper())}
    for protocol, fs in file_systems:
        values.update(resolved(protocol, fs))
    for value in sorted((v for v in values if len(v) >= SHORTEST), key=len, reverse=True):
        for spelling in {value, quote(value, safe="")}:
            text = text.replace(spelling, HIDDEN)
    for shape in SHAPES:
        text = shape.sub(rf"\1{HIDDEN}", text)
    return text


def resolved(protocol: str, fs: AbstractFileSystem) -> set[str]:
    """The credentials the file system ``fs`` of ``protocol`` resolved and sends; none
    where it has resolved none yet (it has sent nothing) or they cannot be told."""
    try:
        if protocol == "s3":
            found = _s3(fs)
        elif protocol == "gs":
            found = _gs(fs)
        elif protocol == "hf":
            found = _hf(fs)
        else:
            found = []
    except Exception:  # a library's internals changed: the shapes and the environment stay
        return set()
    return {value for value in found if isinstance(value, str) and value}


def _s3(fs: Any) -> list[Any]:
    """The key id, secret and token s3fs's botocore session resolved (its session exists
    once a request was made, its credentials then loaded and kept)."""
    from fsspec.asyn import sync

    found = [fs.key, fs.secret, fs.token]
    session = fs.session
    if session is None:
        return found
    credentials = sync(fs.loop, session.get_credentials)
    if credentials is not None:
        frozen = sync(fs.loop, credentials.get_frozen_credentials)
        found += [frozen.access_key, frozen.secret_key, frozen.token]
    return found


def _gs(fs: Any) -> list[Any]:
    """gcsfs's access token, and the refresh token and client secret of user credentials."""
    holder = fs.credentials
    given = holder.token
    found: list[Any] = [given] if isinstance(given, str) and given not in _GCS_METHODS else []
    inner = getattr(holder, "credentials", None)
    for field in ("token", "refresh_token", "client_secret", "_refresh_token", "_client_secret"):
        found.append(getattr(inner, field, None))
    return found


def _hf(fs: Any) -> list[Any]:
    """The token the Hub file system was given, or the one huggingface_hub finds (its
    environment or its token file)."""
    from huggingface_hub import get_token

    return [fs.token, get_token()]

"""Read the bytes of a media source: a local path, or an http(s) URL when the job allows it.

URLs are off by default: a manifest is data from somewhere else, and fetching whatever it
names would let it make this machine send requests (to internal services, say) and pull
unbounded amounts of data. With ``UrlPolicy`` given, a fetch is bounded in bytes (checked
while reading, not trusted from Content-Length) and in time (per socket operation and in
total), and only http and https are accepted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mmbatch.errors import ConfigError, MediaError

URL_SCHEMES = ("http://", "https://")
DEFAULT_URL_MAX_BYTES = 50 * 1024**2
DEFAULT_URL_TIMEOUT_S = 30.0
_CHUNK = 64 * 1024


def is_url(source: str) -> bool:
    """Whether ``source`` names a URL (any ``scheme://``) rather than a local path."""
    return "://" in source


@dataclass(frozen=True)
class UrlPolicy:
    """Permission to fetch http(s) URLs, with the limits each fetch must stay within."""

    max_bytes: int = DEFAULT_URL_MAX_BYTES
    timeout_s: float = DEFAULT_URL_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ConfigError(f"the URL size limit must be >= 1 byte, got {self.max_bytes}")
        if self.timeout_s <= 0:
            raise ConfigError(f"the URL time limit must be > 0 s, got {self.timeout_s}")


def read_source(source: str, urls: UrlPolicy | None) -> bytes:
    """The bytes of ``source``, or ``MediaError`` (stage "load") saying why they cannot be had."""
    if not is_url(source):
        try:
            with open(source, "rb") as handle:
                return handle.read()
        except OSError as exc:
            raise MediaError(
                f"cannot read {source!r}: {exc.strerror or exc}", stage="load", kind="unreadable"
            ) from None
    if urls is None:
        raise MediaError(
            f"{source!r} is a URL and URL inputs are off (pass --allow-urls to fetch them)",
            stage="load",
            kind="unsupported",
        )
    return fetch_url(source, urls)


def fetch_url(url: str, policy: UrlPolicy) -> bytes:
    """GET ``url`` within ``policy``'s byte and time limits."""
    import http.client
    import urllib.error
    import urllib.request

    if not url.lower().startswith(URL_SCHEMES):
        raise MediaError(
            f"{url!r}: only http and https URLs are fetched", stage="load", kind="unsupported"
        )
    deadline = time.monotonic() + policy.timeout_s
    try:
        with urllib.request.urlopen(url, timeout=policy.timeout_s) as response:
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > policy.max_bytes:
                raise _too_large(url, policy)
            chunks: list[bytes] = []
            size = 0
            # read1 returns whatever has arrived, so a server that trickles bytes still
            # meets the clock between reads.
            while chunk := response.read1(_CHUNK):
                size += len(chunk)
                if size > policy.max_bytes:
                    raise _too_large(url, policy)
                if time.monotonic() > deadline:
                    raise MediaError(
                        f"fetching {url!r} took over {policy.timeout_s:g} s",
                        stage="load",
                        kind="unreadable",
                    )
                chunks.append(chunk)
            return b"".join(chunks)
    except MediaError:
        raise
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        if isinstance(exc, urllib.error.HTTPError):
            exc.close()  # it holds the response's socket
            reason: object = f"HTTP {exc.code} {exc.reason}"
        else:
            reason = getattr(exc, "reason", None) or exc
        raise MediaError(
            f"cannot fetch {url!r}: {reason}", stage="load", kind="unreadable"
        ) from None


def _too_large(url: str, policy: UrlPolicy) -> MediaError:
    return MediaError(
        f"{url!r} is over the URL size limit of {policy.max_bytes} bytes",
        stage="load",
        kind="too_large",
    )

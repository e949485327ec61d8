"""Headless Chromium (Debian's ``chromium``) for the tests that render the review gallery.

In CI (``CI`` set) a missing chromium fails those tests: .ci/run installs it. Elsewhere they
are skipped with the reason, so a laptop without chromium can still run the suite.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "chromium is not installed (apt-get install -y chromium; .ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def browse(page: Path, profile: Path, *args: str, fragment: str = "") -> str:
    """Run headless Chromium on ``page``; the stdout (the DOM, with --dump-dom)."""
    proc = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            *args,
            page.resolve().as_uri() + fragment,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def probe(page: Path, profile: Path, width: int, script: str) -> Any:
    """What ``script`` leaves in ``result`` (read back as JSON), run once ``page`` has loaded
    in a frame ``width`` pixels wide (a phone's width too: a headless window is at least 500
    pixels wide), with the frame's ``win`` and ``doc`` at hand."""
    wrapper = profile.with_suffix(".html")
    source = page.resolve().as_uri()
    wrapper.write_text(
        f'<!doctype html><html><body style="margin:0"><iframe id="frame" src="{source}" '
        f'style="width:{width}px;height:900px;border:0"></iframe><script>\n'
        'document.getElementById("frame").addEventListener("load", function () {\n'
        "var win = this.contentWindow, doc = win.document, result = null;\n"
        f"{script}\n"
        'document.body.setAttribute("data-probe", JSON.stringify(result)); });\n'
        "</script></body></html>"
    )
    dom = browse(
        wrapper, profile, "--dump-dom", "--allow-file-access-from-files", "--window-size=1400,1000"
    )
    found = re.search(r'data-probe="([^"]*)"', dom)
    assert found is not None, dom[-2000:]
    return json.loads(html.unescape(found.group(1)))

"""Headless Chromium for browser tests: the system's `chromium` (Debian package), driven by Playwright.

Playwright's own browser download is never used (`playwright install` needs the internet); its pip
wheel only brings the driver, and `executable_path` points it at the system binary.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Browser, sync_playwright

# No sandbox (CI runs as root), no GPU, and nothing that phones home: the machine may have no network.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    """`CBSERVE_CHROMIUM`, else `chromium` / `chromium-browser` on PATH."""
    found = os.environ.get("CBSERVE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "Chromium is needed: `make check-deps` installs it as root, or set CBSERVE_CHROMIUM"
    return found


@contextmanager
def chromium() -> Iterator[Browser]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def artifact_dir() -> Path:
    """Where tests keep files worth looking at after a run (`CBSERVE_TEST_ARTIFACTS`, git-ignored default)."""
    path = Path(
        os.environ.get("CBSERVE_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts")
    )
    path.mkdir(parents=True, exist_ok=True)
    return path

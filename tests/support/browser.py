"""Headless Chromium for the tests of `reslice ui` (tests/launcher/ui/) and bench/ui.py: Debian's `chromium`
and `chromium-driver` (dev.py installs them, as root with apt), driven by selenium. Where they are
missing, BrowserUnavailable says so in one line and the tests skip with it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

CHROMEDRIVER = "/usr/bin/chromedriver"
# What lets Chromium run here as root and on a closed network: no sandbox (root), no GPU, and none of
# its own background connections (the machine refuses them, and Chromium's start waits on them).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


class BrowserUnavailable(Exception):
    """No Chromium or chromedriver here (or selenium is not installed)."""


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(profile: Path | None = None):
    """A selenium WebDriver of headless Chromium with a fresh profile of its own, in `profile`
    (a new temporary directory when None: the caller's tmp_path keeps /tmp clean)."""
    binary = chromium_binary()
    if binary is None or not Path(CHROMEDRIVER).exists():
        raise BrowserUnavailable(
            "Debian's chromium and chromium-driver are not installed (dev.py installs them as root)"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        raise BrowserUnavailable(f"selenium is not installed: {e}") from e
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in FLAGS:
        options.add_argument(flag)
    profile = profile or Path(tempfile.mkdtemp(prefix="reslice-chromium-"))
    options.add_argument(f"--user-data-dir={profile}")
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)

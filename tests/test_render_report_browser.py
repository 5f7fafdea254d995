"""The HTML report in a real browser: headless Chromium renders it, and the screenshot shows it."""

from __future__ import annotations

from collections import Counter

import pytest

from browser import chromium, png_pixels, screenshot
from conftest import run_cli
from pipesched.render.palette import BASE


@pytest.mark.timeout(180)
def test_report_renders_in_headless_chromium(tmp_path):
    if chromium() is None:
        pytest.skip("chromium is not installed (scripts/test.sh installs it with apt-get as root)")
    page = tmp_path / "report.html"
    done = run_cli("report", "--ranks", "4", "--microbatches", "8", "-o", str(page))
    assert done.returncode == 0, done.stderr
    shot = tmp_path / "shot.png"
    screenshot(page, shot, width=1000, height=1600)  # the comparison table, the advice and the first charts
    pixels = Counter(p for row in png_pixels(shot) for p in row)
    total = sum(pixels.values())
    white = pixels[(255, 255, 255)]
    assert white / total < 0.9, "the page is (almost) blank"
    forward = tuple(int(BASE["F"][i:i + 2], 16) for i in (1, 3, 5))
    backward = tuple(int(BASE["B"][i:i + 2], 16) for i in (1, 3, 5))
    assert pixels[forward] > 1000 and pixels[backward] > 1000, "the Gantt boxes are drawn"

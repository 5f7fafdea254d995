"""The README's main job: ``pipesched demo`` compares, draws and (with torch) trains."""

from __future__ import annotations

import pytest

from conftest import run_cli


def test_demo_without_training_compares_and_draws(tmp_path):
    out = run_cli("demo", "--out", str(tmp_path / "demo"), "--no-train", timeout=300)
    assert out.returncode == 0, out.stderr
    assert "zb-v" in out.stdout and "vs 1f1b" in out.stdout
    for name in ("report.html", "1f1b.svg", "zb-v.svg"):
        assert (tmp_path / "demo" / name).stat().st_size > 1000


@pytest.mark.torch
@pytest.mark.slow
def test_demo_trains_and_every_schedule_matches_the_reference(tmp_path):
    pytest.importorskip("torch")
    out = run_cli("demo", "--out", str(tmp_path / "demo"), "--steps", "3", timeout=600)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if "on 2 ranks" in line]
    assert len(rows) == 2
    for row in rows:
        loss_diff = float(row.split("│")[4])
        assert loss_diff < 1e-5


def test_demo_refuses_a_file_as_its_folder(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    out = run_cli("demo", "--out", str(target), "--no-train")
    assert out.returncode == 2
    assert "is not a folder" in out.stderr

"""``pipesched draw`` and ``pipesched report`` through the real entry point, bad paths included."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

import pipesched
from conftest import cli_env, run_cli


def test_draw_svg(tmp_path):
    out = tmp_path / "chart.svg"
    done = run_cli("draw", "zb-v", "--ranks", "4", "--microbatches", "8", "-o", str(out))
    assert done.returncode == 0, done.stderr
    root = ET.parse(out).getroot()
    assert root.tag.endswith("svg")
    assert sum(1 for r in root.iter() if r.tag.endswith("title")) >= len(pipesched.build_schedule("zb-v", 4, 8))


def test_draw_trace_json(tmp_path):
    out = tmp_path / "trace.json"
    done = run_cli("draw", "1f1b", "-p", "3", "-m", "5", "--comm", "0.5", "-o", str(out))
    assert done.returncode == 0, done.stderr
    events = json.loads(out.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == 3 * 5 * 2


def test_draw_png(tmp_path):
    pytest.importorskip("PIL", reason="PNG output needs the [png] extra (Pillow)")
    out = tmp_path / "chart.png"
    done = run_cli("draw", "zb-h1", "-p", "4", "-m", "8", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_draw_png_without_pillow_says_how_to_install(tmp_path):
    fake = tmp_path / "nopil" / "PIL"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('Pillow hidden for this test')\n")
    env = cli_env()
    env["PYTHONPATH"] = f"{fake.parent}:{env['PYTHONPATH']}"
    out = tmp_path / "chart.png"
    done = subprocess.run([sys.executable, "-m", "pipesched", "draw", "1f1b", "-o", str(out)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "pip install 'pipesched[png]'" in done.stderr
    assert not out.exists()


def test_draw_a_schedule_csv(tmp_path):
    csv = tmp_path / "mine.csv"
    csv.write_text(pipesched.build_schedule("zb-h1", 2, 3).to_csv())
    out = tmp_path / "mine.svg"
    done = run_cli("draw", "--csv", str(csv), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "mine" in out.read_text()


@pytest.mark.parametrize("command", [["draw", "1f1b"], ["report"]])
@pytest.mark.parametrize("bad,reason", [("missing/dir/out", "does not exist"), ("out.pdf", "suffix")])
def test_bad_output_path_is_one_line_and_writes_nothing(tmp_path, command, bad, reason):
    target = tmp_path / bad
    if not target.suffix:
        target = target.with_suffix(".svg" if command[0] == "draw" else ".html")
    done = run_cli(*command, "-o", str(target))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0] and "Traceback" not in done.stderr
    assert list(tmp_path.rglob("*")) == []


def test_draw_needs_a_name_or_csv(tmp_path):
    done = run_cli("draw", "-o", str(tmp_path / "x.svg"))
    assert done.returncode == 2 and "--csv" in done.stderr


def test_report_is_self_contained_and_covers_every_schedule(tmp_path):
    out = tmp_path / "report.html"
    done = run_cli("report", "--ranks", "4", "--microbatches", "8", "--costs", "1,1.4,0.6", "-o", str(out))
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    for family in pipesched.families():
        assert f'id="{family.name}"' in html
        assert family.summary.replace("'", "&#x27;") in html
    assert html.count("<svg") == len(pipesched.families())
    for fetch in ("<script", "<link", "src=", "url(", "@import", "https://"):
        assert fetch not in html
    assert "speed-up over 1f1b" in html


def test_drawing_imports_no_torch():
    code = ("import sys, pipesched.render.svg, pipesched.render.trace, pipesched.render.html, "
            "pipesched.render.terminal, pipesched.render.png; assert 'torch' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=cli_env())
    assert done.returncode == 0, done.stderr


def test_draw_and_report_take_the_objective_of_the_searching_schedules(tmp_path):
    trace = tmp_path / "trace.json"
    done = run_cli("draw", "v-half", "-p", "4", "-m", "8", "--objective", "span", "-o", str(trace))
    assert done.returncode == 0, done.stderr
    spans = sum(e["ph"] == "X" for e in json.loads(trace.read_text())["traceEvents"])
    assert spans == len(pipesched.build_schedule("v-half", 4, 8, objective="span"))
    page = tmp_path / "report.html"
    done = run_cli("report", "-p", "4", "-m", "8", "--objective", "span", "-o", str(page))
    assert done.returncode == 0, done.stderr
    assert "objective span" in page.read_text()
    done = run_cli("draw", "zb-auto", "--objective", "fastest", "-o", str(trace))
    assert done.returncode == 2 and "objective" in done.stderr

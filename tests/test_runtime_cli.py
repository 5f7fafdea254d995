"""``pipesched train`` through the real entry point: bad input is one line and exit 2 before any
process starts; a CSV from torch runs; the reference and a pipeline agree on the printed loss."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import cli_env, concurrently, run_cli

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesched: error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


BAD_INPUT = [
    (["--model", "gpt", "--schedule", "interleaved-1f1b", "--ranks", "4", "--chunks", "2"], ["8 stages", "6 blocks"]),
    (["--schedule", "1f1b", "--ranks", "2", "--microbatches", "8", "--batch-size", "30"], ["a batch of 30", "8 equal microbatches"]),
    (["--schedule", "zb-v", "--ranks", "2", "--chunks", "3"], ["zb-v needs chunks=2"]),
    (["--model", "resnet"], ["--model 'resnet'"]),
    (["--schedule", "no-such"], ["unknown schedule"]),
    (["--save-params", "out.txt"], [".pt"]),
    (["--clip-grad-norm", "0"], ["--clip-grad-norm must be a finite number above 0"]),
    (["--optimizer", "lamb"], ["--optimizer 'lamb'", "sgd, adamw"]),
    # dualpipe's two model copies hold the same blocks: --stage-blocks splits one copy
    (["--schedule", "dualpipe", "--ranks", "2", "--microbatches", "4", "--stage-blocks", "1,1,1,1"], ["give 2 counts"]),
    # and --recompute names the stages of one copy too (both copies recompute them)
    (["--schedule", "dualpipe", "--ranks", "2", "--microbatches", "4", "--recompute", "3"],
     ["stage 3", "stages 0 to 1 (each of its 2 model copies)"]),
]


@pytest.fixture(scope="module")
def bad_input_runs() -> dict:
    """``pipesched train`` with each row of BAD_INPUT, four processes at a time."""
    rows = [tuple(args) for args, _ in BAD_INPUT]
    return dict(zip(rows, concurrently(lambda args: run_cli("train", *args, "--steps", "1"), rows)))


@pytest.mark.parametrize("args,fragments", BAD_INPUT)
def test_bad_input_is_one_line_and_exit_2(args, fragments, bad_input_runs):
    _one_line_error(bad_input_runs[tuple(args)], *fragments)


def test_csv_whose_ranks_differ_from_ranks_flag(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("0F0,0B0\n1F0,1B0\n")
    _one_line_error(run_cli("train", "--csv", str(path), "--ranks", "4"), "2 ranks", "--ranks is 4")


def test_without_torch_the_command_says_how_to_install_it():
    code = "import sys; sys.modules['torch'] = None; from pipesched.cli import main; main(['train'])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "pipesched: error: pipesched train needs PyTorch: pip install 'pipesched[torch]' "
        "(CPU: pip install torch==2.13.0)"
    )


def test_a_hugging_face_model_without_transformers_says_how_to_install_it(tmp_path):
    config = tmp_path / "config.json"
    config.write_text("{}")
    code = ("import sys; sys.modules['transformers'] = None; from pipesched.cli import main; "
            f"main(['train', '--model', 'hf:{config}'])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"pipesched: error: --model hf:{config} needs Hugging Face transformers: pip install 'pipesched[hf]'")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_torch_csv_runs_and_matches_the_reference_with_adamw_and_clipping(tmp_path):
    from pipesched.interop.torch_schedules import torch_schedule

    path = tmp_path / "zbv.csv"
    path.write_text(torch_schedule("zb-v", 2, 4).to_csv())
    common = ["--model", "gpt", "--steps", "2", "--batch-size", "8", "--seed", "1", "--clip-grad-norm", "0.5",
              "--optimizer", "adamw", "--lr", "0.001"]
    ran = run_cli("train", "--csv", str(path), "--ranks", "2", "--trace", str(tmp_path / "t.json"), *common, timeout=110)
    assert ran.returncode == 0, ran.stderr
    ref = run_cli("train", "--schedule", "none", *common, timeout=60)
    assert ref.returncode == 0, ref.stderr
    assert _losses(ran.stdout) == pytest.approx(_losses(ref.stdout), rel=1e-5)
    assert "simulated from the median costs" in ran.stdout
    assert (tmp_path / "t.json").stat().st_size > 0


def _losses(stdout: str) -> tuple[float, float]:
    """First and last loss from the summary line ``loss of step 1 A -> of step N B ...``."""
    words = next(line for line in stdout.splitlines() if line.startswith("loss of step ")).split()
    return float(words[4]), float(words[9])

"""``pipesched train --model hf:...`` on checkpoints transformers itself wrote: MoE folders, their
experts stored one by one, train from ``--hf-weights`` and resave with ``--save-hf`` in that layout."""

from __future__ import annotations

import json

import pytest
from conftest import concurrently

pytest.importorskip("transformers")
import torch  # noqa: E402
from hf_cases import make_model  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.mark.timeout(240)
def test_moe_folders_transformers_wrote_train_and_resave_as_transformers_stores_them(tmp_path, forked_cli):
    """A Mixtral and a Qwen3-MoE folder written by transformers' own ``save_pretrained`` (experts
    stored one by one) train from ``--hf-weights`` on 2 ranks and resave with ``--save-hf`` in the
    same layout; transformers loads that folder with the logits of the folder's model trained the
    same step in one process (transformers' model itself, SGD, the command's batch). The
    activations predicted before launch on fake tensors (the experts' grouped matmul answered as
    the CPU kernel allocates: pipesched/runtime/engine/fake_kernels.py) are the run's own
    prediction to the byte.

    fp32 both ways, the pipeline's sums in another order (2 microbatches, 2 ranks): the losses
    within 1e-5 relative, the logits (about 0.5) within 1e-5, a hundred times fp32's rounding of
    them and a thousand times below what the step changed (checked: more than 1e-2)."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    import pipesched
    from pipesched.training.launch_checks import activation_peaks
    from pipesched.training.models import get_model

    kinds = ("mixtral", "qwen3-moe")
    for kind in kinds:
        make_model(kind, torch.float32).save_pretrained(tmp_path / kind)
    args = ["--ranks", "2", "-s", "1f1b", "-m", "2", "--steps", "1", "--batch-size", "4", "--seq-len", "16",
            "--lr", "0.05"]
    runs = concurrently(lambda kind: forked_cli("train", "--model", f"hf:{tmp_path / kind / 'config.json'}",
                                                "--hf-weights", str(tmp_path / kind), "--save-hf", str(tmp_path / f"{kind}-out"),
                                                "--summary", str(tmp_path / f"{kind}.json"), *args, timeout=200), kinds)
    for kind, run in zip(kinds, runs):
        assert run.returncode == 0, (kind, run.stderr)
        stored = [sorted(safe_open(str(folder / "model.safetensors"), "pt").keys())
                  for folder in (tmp_path / kind, tmp_path / f"{kind}-out")]
        assert stored[0] == stored[1] and any(".experts.3." in key for key in stored[0]), kind  # one by one
        md = get_model(f"hf:{tmp_path / kind / 'config.json'}", weights=str(tmp_path / kind), context=16)
        model = AutoModelForCausalLM.from_pretrained(tmp_path / kind)
        before = AutoModelForCausalLM.from_pretrained(tmp_path / kind)
        predicted = activation_peaks(md, pipesched.build_schedule("1f1b", 2, 2), None, 4, 1, 0, None, torch.float32)
        for rank in json.loads((tmp_path / f"{kind}.json").read_text())["memory"]:
            assert rank["predicted_peak_activation_bytes"] == predicted[rank["rank"]], (kind, rank)
        x, y = md.batch(0, 4, 0)
        loss = model(input_ids=x, labels=y).loss
        loss.backward()
        torch.optim.SGD(model.parameters(), lr=0.05).step()
        assert json.loads((tmp_path / f"{kind}.json").read_text())["losses"] == pytest.approx([loss.item()], rel=1e-5)
        resaved = AutoModelForCausalLM.from_pretrained(tmp_path / f"{kind}-out")
        x, _ = md.batch(7, 4, 0)
        with torch.no_grad():
            want = model(input_ids=x).logits
            assert (resaved(input_ids=x).logits - want).abs().max() < 1e-5, kind
            assert (before(input_ids=x).logits - want).abs().max() > 1e-2, kind

"""Memory is a promise: what the runtime measures each step is what the memory model predicts.

The runtime counts the activation bytes a rank holds (saved tensors by storage, W stashes, stage
inputs, recomputed activations while a backward rebuilds them); the prediction is
:mod:`pipesched.memory` replaying the rank's actions with the per-stage sizes measured on the
first step, which are also measured before launch, on fake tensors, to the byte. Recomputation
(activation checkpointing) trains exactly like the unpipelined model, also with a split backward
(I then W), and holds less.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from conftest import run_cli  # noqa: E402
from runtime_cases import (  # noqa: E402
    measure_memory,
    metered_steps,
    reference,
    relative_error,
    run_schedules,
)

import pipesched  # noqa: E402
from pipesched.runtime.launching.launch import spawn  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]
SIZE = dict(blocks=7, dim=16, hidden=64)


@pytest.mark.timeout(150)
def test_measured_activation_bytes_match_the_prediction_and_recompute_holds_less():
    names = ("gpipe", "1f1b", "zb-h1", "zb-h2", "zb-v", "v-half")
    runs = [(n, pipesched.build_schedule(n, 2, 6), None) for n in names]
    runs += [(f"{n} recompute", pipesched.build_schedule(n, 2, 6), "all") for n in ("gpipe", "1f1b", "zb-h1", "zb-v")]
    lean = pipesched.build_schedule("zb-auto", 2, 6, memory_limit=0.8, recompute_input=0.1)  # recomputes to fit
    runs.append(("zb-auto recompute", lean, lean.meta["recompute"].spec()))
    runs += [("dualpipe", pipesched.build_schedule("dualpipe", 2, 6), None),  # two model copies, one per direction
             ("dualpipe recompute", pipesched.build_schedule("dualpipe", 2, 6), "all"),
             # model stage 0: rank 0's forward copy and rank 1's reverse copy
             ("dualpipe recompute 0", pipesched.build_schedule("dualpipe", 2, 6), "0")]
    results = spawn(measure_memory, 2, ("mlp", SIZE, 12, runs), timeout_s=90)[0]
    for label, ranks in results.items():
        for measured, predicted, left in ranks:
            assert measured == pytest.approx(predicted, rel=0.05), label
            assert left == 0, f"{label}: bytes still held after the step"
    peak = {label: max(m for m, _, _ in ranks) for label, ranks in results.items()}
    assert peak["zb-v"] < peak["zb-h2"] < peak["gpipe"]
    assert peak["gpipe recompute"] < 0.4 * peak["gpipe"]
    assert peak["1f1b recompute"] < 0.4 * peak["1f1b"]
    assert peak["zb-auto recompute"] < peak["v-half"]  # the leanest stored V order
    # recomputing one model stage of dualpipe recomputes both its copies: each rank holds one
    assert all(one[0] < plain[0] for one, plain in zip(results["dualpipe recompute 0"], results["dualpipe"]))
    # the W stash is not recomputed: zb-h1's last rank, which holds stashes for long, keeps them
    assert results["zb-h1 recompute"][1][0] > 0.9 * results["zb-h1"][1][0]
    # and before any rank starts, the same prediction from the same sizes measured in one process
    # on fake tensors (runtime/engine/sizes_ahead.py: what train --memory-limit adds up)
    from pipesched.memory import recompute_stages
    from pipesched.runtime.engine.sizes_ahead import rank_peaks_ahead, stage_sizes_ahead
    from pipesched.training.models import get_model

    md = get_model("mlp", **SIZE)
    x, y = md.batch(0, 12, 3)
    for label, schedule, recompute in runs:
        size = 12 // schedule.microbatches
        sizes = stage_sizes_ahead(md.build_block, md.num_blocks, schedule, md.loss_fn, (x[:size], y[:size]),
                                  recompute=recompute_stages(recompute, schedule))
        assert rank_peaks_ahead(schedule, sizes) == [predicted for _, predicted, _ in results[label]], label


def test_by_default_the_meter_counts_the_first_step_and_each_step_whose_shapes_change():
    # its saved-tensor hooks cost a few percent of a step: the steps in between are not counted
    for peaks in spawn(metered_steps, 2, (pipesched.build_schedule("zb-v", 2, 4), SIZE), timeout_s=90).values():
        assert [p is not None for p in peaks] == [True, False, True, False]
        assert peaks[2] > peaks[0] > 0  # twice the microbatch, more bytes


@pytest.mark.timeout(150)
def test_dualpipe_on_four_ranks_holds_what_the_memory_model_predicts_for_its_two_copies():
    runs = [(n, pipesched.build_schedule(n, 4, 8), None) for n in ("dualpipe", "dualpipev")]
    results = spawn(measure_memory, 4, ("mlp", dict(blocks=7, dim=8, hidden=32), 8, runs), timeout_s=120)[0]
    for label, ranks in results.items():
        for measured, predicted, left in ranks:
            assert measured == pytest.approx(predicted, rel=0.05), label
            assert left == 0, f"{label}: bytes still held after the step"


@pytest.mark.timeout(150)
def test_recomputed_stages_train_exactly_like_the_unpipelined_model_also_with_i_then_w():
    schedules = [(n, pipesched.build_schedule(n, 2, 4)) for n in ("1f1b", "zb-h1", "zb-v")]
    results = spawn(run_schedules, 2, ("mlp", SIZE, 8, schedules, None, "sgd", "all"), timeout_s=90)[0]
    ref = reference("mlp", SIZE, 8)
    for label, got in results.items():
        assert got["losses"][0] == pytest.approx(ref["loss"], rel=1e-5), label
        assert relative_error(got["grads"], ref["grads"]) < 1e-5, label
        assert relative_error(got["params"], ref["params"]) < 1e-5, label


@pytest.mark.timeout(240)
def test_zb_auto_under_a_byte_limit_holds_no_more_and_the_json_summary_and_trace_say_so(tmp_path):
    # zb-auto measures the stage sizes and costs (one short profile), derives what a recomputed stage keeps,
    # and recomputes to fit a limit below one microbatch's activations (172 KiB per stage)
    path, trace, limit = tmp_path / "run.json", tmp_path / "trace.json", 128 * 2**10
    result = run_cli("train", "--model", "mlp", "--schedule", "zb-auto", "--ranks", "2", "--microbatches", "4",
                     "--batch-size", "16", "--steps", "2", "--memory-limit", "128KiB", "--summary", str(path),
                     "--trace", str(trace))
    assert result.returncode == 0, result.stderr
    assert "a recomputed stage keeps" in result.stderr and "zb-auto: recomputing stages" in result.stderr
    assert "zb-auto: planned with measured costs F " in result.stderr  # the same profile's
    data = json.loads(path.read_text())
    assert {k: data[k] for k in ("schedule", "ranks", "microbatches", "dp", "dtype")} == {
        "schedule": "zb-auto", "ranks": 2, "microbatches": 4, "dp": 1, "dtype": "fp32"}
    assert len(data["losses"]) == 2 and data["median_step_ms"] > 0
    assert [m["rank"] for m in data["memory"]] == [0, 1]
    for m in data["memory"]:
        assert m["measured_peak_activation_bytes"] == pytest.approx(m["predicted_peak_activation_bytes"], rel=0.05)
        assert m["measured_peak_activation_bytes"] <= limit
        assert "device_peak_bytes" not in m  # CPU: no device allocator to ask
    assert "activations measured" in result.stdout
    counters = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "C"]
    for m in data["memory"]:  # the drawn step's highest level is the rank's measured peak
        levels = [e["args"]["activations (bytes)"] for e in counters if e["pid"] == m["rank"]]
        assert max(levels) == m["measured_peak_activation_bytes"]


@pytest.mark.parametrize("value,fragment", [("1,9", "stage 9"), ("some", "all, none")])
def test_bad_recompute_is_one_line_and_exit_2(value, fragment):
    result = run_cli("train", "--schedule", "1f1b", "--ranks", "2", "--recompute", value, "--steps", "1")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesched: error:") and fragment in lines[0]


def test_the_advisors_transformer_bytes_match_the_runtimes_gpt_layer_on_cpu():
    from pipesched.advise.transformer import TransformerSpec
    from pipesched.runtime.engine.split_backward import (
        WeightGradStash,
        make_weight_grads_deferrable,
    )
    from pipesched.runtime.metering.memory_meter import ActivationMeter
    from pipesched.training.models import TransformerBlock

    b, s, h, a = 2, 64, 128, 4
    block = TransformerBlock(h, a)
    meter = ActivationMeter(exclude=list(block.parameters()))
    stash = WeightGradStash(hold=meter.hold)
    make_weight_grads_deferrable(block, stash)
    x = torch.randn(b, s, h, requires_grad=True)
    with meter.saved_tensors():
        y = block(x)
    kept = meter.current  # the block's input is saved by its first LayerNorm: counted here
    stash.collecting = []
    y.backward(torch.ones_like(y))
    stash.collecting = None
    del y
    stashed = meter.current
    spec = TransformerSpec(1, h, s, b, heads=a, dtype_bytes=4)  # fp32, flash (SDPA), no dropout
    assert kept == pytest.approx(spec.layer_activation_bytes(b), rel=0.05)
    assert stashed == pytest.approx(spec.layer_stash_bytes(b), rel=0.05)


def test_the_meter_counts_each_byte_of_a_storage_once_however_its_holders_overlap():
    from pipesched.runtime.metering.memory_meter import ActivationMeter

    meter = ActivationMeter()
    base = torch.zeros(100)  # 400 bytes
    first_half = meter.hold(base[:50])
    middle = meter.hold(base[25:75])
    middle_again = meter.hold(base[25:75])
    assert meter.current == 300  # bytes 0-300, each once
    del middle
    assert meter.current == 300  # the same span is still held
    del middle_again
    assert meter.current == 200
    transposed = meter.hold(base.view(10, 10).t())  # not contiguous: spans the whole storage
    assert meter.current == 400
    del first_half, transposed
    assert (meter.current, meter.peak) == (0, 400)


def test_a_recomputed_stage_keeps_its_blocks_inputs_and_rebuilds_one_block_at_a_time():
    from pipesched.runtime.engine.recompute import recomputed_forward
    from pipesched.runtime.metering.memory_meter import ActivationMeter
    from pipesched.runtime.stages.partition import Stage
    from pipesched.training.models import ResidualMLP

    torch.manual_seed(0)
    stage = Stage(0, {i: ResidualMLP(16, 64) for i in range(4)})
    x = torch.randn(8, 16, requires_grad=True)
    one_input = x.numel() * x.element_size()

    def run(recompute: bool):
        meter = ActivationMeter(exclude=list(stage.parameters()))
        held = meter.hold(x)  # the stage input, as the executor counts it
        with meter.saved_tensors():
            y = recomputed_forward(stage, x, meter) if recompute else stage(x)
        kept, meter.high = meter.current, meter.current
        grads = torch.autograd.grad(y.square().sum(), [x, *stage.parameters()])
        del held, y
        return kept, meter.high - kept, meter.current, grads

    stored_keep, stored_extra, _, stored_grads = run(recompute=False)
    keep, extra, left, grads = run(recompute=True)
    assert stored_extra == 0 and stored_keep > 8 * one_input
    assert keep == 4 * one_input  # the stage input and the 3 boundaries between its blocks
    assert extra == stored_keep // 4 - one_input  # one block rebuilt at a time, its input already held
    assert left == 0
    assert all(torch.equal(a, b) for a, b in zip(grads, stored_grads))


def test_sizes_learned_apart_combine_as_one_learner_over_them_all_would_learn_them_at_most():
    from pipesched.memory import StageMemory
    from pipesched.ops import Op
    from pipesched.runtime.metering.observers import SizeLearner, largest_sizes

    def learned(*observations):
        learner = SizeLearner()
        for action, before, after, high in observations:
            learner.observe(action, before, after, high)
        return learner.sizes

    # stage 0 fused (F, B); stage 1 split (F, I): a plain microbatch, and one keeping more (a mask)
    plain = learned(((0, Op.F, 0), 0, 10, 10), ((0, Op.B, 0), 10, 0, 14),
                    ((1, Op.F, 0), 0, 8, 8), ((1, Op.I, 0), 8, 3, 9))
    masked = learned(((0, Op.F, 0), 0, 16, 16), ((0, Op.B, 0), 16, 0, 18),
                     ((1, Op.F, 0), 0, 12, 12), ((1, Op.I, 0), 12, 4, 12))
    together = learned(((0, Op.F, 0), 0, 10, 10), ((0, Op.F, 1), 10, 26, 26), ((0, Op.B, 0), 26, 16, 30),
                       ((1, Op.F, 0), 0, 8, 8), ((1, Op.F, 1), 8, 20, 20), ((1, Op.I, 0), 20, 15, 21))
    combined = largest_sizes([plain, masked])
    assert combined[0] == together[0] == StageMemory(keep=16, stash=0, backward_extra=4)  # no I: no stash
    # the one learner's stash (the plain I's change on the masked keep) and at most that
    assert combined[1] == StageMemory(keep=12, stash=7, backward_extra=0, input_backward_extra=1)
    assert together[1].stash <= combined[1].stash

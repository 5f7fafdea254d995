"""Every registered schedule trains exactly like the single-process model (gloo, CPU).

For each schedule: the loss and every gradient after one step, and every parameter after three
SGD steps, equal the unpipelined run within 1e-5 relative (max |a-b| / max |b| per tensor).
All schedules of one configuration share one spawned process group (start-up is the slow part).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from runtime_cases import (  # noqa: E402
    assert_equal_to_reference,
    reference,
    relative_error,
    run_schedules,
)
from test_dualpipe import late_finishing_copy  # noqa: E402

import pipesched  # noqa: E402
from pipesched.interop.torch_schedules import torch_schedule  # noqa: E402
from pipesched.runtime.launching.launch import spawn  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]
TOL = 1e-5
MEASURED_LIKE = pipesched.Costs(F=3.5, B=3.4, W=2.1, comm=0.6, stage_multipliers=(1.18, 0.82))


@pytest.mark.timeout(150)
def test_every_registered_schedule_and_torch_csvs_on_two_ranks():
    size = dict(blocks=7, dim=16, hidden=32)
    schedules = [(f.name, pipesched.build_schedule(f.name, 2, 4)) for f in pipesched.families()]
    schedules.append(("dualpipe m=3", pipesched.build_schedule("dualpipe", 2, 3)))  # 2 microbatches one way, 1 the other
    # zb-auto as train plans it from a profile: skewed passes, a heavy stage, a delay per message
    measured = pipesched.build_schedule("zb-auto", 2, 4, costs=MEASURED_LIKE)
    assert measured.orders != dict(schedules)["zb-auto"].orders  # not the unit-cost plan
    schedules.append(("zb-auto, measured-like costs", measured))
    # copies finishing in different orders on the two ranks: summed after the last action
    schedules.append(("dualpipe csv, late copy", late_finishing_copy(pipesched.build_schedule("dualpipe", 2, 4))))
    for name in ("zb-v", "interleaved-1f1b", "interleaved-zb", "dualpipev"):
        theirs = torch_schedule(name, 2, 4)
        schedules.append((f"csv:{theirs.name}", pipesched.Schedule.from_csv(theirs.to_csv())))
    results = spawn(run_schedules, 2, ("mlp", size, 12, schedules), timeout_s=60)[0]
    assert set(results) == {label for label, _ in schedules}
    assert_equal_to_reference(results, reference("mlp", size, 12))


@pytest.mark.timeout(120)
def test_gpt_on_two_ranks_with_uneven_microbatch_count_and_host_staged_messages():
    size = dict(layers=2, dim=16, heads=2, context=8)
    schedules = [(n, pipesched.build_schedule(n, 2, 3)) for n in ("1f1b", "zb-v", "interleaved-zb")]
    schedules.append(("zb-v host-staged", pipesched.build_schedule("zb-v", 2, 3)))
    results = spawn(run_schedules, 2, ("gpt", size, 6, schedules), timeout_s=60)[0]
    assert_equal_to_reference(results, reference("gpt", size, 6))


@pytest.mark.timeout(150)
def test_smaller_model_on_four_ranks():
    size = dict(blocks=7, dim=8, hidden=16)
    schedules = [(n, pipesched.build_schedule(n, 4, 4)) for n in ("1f1b", "zb-v", "interleaved-zb", "dualpipev", "dualpipe")]
    schedules.append(("dualpipe m=8", pipesched.build_schedule("dualpipe", 4, 8)))  # DualPipe's own m >= 2p
    results = spawn(run_schedules, 4, ("mlp", size, 8, schedules), timeout_s=90)[0]
    assert_equal_to_reference(results, reference("mlp", size, 8))


@pytest.mark.timeout(90)
def test_blocks_whose_outputs_are_strided_views_are_sent_densely():
    from runtime_cases import strided_blocks, strided_run

    from pipesched.runtime.stages.partition import build_block_seeded

    schedule = pipesched.build_schedule("zb-v", 2, 2)
    losses = spawn(strided_run, 2, (schedule, 4), timeout_s=60)[0]
    model = torch.nn.Sequential(*(build_block_seeded(strided_blocks, i, 5) for i in range(4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)), torch.zeros(4, 8)
    want = []
    for _ in range(2):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        want.append(loss.item())
    assert losses == pytest.approx(want, rel=TOL)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_gradient_clipping_over_all_ranks_equals_clipping_the_whole_model(optimizer):
    size = dict(blocks=5, dim=8, hidden=16)
    schedules = [(n, pipesched.build_schedule(n, 2, 4)) for n in ("1f1b", "zb-v", "interleaved-zb", "dualpipe")]
    clip = 0.05  # well under the model's gradient norm: every step is clipped
    results = spawn(run_schedules, 2, ("mlp", size, 8, schedules, clip, optimizer), timeout_s=60)[0]
    ref = reference("mlp", size, 8, clip_grad_norm=clip, optimizer=optimizer)
    assert_equal_to_reference(results, ref)
    unclipped = reference("mlp", size, 8, optimizer=optimizer)
    assert relative_error(ref["grads"], unclipped["grads"]) > 100 * TOL  # clipping did act


@pytest.mark.timeout(150)
def test_blocks_built_before_the_runtime_train_equal_to_unpipelined_under_every_split_backward_family():
    # the documented sequential_builder(nn.Sequential(...)) path: modules built before the
    # runtime, their Linears then patched for the split backward (shape inference used to
    # crash on them: "unknown device type for autocast")
    from runtime_cases import prebuilt_run, train_prebuilt_reference

    split = [(f.name, s) for f in pipesched.families() if (s := pipesched.build_schedule(f.name, 2, 4)).split_backward]
    assert {"zb-v", "zb-h1", "v-half", "dualpipe"} <= {name for name, _ in split}
    results = spawn(prebuilt_run, 2, split, timeout_s=60)[0]
    assert_equal_to_reference(results, train_prebuilt_reference())


@pytest.mark.timeout(120)
def test_stages_passing_float_and_integer_tuples_train_equal_to_unpipelined():
    # every stage boundary carries (hidden state, token ids): the ids cross as integers and no
    # gradient goes back for them; recomputation and bf16's wire precision leave them as they are
    from runtime_cases import ids_alongside_run, train_ids_reference

    runs = [(n, pipesched.build_schedule(n, 2, 4), torch.float32) for n in ("1f1b", "zb-v", "interleaved-zb", "dualpipe")]
    runs.append(("zb-h1 recomputed", pipesched.build_schedule("zb-h1", 2, 4), torch.float32))
    runs.append(("1f1b bf16", pipesched.build_schedule("1f1b", 2, 4), torch.bfloat16))
    results = spawn(ids_alongside_run, 2, (runs, 8), timeout_s=60)[0]
    bf16 = results.pop("1f1b bf16")
    ref = train_ids_reference(8)
    assert_equal_to_reference(results, ref)
    assert bf16["losses"][0] == pytest.approx(ref["loss"], rel=0.02)

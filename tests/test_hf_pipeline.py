"""pipesched.hf: Hugging Face causal LMs pipelined by every schedule train equal to the model in one process.

Every run compares every step's loss, the first step's gradients (by the model's own names)
and the weights after three AdamW steps with the single-process Hugging Face model on the same
batches (``model(**batch).loss``: the shifted cross-entropy over the batch's counted tokens).
The batches have ``-100`` labels in different numbers per row, so the microbatches count
different numbers of tokens. fp32 runs (Llama, GPT-2, Qwen3) are held to 1e-5 except where
AdamW amplifies fp32's rounding, as the fp32 test says.

Most runs are in float64, where equality is sharp: the model and the pipeline both run float64
throughout (``hf_cases.Float64Throughout``: transformers' float64 models compute their norms,
softmaxes, rotary tables and loss in float32, where a float64 rounding difference can flip a
float32 rounding, 6e-8, on one machine and not another). Then the pipeline differs from the
model only in the order of its sums: a microbatch's matmuls against the whole batch's, the
weight gradients accumulated microbatch by microbatch (or deferred to W), kernels with one
thread against all. Each float64 sum of ``k`` terms is within ``k * 2^-53`` relative of exact
(1e-12 for the 10^4 terms of the largest here), and three AdamW steps of a small, well
conditioned model carry that through (its step ``m / (sqrt(v) + eps)`` moves with a gradient's
relative error, not its size): loss, gradients and weights within ``TOL``, 1e-10 relative, a
hundred times that bound, and twenty times below what one flipped float32 rounding cost the
model's gradients in a measurement (2e-9: weights scaled by ``1 + 1e-12``), so no such flip hides.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from hf_cases import (  # noqa: E402
    FAMILIES,
    LR,
    Float64Throughout,
    keyed_reference,
    make_batch,
    make_config,
    make_model,
    padded_batches,
    reference,
)
from runtime_cases import adamw_allowed, adamw_rounding, relative_error  # noqa: E402

import pipesched  # noqa: E402
from pipesched.runtime.launching.launch import spawn  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]
TOL = 1e-10  # float64 throughout, orders of summation apart (see the module's docstring)


def assert_like_reference(results: dict, batches: list, tol: float = TOL, dtype=torch.float64) -> None:
    """Each run labelled ``KIND SCHEDULE [padded]`` against KIND's model on the same batches
    (``padded``: PADDED's)."""
    refs = {}
    for label, got in results.items():
        kind, padded = label.split()[0], label.endswith("padded")
        if (kind, padded) not in refs:
            refs[kind, padded] = reference(make_model(kind, dtype), PADDED if padded else batches)
        want = refs[kind, padded]
        assert got["losses"] == pytest.approx(want["losses"], rel=tol), label
        assert got["grads"].keys() == want["grads"].keys(), label
        assert relative_error(got["grads"], want["grads"]) < tol, label
        assert got["params"].keys() == want["params"].keys(), label
        assert relative_error(got["params"], want["params"]) < tol, label


BATCHES = [make_batch(step, 8, 16) for step in range(3)]
PADDED = padded_batches()
TWO_RANK_RUNS = [(f"llama {f.name}", "llama", pipesched.build_schedule(f.name, 2, 4), {}) for f in pipesched.families()]
TWO_RANK_RUNS += [(f"{kind} {name}", kind, pipesched.build_schedule(name, 2, 4), {})
                  for kind in ("qwen3", "mixtral", "llama-sdpa") for name in ("1f1b", "zb-v", "interleaved-zb")]
# GPT-2's head is its token embedding: tied across ranks (1f1b, interleaved), on one rank (V), in two copies (dualpipe)
TWO_RANK_RUNS += [(f"gpt2 {name}", "gpt2", pipesched.build_schedule(name, 2, 4), {})
                  for name in ("1f1b", "zb-v", "interleaved-zb", "dualpipe")]
# padded batches whose length changes every step: masks built on every stage from the batch
TWO_RANK_RUNS += [(f"{kind} {name} padded", kind, pipesched.build_schedule(name, 2, 4), {"batches": "padded"})
                  for kind in ("llama", "llama-sdpa", "qwen3", "gpt2") for name in ("1f1b", "zb-v")]
# fp32: GPT-2 under zb-v (its tied weight one Parameter on rank 0), Qwen3 under 1f1b
FP32_RUNS = [(f"{kind} {name} fp32", kind, pipesched.build_schedule(name, 2, 4), {"model_dtype": torch.float32})
             for kind, name in (("gpt2", "zb-v"), ("qwen3", "1f1b"))]
TWO_RANK_RUNS += FP32_RUNS
# every other family (hf_cases.FAMILIES: its real config, shrunk), one schedule each, in turn;
# benchmarks/hf_families.py runs each under all four, on 4 ranks, and in fp32 with SGD
FAMILY_SCHEDULES = ("1f1b", "zb-v", "interleaved-zb", "dualpipev")
FAMILY_RUNS = [(f"{kind} {FAMILY_SCHEDULES[i % 4]}", kind, pipesched.build_schedule(FAMILY_SCHEDULES[i % 4], 2, 4), {})
               for i, kind in enumerate(FAMILIES)]
TWO_RANK_RUNS += FAMILY_RUNS
# models that draw: GPT-2 with its default dropout, Mixtral with router noise (keyed draws);
# GPT-2 of 6 layers (8 blocks: 8 stages on 4 ranks), the same model and batches at 2 and 4 ranks
DRAWS = {"gpt2": {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "n_layer": 6},
         "mixtral": {"router_jitter_noise": 0.1}}
DROPOUT_SCHEDULES = ("1f1b", "zb-v", "interleaved-zb")
KEYED_RUNS = [(f"{kind} {name} keyed", kind, pipesched.build_schedule(name, 2, 4), {"config": DRAWS[kind]})
              for kind, names in (("gpt2", DROPOUT_SCHEDULES), ("mixtral", ("1f1b", "zb-v")))
              for name in names]
TWO_RANK_RUNS += KEYED_RUNS


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One launch of 2 ranks for every 2-rank check of this file: (results, its folder)."""
    from hf_cases import several

    folder = tmp_path_factory.mktemp("hf")
    jobs = {"runs": ("run_pipelines", {"runs": TWO_RANK_RUNS, "batches": BATCHES, "padded": PADDED}),
            "saving": ("save_and_resume", {"batches": BATCHES, "folder": str(folder)})}
    return spawn(several, 2, jobs, timeout_s=240)[0], folder


@pytest.mark.timeout(300)
def test_every_schedule_family_and_model_on_two_ranks(two_ranks):
    results = two_ranks[0]["runs"]
    assert set(results) == {label for label, *_ in TWO_RANK_RUNS}
    assert_like_reference({k: v for k, v in results.items() if not k.endswith(("fp32", "keyed"))}, BATCHES)
    assert results["llama 1f1b"]["deferred"] == 0.0
    assert results["llama zb-v"]["deferred"] > 0.9  # every projection is a Linear; norms and embeddings are not
    assert results["gpt2 zb-v"]["deferred"] > 0.9  # GPT-2's projections are Conv1Ds (its head alone would be 4%)


@pytest.mark.timeout(300)
def test_fp32_with_adamw_is_as_close_to_exact_training_as_the_model_in_one_process(two_ranks):
    """fp32, three AdamW steps, against the single-process model in fp32 and in float64 (exact, to
    fp32's eyes). The loss and every gradient by name within 1e-5 relative of the fp32 model's,
    each gradient element as close to float64's as the fp32 model's (within twice its rounding,
    measured per name). The weights within the bound AdamW's rounding allows
    (:func:`runtime_cases.adamw_allowed`): 1e-5 relative, more where an exact gradient is near its
    rounding or zero (GPT-2's key biases: softmax ignores ``q . b_k``, added to a whole row)."""
    results = two_ranks[0]["runs"]
    for label, kind, *_ in FP32_RUNS:
        got = results[label]
        single = reference(make_model(kind, torch.float32), BATCHES)
        exact = reference(make_model(kind, torch.float64), BATCHES)
        assert got["losses"] == pytest.approx(single["losses"], rel=1e-5), label
        assert relative_error(got["grads"], single["grads"]) < 1e-5, label
        noise = {}
        for name, weight in single["params"].items():
            steps = list(zip(single["step_grads"], exact["step_grads"]))
            rounding, sizes = adamw_rounding(steps, name)
            assert (got["grads"][name] - exact["grads"][name]).abs().max() <= 2 * rounding, (label, name)
            assert ((got["params"][name] - weight).abs() <= adamw_allowed(weight, rounding, sizes, LR)).all(), (label, name)
            # gradients zero to float64's rounding at every step, fp32's not zero: rounding noise
            noise[name] = (sizes.amax(0) < 1e-6 * rounding) & (torch.stack([fp32[name] for fp32, _ in steps]) != 0).any(0)
        if kind == "gpt2":  # the key thirds of each layer's query-key-value bias, and nothing else
            width = make_config("gpt2").n_embd
            keys = torch.arange(3 * width) // width == 1
            assert {n for n, z in noise.items() if z.any()} == {f"transformer.h.{i}.attn.c_attn.bias" for i in range(4)}
            assert all(torch.equal(noise[f"transformer.h.{i}.attn.c_attn.bias"], keys) for i in range(4))


def assert_like_keyed_reference(results: dict, batches: list, microbatches: int) -> None:
    """Each run labelled ``KIND ...`` (a model that draws, ``DRAWS[KIND]``) within ``TOL`` of
    ``hf.one_process_step`` on the same batches: float64 throughout, so a single dropout element
    or router jitter drawn otherwise (a change of 1e-3 or more) could not hide under it."""
    refs = {}
    for label, got in results.items():
        kind = label.split()[0]
        if kind not in refs:
            refs[kind] = keyed_reference(make_model(kind, **DRAWS[kind]), batches, microbatches)
        want = refs[kind]
        assert got["losses"] == pytest.approx(want["losses"], rel=TOL), label
        assert relative_error(got["grads"], want["grads"]) < TOL, label
        assert relative_error(got["params"], want["params"]) < TOL, label
    # the draws are made: without them the model computes other gradients
    undrawn = make_model("gpt2", n_layer=DRAWS["gpt2"]["n_layer"])
    assert relative_error(reference(undrawn, batches)["grads"], refs["gpt2"]["grads"]) > 1e-2


def assert_bitwise_equal(runs: list[dict]) -> None:
    """The same losses and weights, bit for bit (labelled runs)."""
    (first_label, first), *others = runs
    for label, got in others:
        assert got["losses"] == first["losses"], (label, first_label)
        assert got["params"].keys() == first["params"].keys()
        for name, want in first["params"].items():
            assert torch.equal(got["params"][name], want), (label, first_label, name)


@pytest.mark.timeout(300)
def test_dropout_and_router_noise_draw_alike_under_every_schedule(two_ranks):
    """Every block draws keyed by (seed, step, microbatch, block), so GPT-2 with dropout 0.1 and
    Mixtral with router noise 0.1 train under 1f1b, zb-v and interleaved-zb as the keyed
    single-process reference does; the 4-rank test adds 4 ranks and 2 replicas."""
    results = two_ranks[0]["runs"]
    assert_like_keyed_reference({label: results[label] for label, *_ in KEYED_RUNS}, BATCHES, 4)
    # a weight's gradient is computed by the same operations in the same order under every
    # schedule (the split W as the fused B, a tied weight's two sums added once): the same bits
    assert_bitwise_equal([(name, results[f"gpt2 {name} keyed"]) for name in DROPOUT_SCHEDULES])


@pytest.mark.timeout(300)
def test_names_save_pretrained_weights_and_checkpoints_resume_under_another_schedule(two_ranks):
    from hf_cases import adamw
    from transformers import AutoModelForCausalLM

    from pipesched import hf
    from pipesched.runtime.checkpoints import checkpoint

    got, tmp_path = two_ranks[0]["saving"], two_ranks[1]
    batches = BATCHES
    # the run built from the config equals the whole model initialised the same way
    want = reference(hf.init_model(make_config("llama"), seed=5), batches[:2])
    assert relative_error(got["after_two"], want["params"]) < 1e-5
    # the saved folder is what from_pretrained loads, strict, with the trained run's logits
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", attn_implementation="eager")
    fresh = AutoModelForCausalLM.from_config(make_config("llama"))
    fresh.load_state_dict(got["after_two"], strict=True)
    ids = batches[0]["input_ids"]
    with torch.no_grad():
        assert torch.equal(saved(input_ids=ids).logits, fresh(input_ids=ids).logits)
    assert all(torch.equal(got["loaded"][k], v) for k, v in got["after_two"].items())
    # the zb-v checkpoint resumes under 1f1b (and in one process) as if uninterrupted
    assert got["resumed_from"] == 2
    uninterrupted = reference(hf.init_model(make_config("llama"), seed=5), batches)
    assert relative_error(got["resumed"], uninterrupted["params"]) < 1e-5
    # a larger model's checkpoint is refused as train --resume refuses it, though each rank's part of
    # the smaller model is in it (launch_checks.check_checkpoint_of: the whole model, nothing more)
    assert re.fullmatch(f"{re.escape(str(checkpoint.latest(tmp_path / 'ck')))} is a checkpoint of another model: it "
                        r"has 'model\.layers\.[23]\.\S+', which this model lacks", got["larger_refused"])
    model = hf.init_model(make_config("llama"), seed=0)
    optimizer = adamw(list(model.parameters()))
    assert checkpoint.load(checkpoint.latest(tmp_path / "ck"), model, optimizer) == 2
    optimizer.zero_grad()
    model(**batches[2]).loss.backward()
    optimizer.step()
    assert relative_error(model.state_dict(), uninterrupted["params"]) < 1e-5
    # a tied model's checkpoint from a V placement (one Parameter on rank 0) resumes under 1f1b
    # (in float64: GPT-2's key biases get gradients of pure rounding noise, which fp32 AdamW
    # turns into steps of about lr)
    with Float64Throughout():
        gpt2 = reference(hf.init_model(make_config("gpt2"), seed=5), batches[:2])
    assert relative_error(got["gpt2_resumed"], gpt2["params"]) < TOL
    # a model built whole on every rank keeps only its stages' parameters; so does one built from
    # its config (the ranks' shares add up to the model)
    total = got["held"][0][0]
    for before, held, runtime_holds, _ in got["held"]:
        assert held == runtime_holds < before == total
    assert sum(h[2] for h in got["held"]) == sum(h[3] for h in got["held"]) == total


@pytest.mark.timeout(240)
def test_four_ranks_two_replicas_bf16_and_fp32(two_ranks):
    from hf_cases import run_pipelines

    batches = [make_batch(step, 16, 16) for step in range(3)]
    runs = [(f"llama6 {name}", "llama6", pipesched.build_schedule(name, 4, 8), {})
            for name in ("interleaved-zb", "zb-v", "dualpipev", "dualpipe")]
    runs += [(f"llama {name} dp2", "llama", pipesched.build_schedule(name, 2, 4), {"dp": 2}) for name in ("1f1b", "zb-v")]
    fp32 = {"dp": 1, "model_dtype": torch.float32}
    runs += [(f"llama6 {name} fp32", "llama6", pipesched.build_schedule(name, 4, 4), fp32) for name in ("1f1b", "dualpipe")]
    bf16 = {"dp": 1, "model_dtype": torch.float32, "dtype": torch.bfloat16}
    runs += [(f"llama {name} bf16", "llama", pipesched.build_schedule(name, 4, 4), bf16) for name in ("zb-h1",)]
    # GPT-2 with dropout on 4 ranks, and on 2 ranks x 2 replicas: the 2-rank runs' 4 microbatches of 2
    keyed = {"config": DRAWS["gpt2"], "batches": "two_rank_batches"}
    four = [(f"gpt2 {name} keyed", "gpt2", pipesched.build_schedule(name, 4, 4), {"dp": 1, **keyed})
            for name in DROPOUT_SCHEDULES]
    runs += four + [("gpt2 zb-v dp2 keyed", "gpt2", pipesched.build_schedule("zb-v", 2, 2), {"dp": 2, **keyed})]
    job = {"runs": runs, "batches": batches, "two_rank_batches": BATCHES}
    results = spawn(run_pipelines, 4, job, timeout_s=200)[0]
    assert set(results) == {label for label, *_ in runs}
    # at 4 ranks the weights of every schedule are those at 2 ranks, bit for bit (a stage boundary
    # moves no sum: every block computes the same, and the hidden state crosses ranks unchanged)
    on_two = two_ranks[0]["runs"]
    assert_bitwise_equal([(f"{name} on 2 ranks", on_two[f"gpt2 {name} keyed"]) for name in DROPOUT_SCHEDULES]
                         + [(f"{label} on 4 ranks", results[label]) for label, *_ in four])
    assert_like_keyed_reference({"gpt2 zb-v dp2 keyed": results["gpt2 zb-v dp2 keyed"]}, BATCHES, 4)
    exact = {k: v for k, v in results.items() if not k.endswith(("fp32", "bf16", "keyed"))}
    assert_like_reference(exact, batches)
    assert_like_reference({k: v for k, v in results.items() if k.endswith("fp32")}, batches, 1e-5, torch.float32)
    want = reference(make_model("llama", torch.float32), batches, autocast=torch.bfloat16)
    got = results["llama zb-h1 bf16"]
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-2)
    assert relative_error(got["grads"], want["grads"]) < 5e-2

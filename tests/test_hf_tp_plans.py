"""Tensor-parallel plans are read from the model: every family pipesched splits takes the plan its
transformers config declares (``base_model_tp_plan``), but where one override of
``runtime/sharding/model_plans.py`` says what pipesched does differently and why, and each
override really differs from transformers' plan in the way its reason says. A Llama-like model
with no entry of its own anywhere in pipesched (Helium) trains under ``--tp 2`` as in one
process, and StarCoder2's declared plan splits its MLP too."""

from __future__ import annotations

import json

import pytest
from conftest import concurrently

pytest.importorskip("transformers")
import torch  # noqa: E402
from hf_cases import make_config  # noqa: E402

pytestmark = [pytest.mark.torch]

# every family pipesched splits, in each of the layouts its overrides tell apart (tests/hf_cases.py)
KINDS = ["llama", "gpt2", "qwen3", "qwen3-moe", "mixtral", "cohere", "cohere-qk", "falcon", "falcon-grouped", "phi3",
         "phi3-gqa", "gemma", "gemma2", "gemma3", "olmo2", "qwen2-moe", "gpt-neox", "starcoder2", "granite",
         "deepseek-v3", "helium"]
GATHERING = {"colwise_gather_output", "rowwise_split_input"}  # transformers' styles that compute a block whole


def _names(model) -> list[str]:
    """Every module name of ``model`` (and, for head counts, ``module.attribute``)."""
    names = []
    for name, module in model.named_modules():
        names += [name, *(f"{name}.{attr}" for attr in vars(module) if not attr.startswith("_"))]
        names += [f"{name}.config.{attr}" for attr in ("num_attention_heads",) if hasattr(module, "config")]
    return names


def _reason_holds(why, key: str, style: str, declared: dict) -> bool:
    """Whether the entry ``key: style`` differs from transformers' ``declared`` plan as ``why`` says."""
    from pipesched.runtime.sharding.model_plans import TRANSLATED, WHOLE, Why

    theirs = declared.get(key)
    return theirs != style and {
        Why.UNDECLARED: not declared,
        Why.SPLIT_FOR_REAL: style != WHOLE and (theirs is None or theirs in GATHERING),
        Why.OWN_STYLE: theirs is None or theirs not in TRANSLATED,
        Why.ADDED: theirs is None and style != WHOLE,
        Why.KEPT_WHOLE: theirs is not None and style == WHOLE,
    }[why]


def test_every_family_takes_transformers_plan_but_where_an_override_says_why_it_differs():
    from pipesched.runtime.sharding.model_plans import OVERRIDES, WHOLE, Why, declared_plan, overrides_for, plan_for
    from pipesched.hf.build import meta_model
    from pipesched.runtime.sharding.tp_plans import HEADS, _head_counts, _matches
    from pipesched.sharded_bytes import TP_STYLES

    used = set()
    for kind in KINDS:
        config = make_config(kind)
        model = meta_model(config)
        name, modules = type(model).__name__, _names(model)
        declared, overrides = declared_plan(config), overrides_for(name, config)
        plan = plan_for(name, config)
        assert plan, kind
        assert set(plan.values()) <= set(TP_STYLES) | {HEADS}, kind
        # each head count divided once: by its module, or through the object its module holds (Phi-3's
        # config, shared by every layer until apply_tp gives each attention its own copy), never both
        counts = list(_head_counts(model, plan))
        direct = [(id(sub), attr) for _, sub, held, attr in counts if not held]
        through = {(id(getattr(sub, held)), attr) for _, sub, held, attr in counts if held}
        assert len(direct) == len(set(direct)) and not through & set(direct), kind
        if not overrides:  # transformers' plan, as it is
            assert plan == declared, kind
            continue
        assert plan == {k: v for k, v in {**declared, **{k: v for o in overrides for k, v in o.entries.items()}}.items()
                        if v != WHOLE}, kind
        for override in overrides:
            used.add(id(override))
            assert any(_reason_holds(override.why, key, style, declared) for key, style in override.entries.items())
            for key, style in override.entries.items():
                assert _reason_holds(override.why, key, style, declared), (kind, override.why, key, style)
                assert any(_matches(module, key) for module in modules), (kind, key)  # no entry names nothing
    # every override is exercised, and the reasons cover what the families need
    assert used == {id(o) for group in OVERRIDES.values() for o in group}
    assert {o.why for group in OVERRIDES.values() for o in group} == set(Why)


def test_a_config_that_declares_a_style_pipesched_lacks_has_no_plan_and_its_own_declaration_is_read():
    from pipesched.runtime.sharding.model_plans import plan_for, untranslated

    config = make_config("helium")
    config.base_model_tp_plan = {**config.base_model_tp_plan, "layers.*.self_attn.q_norm": "sequence_parallel"}
    assert plan_for("HeliumForCausalLM", config) is None
    assert untranslated("HeliumForCausalLM", config) == {"layers.*.self_attn.q_norm": "sequence_parallel"}
    config.base_model_tp_plan = {"layers.*.mlp.down_proj": "rowwise", "layers.*.mlp.up_proj": "colwise"}
    assert plan_for("HeliumForCausalLM", config) == config.base_model_tp_plan  # a config.json's own plan


TRAIN = ["train", "--batch-size", "8", "--steps", "3", "--lr", "0.05", "--optimizer", "sgd"]


@pytest.mark.parametrize("kind, tp, refused", [("falcon", 2, None), ("phi3-gqa", 4, None),
                                               ("falcon-grouped", 4, 2), ("phi3", 3, 4)])
def test_tp_divides_only_the_heads_of_an_attention_the_plan_splits(tmp_path, kind, tp, refused):
    """Falcon 7B's multi-query layout (1 key-value head) and Phi-3 with fewer key-value than query
    heads keep the attention whole on every tp rank and split only the MLP: a ``tp`` that divides
    none of their key-value heads is no refusal. Where the plan splits the attention (Falcon 40B's
    grouped layout, Phi-3 with equal heads) every head count must divide, and the first that does
    not is named."""
    from pipesched.errors import ConfigError
    from pipesched.runtime.sharding.tp_plans import splits_attention
    from pipesched.training.launch_checks import check_tp
    from pipesched.training.models import get_model

    make_config(kind).to_json_file(tmp_path / "config.json")
    md = get_model(f"hf:{tmp_path / 'config.json'}")
    assert any(heads % tp for heads in md.heads)  # some head count of the model tp does not divide
    assert splits_attention(md.tp_plan) == (refused is not None)
    if refused is None:
        check_tp(md, tp)
    else:
        with pytest.raises(ConfigError, match=f"tp={tp} does not divide the {refused} attention heads of hf:"):
            check_tp(md, tp)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_helium_and_falcon_multi_query_train_under_tp_as_in_one_process_and_starcoder2_splits_its_mlp(tmp_path, forked_cli):
    """Helium from its declared plan alone, and Falcon 7B's multi-query layout (its one key-value
    head: the attention whole on every tp rank, the MLP split): ``--tp 2`` (4 processes) against
    one process, 3 SGD steps in fp32. The two differ only in the order of fp32 sums: a row-wise layer adds two partial dot
    products of 16 or 32 terms, the loss is the mean of 4 microbatches' means. Each reordering
    moves a sum by at most ``2 (n - 1) u sum|terms|`` (u = 2**-24): under 4e-6 of a sum of up to
    64 terms even where they cancel tenfold, carried into weights that an SGD step at lr 0.05
    changes by a few percent (measured: 3e-8 on the losses, 6e-8 on the weights). A gradient left
    partial by a plan moves weights by 1e-4 after 3 steps (Qwen3's norms under Llama's plan), so
    1e-5 tells the two apart. StarCoder2's declared plan splits its MLP (``c_fc``, ``c_proj``):
    its fullest rank holds about 0.6 of its stage's parameters under ``--tp 2`` (0.75 with the MLP
    whole: embeddings, norms and biases stay whole)."""
    import pipesched
    from pipesched.training.launch_checks import rank_state, stage_specs
    from pipesched.parallel_layout import ParallelLayout
    from pipesched.training.models import get_model

    runs = []
    kinds = ("helium", "starcoder2", "falcon")
    for kind in kinds:
        make_config(kind).to_json_file(tmp_path / f"{kind}.json")
        for label, args in (("tp", ["--ranks", "2", "--tp", "2", "-s", "1f1b"]), ("one", ["-s", "none"])):
            runs.append([*TRAIN, "--model", f"hf:{tmp_path / kind}.json", *args,
                         "--summary", str(tmp_path / f"{kind}-{label}.json"),
                         "--save-params", str(tmp_path / f"{kind}-{label}.pt")])
    for done in concurrently(lambda args: forked_cli(*args, timeout=540), runs, workers=2):  # one import of torch for all
        assert done.returncode == 0, done.stderr
    for kind in kinds:
        got, want = (json.loads((tmp_path / f"{kind}-{x}.json").read_text()) for x in ("tp", "one"))
        got_w, want_w = (torch.load(tmp_path / f"{kind}-{x}.pt") for x in ("tp", "one"))
        assert got["losses"] == pytest.approx(want["losses"], rel=1e-5), kind
        assert got_w.keys() == want_w.keys()
        for name in want_w:
            assert float((got_w[name] - want_w[name]).abs().max() / want_w[name].abs().max()) < 1e-5, (kind, name)

    split = json.loads((tmp_path / "starcoder2-tp.json").read_text())
    md = get_model(f"hf:{tmp_path / 'starcoder2.json'}")
    plan = pipesched.build_schedule("1f1b", 2, split["microbatches"])
    whole = [rank_state(plan, stage_specs(md, plan, None, 1), ParallelLayout(2), 0, r)["params"] for r in range(2)]
    held = {r["rank"]: r["measured_state_bytes"]["params"] for r in split["memory"]}
    # tp halves the attention's and the MLP's matrices and the column-wise biases; the embeddings (or
    # the head), the norms and the row-wise biases stay whole: 0.59 of a stage (the MLP whole: 0.75)
    assert 0.55 < max(held[r] / whole[r] for r in range(2)) < 0.65

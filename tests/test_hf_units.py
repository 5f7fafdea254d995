"""pipesched.hf in one process: GPT-2's Conv1D in the split backward, the split, and what is refused."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from hf_cases import make_batch, make_config, make_model  # noqa: E402

import pipesched  # noqa: E402
from pipesched.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.torch


def test_conv1d_weight_gradients_are_deferred_to_w_and_equal_autograds():
    from transformers.pytorch_utils import Conv1D

    from pipesched.hf.splitting import prepare_split_backward
    from pipesched.runtime.engine.split_backward import (
        WeightGradStash,
        apply_weight_grads,
        make_weight_grads_deferrable,
    )

    torch.manual_seed(0)
    plain = Conv1D(6, 4)  # 4 in, 6 out, weight (4, 6)
    plain.bias.data.normal_()
    split = Conv1D(6, 4)
    split.load_state_dict(plain.state_dict())
    prepare_split_backward()
    stash = WeightGradStash()
    assert make_weight_grads_deferrable(split, stash) == 1
    x = torch.randn(3, 5, 4)
    g = torch.randn(3, 5, 6)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.autograd.backward(plain(xa), g)
    stash.collecting = entries = []
    torch.autograd.backward(split(xb), g)  # I: the input gradient only
    stash.collecting = None
    assert split.weight.grad is None and len(entries) == 1
    assert torch.allclose(xb.grad, xa.grad, atol=1e-6)
    apply_weight_grads(entries)  # W
    assert torch.allclose(split.weight.grad, plain.weight.grad, atol=1e-6)
    assert torch.allclose(split.bias.grad, plain.bias.grad, atol=1e-6)


def test_blocks_carry_the_models_names_and_compute_its_logits():
    from pipesched.hf.architectures import architecture_of
    from pipesched.hf.blocks import model_blocks

    for kind in ("llama", "gpt2", "qwen3"):
        model = make_model(kind, torch.float32)
        blocks = model_blocks(model, architecture_of(model))
        names = [n for b in blocks for n in b.state_dict()]
        assert sorted(names) == sorted(model.state_dict()), kind
        h = make_batch(0, 2, 16)["input_ids"]
        want = model(input_ids=h).logits
        for block in blocks:
            h = block(h)
        assert torch.allclose(h, want, atol=1e-6), kind


def test_split_puts_the_embeddings_first_and_the_head_last():
    from pipesched.hf.split import stage_block_counts

    schedule = pipesched.build_schedule("1f1b", 2, 4)
    costs = [0.01, 1, 1, 1, 1, 0.5]
    assert stage_block_counts(schedule, costs, (1, 3)) == [2, 4]
    assert stage_block_counts(schedule, costs, None) == [3, 3]
    with pytest.raises(ConfigError, match="sum to 4"):
        stage_block_counts(schedule, costs, (1, 2))
    with pytest.raises(ConfigError, match="8 stages but a model of 4 decoder layers splits into at most 6"):
        stage_block_counts(pipesched.build_schedule("zb-v", 4, 8), costs, None)


def test_refusals_in_one_line(tmp_path):
    from pipesched import hf
    from pipesched.hf.pipeline import check_batch

    schedule = pipesched.build_schedule("1f1b", 2, 4)
    batch = make_batch(0, 8, 16)
    with pytest.raises(ConfigError, match=f"^weights='{tmp_path}': no [*].safetensors files there$"):
        hf.pipeline(make_config("llama"), schedule, optimizer=torch.optim.SGD, sample_batch=batch, weights=tmp_path)
    moe = make_model("mixtral", torch.float32, output_router_logits=True)
    with pytest.raises(ConfigError, match="without the router's auxiliary loss: its load-balancing loss is a product"):
        hf.pipeline(moe, schedule, optimizer=torch.optim.SGD, sample_batch=batch)
    config = make_config("llama")
    with pytest.raises(ConfigError, match="a sequence of 33 tokens is longer than the model's 32 positions"):
        check_batch(make_batch(0, 2, 33), config)
    with pytest.raises(ConfigError, match="a batch is a dict of input_ids, labels"):
        check_batch({"input_ids": batch["input_ids"]}, config)
    from transformers import BertConfig, BertForMaskedLM

    with pytest.raises(ConfigError, match="cannot split BertForMaskedLM: it splits .*LlamaForCausalLM.*, and a causal "
                                          "LM laid out as Llama whose twin check passes$"):
        hf.pipeline(BertForMaskedLM(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                               num_attention_heads=2, intermediate_size=64)),
                    schedule, optimizer=torch.optim.SGD, sample_batch=batch)


def test_the_step_normalised_loss_gives_every_token_the_models_float32_weight_for_any_microbatch_count():
    """Three microbatches (``m = 3``, not a power of two), scaled as the runtime scales them
    (``loss * (1/m)``): the logits' gradients equal, bitwise, the model's on the whole batch for
    every number of counted tokens, though the cross-entropy is computed in float32 (loss.py)."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    from pipesched.hf.loss import StepNormalisedLoss

    g = torch.Generator().manual_seed(0)
    for counted in range(5, 60):
        logits = torch.randn(6, 12, 64, generator=g, dtype=torch.float64)
        labels = torch.randint(0, 64, (6, 12), generator=g)
        shifted = labels[:, 1:].reshape(-1)
        shifted[counted:] = -100
        labels[:, 1:] = shifted.view(6, 11)
        whole = logits.clone().requires_grad_()
        ForCausalLMLoss(whole, labels, 64).backward()
        split = logits.clone().requires_grad_()
        loss = StepNormalisedLoss(64, microbatches=3, replicas=1)
        loss.start_step(labels)
        for part, part_labels in zip(split.chunk(3), labels.chunk(3)):
            (loss(part, part_labels) * (1.0 / 3)).backward()
        assert torch.equal(split.grad, whole.grad), counted


FAMILY_CONFIGS = ["LlamaConfig", "MistralConfig", "MixtralConfig", "Qwen2Config", "Qwen3Config", "Qwen3MoeConfig",
                  "GPT2Config", "GemmaConfig", "Gemma2Config", "Gemma3TextConfig", "Phi3Config", "Olmo2Config",
                  "Qwen2MoeConfig", "GPTNeoXConfig", "Starcoder2Config", "FalconConfig", "CohereConfig",
                  "GraniteConfig", "DeepseekV3Config"]


def test_every_family_splits_as_its_model_computes_on_a_twin_of_its_real_config():
    """Each registered family's declaration, on a twin of its config class's defaults (the real
    model's settings: Gemma 2's soft-cap, Gemma 3's local and global layers, DeepSeek-V3's dense
    then MoE layers and latent attention): the blocks in order are the model (no refusal)."""
    import transformers as tf

    from pipesched.hf import twin
    from pipesched.hf.architectures import ARCHITECTURES, architecture_of
    from pipesched.hf.build import meta_model

    checked = set()
    for name in FAMILY_CONFIGS:
        config = getattr(tf, name)()
        skeleton = meta_model(config)
        twin.check(config, type(skeleton).__name__, architecture_of(skeleton))
        checked.add(type(skeleton).__name__)
    assert checked == set(ARCHITECTURES)


def test_a_registration_that_leaves_a_step_out_is_refused_in_one_line(monkeypatch):
    """Granite registered without its embedding multiplier (or Cohere as a plain Llama, without
    its logit scale; GPT-2 with Llama's module names) is refused before it trains, naming the part
    where the twin's blocks and the model part ways."""
    from dataclasses import replace

    import transformers as tf

    from pipesched import hf
    from pipesched.hf import architectures

    broken = dict(architectures.ARCHITECTURES)
    broken["GraniteForCausalLM"] = replace(broken["GraniteForCausalLM"], embedding_steps=())
    broken["CohereForCausalLM"] = architectures.LLAMA_LIKE
    broken["GPT2LMHeadModel"] = architectures.LLAMA_LIKE
    monkeypatch.setattr(architectures, "ARCHITECTURES", broken)
    schedule = pipesched.build_schedule("1f1b", 2, 4)
    differ = "its blocks in order differ from the model at"
    rows = [(tf.GraniteConfig(embedding_multiplier=12.0), rf"{differ} the embeddings \(.* relative\)$"),
            (tf.CohereConfig(), rf"{differ} the head \(norm, head, logit steps\) \(.* relative\)$"),
            (make_config("gpt2"), "its parts are not where declared: the model has no module 'model.layers'$")]
    for config, where in rows:
        name = hf.build.causal_lm_class(config).__name__
        with pytest.raises(ConfigError, match=f"^pipesched.hf cannot split {name} as declared: on a twin of its "
                                              f"config \\(a few layers, small widths\\) {where}"):
            hf.pipeline(config, schedule, optimizer=torch.optim.SGD, sample_batch=make_batch(0, 8, 16))


def test_a_classification_heads_dropout_does_not_refuse_the_causal_model():
    import transformers as tf

    from pipesched.hf.randomness import random_settings

    # GPT-NeoX's and Falcon's real configs set classifier_dropout=0.1 for their token classifiers,
    # which a *ForCausalLM never builds; the causal model's own dropouts still count
    assert random_settings(tf.GPTNeoXConfig()) == []
    assert random_settings(tf.GPTNeoXConfig(hidden_dropout=0.1)) == ["hidden_dropout=0.1"]

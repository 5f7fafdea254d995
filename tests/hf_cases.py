"""Tiny Hugging Face models, batches and the rank workers of the pipesched.hf tests (spawned
processes import this module by name)."""

from __future__ import annotations

import contextlib
import copy
from typing import Optional

import torch
from torch.overrides import TorchFunctionMode

STEPS = 3
VOCAB = 64
LR = 1e-3  # AdamW's, in every test


class Float64Throughout(TorchFunctionMode):
    """Every float32 a computation asks for becomes float64 (and the default dtype is float64).

    transformers' "float64" models are not float64 inside: RMSNorm casts the hidden state to
    float32, eager attention's softmax and the rotary tables are float32, the causal LM loss is
    computed on ``logits.float()``. A float64 run then rounds to float32 wherever those values
    pass, so a difference of float64's rounding (1e-16: a microbatch's matmul against the whole
    batch's, another thread count, another CPU's kernels) flips an float32 rounding whenever a
    value lies that close to a rounding boundary: a 6e-8 step, on some machines and not on
    others. Under this mode the model, in one process and pipelined, computes in float64
    throughout, so two summation orders differ by float64's rounding only, on every machine."""

    def __enter__(self):
        self.previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.set_default_dtype(self.previous)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        if kwargs.get("dtype") is torch.float32:
            kwargs = {**kwargs, "dtype": torch.float64}
        return func(*(torch.float64 if a is torch.float32 else a for a in args), **kwargs)


FAMILIES = {  # kind -> the config class whose defaults are the family's real model (GemmaConfig(): Gemma 7B)
    "gemma": "GemmaConfig", "gemma2": "Gemma2Config", "gemma3": "Gemma3TextConfig", "phi3": "Phi3Config",
    "olmo2": "Olmo2Config", "qwen2-moe": "Qwen2MoeConfig", "gpt-neox": "GPTNeoXConfig", "starcoder2": "Starcoder2Config",
    "falcon": "FalconConfig", "cohere": "CohereConfig", "granite": "GraniteConfig", "deepseek-v3": "DeepseekV3Config",
}
FAMILY_LAYERS = {"gemma3": 6}  # five sliding-window layers, then a global one


def family_config(kind: str, layers: Optional[int] = None):
    """The family's real config (its class's defaults: sliding windows, soft-caps, tied
    embeddings, MoE routing, latent attention as the family sets them) shrunk as the twin check
    shrinks it (pipesched.hf.twin), ``layers`` layers (4, 6 for Gemma 3), initialised at its usual scale."""
    import transformers as tf

    from pipesched.hf.twin import shrunken

    layers = layers or FAMILY_LAYERS.get(kind, 4)
    default = getattr(tf, FAMILIES[kind])(num_hidden_layers=layers)
    config = shrunken(default, layers)
    config.initializer_range = default.initializer_range
    config.max_position_embeddings = min(config.max_position_embeddings, 32)
    config.use_cache = False
    return config


def make_config(kind: str, **extra):
    """A tiny random-init config of ``kind`` (dropout 0, no cache)."""
    import transformers as tf

    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=32, use_cache=False)
    if kind in ("llama", "llama6"):  # llama6: 8 blocks, for 8 stages on 4 ranks
        config = tf.LlamaConfig(**{**small, "num_hidden_layers": 6 if kind == "llama6" else 4},
                                attn_implementation="eager")
    elif kind == "llama-sdpa":
        config = tf.LlamaConfig(**small, attn_implementation="sdpa")
    elif kind == "gpt2":
        config = tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=4, n_head=4, n_positions=32, resid_pdrop=0.0,
                               embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, bos_token_id=0, eos_token_id=0)
    elif kind == "qwen3":  # layers 0-1 full attention, 2-3 sliding windows of 4 tokens
        config = tf.Qwen3Config(**small, head_dim=8, use_sliding_window=True, sliding_window=4, max_window_layers=2)
    elif kind == "mixtral":
        config = tf.MixtralConfig(**small, num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.0,
                                   experts_implementation="eager")  # grouped_mm takes no float64
    elif kind == "qwen3-moe":  # layer 1 dense (mlp_only_layers), the others 4 experts, 2 per token
        config = tf.Qwen3MoeConfig(**small, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                   mlp_only_layers=[1], experts_implementation="eager")
    elif kind == "helium":  # Llama-like: split through architectures' fallback, in no table of pipesched's
        config = tf.HeliumConfig(**small, head_dim=8, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    elif kind == "cohere-qk":  # Cohere with Command R+'s per-head q/k norms (weights (heads, head_dim))
        config = family_config("cohere")
        config.use_qk_norm = True
    elif kind == "falcon-grouped":  # Falcon 40B's layout: q/k/v rows grouped by key-value head (2 of 4)
        config = family_config("falcon")
        config.new_decoder_architecture, config.num_kv_heads = True, 2
        config.num_key_value_heads = 2  # what FalconConfig derives from the two, once, when built
    elif kind == "phi3-gqa":  # Phi-3 with fewer key-value heads (2 of 4): q|k|v of unequal widths
        config = family_config("phi3")
        config.num_key_value_heads = 2
    elif kind.partition("/")[0] in FAMILIES:  # "gemma2/6": Gemma 2 of 6 layers
        name, _, layers = kind.partition("/")
        config = family_config(name, int(layers) if layers else None)
    else:
        raise ValueError(kind)
    for key, value in extra.items():
        setattr(config, key, value)
    return config


def make_model(kind: str, dtype: torch.dtype = torch.float64, seed: int = 0, **extra):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(make_config(kind, **extra)).to(dtype)


def padded_batches(steps: int = STEPS, batch: int = 8) -> list[dict]:
    """Right-padded batches whose length changes from step to step (each padded to its longest)."""
    return [make_batch(step, batch, (16, 12, 14)[step % 3], padded=True) for step in range(steps)]


def make_batch(step: int, batch: int, seq: int, padded: bool = False) -> dict:
    """Token ids with labels; some labels -100 (a different number per row), and with ``padded``
    right padding after a row-dependent length, masked out of attention and the loss."""
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
    labels = ids.clone()
    ignored = torch.rand(batch, seq, generator=g) < torch.linspace(0.0, 0.6, batch)[:, None]
    labels[ignored] = -100
    out = {"input_ids": ids, "labels": labels}
    if padded:
        lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=g)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        labels[mask == 0] = -100
        out["attention_mask"] = mask
    return out


def adamw(params):
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.01)


def sgd(params):
    return torch.optim.SGD(params, lr=LR)


OPTIMIZERS = {"adamw": adamw, "sgd": sgd}


@contextlib.contextmanager
def one_thread():
    """Tiny models on one thread, as the ranks run them: more threads only wait for each other
    (seconds a step on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def in_dtype(dtype: torch.dtype):
    """Where a model of ``dtype`` runs: a float64 model float64 throughout, others as they are."""
    return Float64Throughout() if dtype == torch.float64 else contextlib.nullcontext()


def reference(model, batches: list[dict], autocast: Optional[torch.dtype] = None, optimizer: str = "adamw") -> dict:
    """The single-process model on the whole batches (under ``autocast`` if given; a float64
    model float64 throughout): every loss, the first gradients, every step's gradients
    (``step_grads``), the final weights; ``optimizer`` names one of ``OPTIMIZERS``."""

    def step(model, index: int, batch: dict) -> float:
        with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            loss = model(**batch).loss
        loss.backward()
        return loss.item()

    return _train(model, batches, OPTIMIZERS[optimizer], step)


def keyed_reference(model, batches: list[dict], microbatches: int, seed: int = 0) -> dict:
    """What a pipeline of ``model`` computes when it draws (dropout, router noise): the model's
    blocks microbatch by microbatch, keyed as the pipeline keys them (``hf.one_process_step``),
    float64 throughout for a float64 model; what :func:`reference` returns."""
    from pipesched import hf

    def step(model, index: int, batch: dict) -> float:
        return hf.one_process_step(model, batch, microbatches=microbatches, seed=seed, step=index)

    return _train(model, batches, adamw, step)


def _train(model, batches: list[dict], optimizer, step) -> dict:
    """A copy of ``model`` trained on ``batches``, ``step(model, index, batch)`` computing each
    step's loss and gradients, on one thread (as the ranks run), a float64 model float64 throughout."""
    model = copy.deepcopy(model)
    optimizer = optimizer(list(model.parameters()))
    losses, step_grads = [], []
    for index, batch in enumerate(batches):
        optimizer.zero_grad(set_to_none=True)
        with in_dtype(next(model.parameters()).dtype), one_thread():
            losses.append(step(model, index, batch))
        step_grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)})
        optimizer.step()
    return {"losses": losses, "grads": step_grads[0], "step_grads": step_grads,
            "params": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def run_pipelines(rank: int, world: int, job: dict) -> dict:
    """For every (label, model kind, schedule) of ``job``: train STEPS steps of ``job["batches"]``
    with pipesched.hf; rank 0 returns losses, first gradients and final weights by the model's names."""
    from pipesched import hf
    from pipesched.runtime.comm.mesh import init_pipeline_mesh
    from pipesched.runtime.options import RuntimeOptions

    out, meshes = {}, {}
    for label, kind, schedule, options in job["runs"]:
        options = dict(options)
        dtype = options.pop("model_dtype", torch.float64)
        model = make_model(kind, dtype, **options.pop("config", {}))
        dp = options.pop("dp", world // schedule.ranks)
        if dp not in meshes:
            meshes[dp] = init_pipeline_mesh(schedule.ranks, dp)
        batches = job[options.pop("batches", "batches")]
        optimizer = OPTIMIZERS[options.pop("optimizer", "adamw")]
        with in_dtype(dtype):
            rt = hf.pipeline(model, schedule, optimizer=optimizer, sample_batch=batches[0], mesh=meshes[dp],
                             options=RuntimeOptions(timeout_s=60, **options))
            losses, grads = [], None
            for step, batch in enumerate(batches):
                losses.append(rt.step(batch).loss)
                if step == 0:
                    grads = rt.gather_gradients()
            params = rt.gather_state_dict()
        out[label] = {"losses": losses, "grads": grads, "params": params,
                      "deferred": rt.deferred_weight_grad_share()}
    return out


def held_numel(module) -> int:
    """Elements of ``module``'s parameters that hold storage (not on meta)."""
    return sum(p.numel() for p in module.parameters() if not p.is_meta)


def save_and_resume(rank: int, world: int, job: dict) -> dict:
    """A Llama built from its config: 2 steps under zb-v, a checkpoint and a save_pretrained
    folder, then a fresh 1f1b pipeline from that folder's weights and a 1f1b pipeline resuming
    the checkpoint for the last step. Rank 0 returns what each stage of that gathered."""
    import pipesched
    from pipesched import hf

    config, batches, folder = make_config("llama"), job["batches"], job["folder"]
    zbv = pipesched.build_schedule("zb-v", world, 4)
    one = pipesched.build_schedule("1f1b", world, 4)
    out = {}
    rt = hf.pipeline(config, zbv, optimizer=adamw, sample_batch=batches[0], seed=5)
    own = sum(p.numel() for p in rt.runtime.parameters)
    for batch in batches[:2]:
        rt.step(batch)
    hf.save_checkpoint(rt, f"{folder}/ck")
    hf.save_pretrained(rt, f"{folder}/saved")
    out["after_two"] = rt.gather_state_dict()
    loaded = hf.pipeline(config, one, optimizer=adamw, sample_batch=batches[0], weights=f"{folder}/saved")
    out["loaded"] = loaded.gather_state_dict()
    resumed = hf.pipeline(config, one, optimizer=adamw, sample_batch=batches[0], seed=99)
    from pipesched.runtime.checkpoints import checkpoint

    out["resumed_from"] = hf.load_checkpoint(resumed, checkpoint.latest(f"{folder}/ck"))
    resumed.step(batches[2])
    out["resumed"] = resumed.gather_state_dict()
    # the 4 layers' checkpoint into a 2-layer model: every rank's own part is in it, the whole is not
    smaller = hf.pipeline(make_config("llama", num_hidden_layers=2), one, optimizer=adamw, sample_batch=batches[0])
    try:
        hf.load_checkpoint(smaller, checkpoint.latest(f"{folder}/ck"))
    except checkpoint.CheckpointMismatch as refused:  # on every rank alike, before any collective
        out["larger_refused"] = str(refused)
    # GPT-2's tied weight: one Parameter on zb-v's rank 0, a copy on each rank under 1f1b
    gpt2 = make_config("gpt2")
    with Float64Throughout():  # built from the config in float64, and computed so
        tied = hf.pipeline(gpt2, zbv, optimizer=adamw, sample_batch=batches[0], seed=5)
        tied.step(batches[0])
        hf.save_checkpoint(tied, f"{folder}/ck-gpt2")
        apart = hf.pipeline(gpt2, one, optimizer=adamw, sample_batch=batches[0], seed=99)
        hf.load_checkpoint(apart, checkpoint.latest(f"{folder}/ck-gpt2"))
        apart.step(batches[1])
        out["gpt2_resumed"] = apart.gather_state_dict()
    model = make_model("llama", torch.float32)  # built whole on every rank, then pipelined
    before = held_numel(model)
    kept = hf.pipeline(model, one, optimizer=adamw, sample_batch=batches[0])
    held = [before, held_numel(model), sum(p.numel() for p in kept.runtime.parameters), own]
    import torch.distributed as dist

    parts = [None] * world
    dist.all_gather_object(parts, held)
    out["held"] = parts
    return out if rank == 0 else None


def several(rank: int, world: int, jobs: dict) -> dict:
    """Run each (worker name, job) of ``jobs`` in one launch; rank 0 returns their results by key."""
    return {key: globals()[worker](rank, world, job) for key, (worker, job) in jobs.items()}

"""The two models ``pipesched train`` runs, each an ordered list of blocks (the unit of partitioning).

- ``mlp``: residual pre-norm MLP blocks (LN -> Linear d->h -> GELU -> Linear h->d, residual) and a
  Linear head, regression on random data (MSE).
- ``gpt``: a small character-level GPT: an embedding block (token + position), pre-norm transformer
  blocks (causal self-attention and MLP, every projection an ``nn.Linear``), a head block (final LN
  + Linear), cross-entropy on the text shipped in ``pipesched/data``.

Every block maps one tensor to one tensor, so any contiguous run of blocks is a stage.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .datasets import random_regression_batch, text_batch, text_vocabulary
from .model_def import ModelDef


class ResidualMLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Embedding(nn.Module):
    def __init__(self, vocab: int, dim: int, context: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(context, dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tokens(idx) + self.positions(pos)


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention whose ``qkv`` rows hold each head's q, k and v together
    (Megatron's layout): a column-wise tensor-parallel split of ``qkv`` hands each rank whole
    heads, which then computes ``heads`` of them (the plan divides it by ``tp``)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, self.heads, 3, -1).permute(3, 0, 2, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Head(nn.Module):
    def __init__(self, dim: int, out: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def mlp_model(blocks: int = 8, dim: int = 256, hidden: int = 1024) -> ModelDef:
    """``blocks`` residual MLP blocks and a Linear head (``blocks + 1`` partitionable blocks)."""

    def build(i: int) -> nn.Module:
        return ResidualMLP(dim, hidden) if i < blocks else nn.Linear(dim, dim)

    def batch(step: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        return random_regression_batch(step, size, seed, dim)

    costs = (1.0,) * blocks + (dim / (2 * hidden),)  # the head's matmul against a block's two
    return ModelDef("mlp", blocks + 1, build, F.mse_loss, batch, costs)


def gpt_model(layers: int = 4, dim: int = 128, heads: int = 4, context: int = 64) -> ModelDef:
    """A character-level GPT: embedding, ``layers`` transformer blocks, head (``layers + 2`` blocks)."""
    vocab = len(text_vocabulary())

    def build(i: int) -> nn.Module:
        if i == 0:
            return Embedding(vocab, dim, context)
        if i <= layers:
            return TransformerBlock(dim, heads)
        return Head(dim, vocab)

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def batch(step: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        return text_batch(step, size, seed, context)

    layer = 12 * dim * dim + 2 * context * dim  # per token: projections and MLP, attention
    costs = (0.02,) + (1.0,) * layers + (dim * vocab / layer,)
    from ..runtime.sharding.tp_plans import GPT_PLAN

    return ModelDef("gpt", layers + 2, build, loss, batch, costs, tp_plan=GPT_PLAN, heads=(heads,))


MODELS = {"mlp": mlp_model, "gpt": gpt_model}
HF_PREFIX = "hf:"  # hf:CONFIG.json, a Hugging Face causal LM (pipesched.hf)
KNOWN = "mlp, gpt or hf:CONFIG.json (a Hugging Face causal LM's config)"


def is_known(name: str) -> bool:
    return name in MODELS or name.startswith(HF_PREFIX)


def get_model(name: str, **size) -> ModelDef:
    """A model by name (``mlp``, ``gpt``, or ``hf:CONFIG.json``); ``size`` overrides its
    dimensions (for ``hf:``, ``data``, ``weights`` and ``context``: :mod:`pipesched.hf.cli_model`)."""
    if name.startswith(HF_PREFIX):
        try:
            import transformers  # noqa: F401  (imported for hf_model_def in any case)
        except ImportError:
            raise ConfigError(f"--model {name} needs Hugging Face transformers: pip install 'pipesched[hf]'") from None
        from ..hf.cli_model import hf_model_def

        return hf_model_def(name[len(HF_PREFIX):], **size)
    return MODELS[name](**size)

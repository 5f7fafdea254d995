"""A transformer's dimensions and what they cost per layer (the Zero Bubble paper's formulas).

Per transformer layer, for a microbatch of ``b`` sequences of ``s`` tokens, hidden size ``h`` and
``a`` attention heads (Qi et al. 2024, Table 1; Korthikanti et al. 2022 for the activations):

- forward ``F``: ``s*b*h*(24h + 4s)`` FLOPs; input-gradient backward ``B``: ``s*b*h*(24h + 8s)``;
  weight-gradient backward ``W``: ``24*s*b*h^2``;
- activations held from F to its backward, per value of ``d`` bytes (``dtype_bytes``, 2 for
  16-bit): ``16*s*b*h*d`` (Korthikanti's ``34sbh`` less the two dropout masks, which only a
  model trained with dropout keeps: ``dropout=True`` adds them, one byte per value). Eager
  attention (``attention="eager"``) also keeps its softmax output, ``a*s*s*b*d`` (``5as^2b``
  with dropout's mask and output); flash / SDPA attention keeps none of it, only its
  ``a*s*b`` fp32 log-sum-exp. At 16 bits without dropout, ``32sbh`` flash, ``sbh(32 + 2as/h)``
  eager;
- what ``I`` leaves for ``W`` (the Zero Bubble paper's per-layer parts): the input and output
  gradient of each of the four Linears, ``16*s*b*h*d`` (``7sbh`` inputs, ``9sbh`` gradients);
- a recomputed layer keeps only its input, ``s*b*h*d`` (each layer recomputed on its own, as
  the runtime does), and is rebuilt, one layer at a time, in its stage's backward;
- parameters: ``12h^2 + 13h`` (:meth:`TransformerSpec.layer_specs`, the shapes whose bytes per
  rank :mod:`pipesched.sharded_bytes` counts under any layout).

The token embedding has ``V*h`` parameters (``ends="gpt"``: also ``s*h`` learned positions; the
head a final LayerNorm and a bias besides its ``V*h``, as pipesched's built-in gpt and GPT-2) (its work, counted as one operation per token and
width, is next to nothing); the output head takes ``2*s*b*h*V`` FLOPs for each of F, B and W, and
its logits are counted as ``s*b*(2h + 4V)`` bytes (its input plus fp32 logits). Between stages
one activation of ``2*s*b*h`` bytes crosses per microbatch.

With ``experts`` (:class:`~.transformer_experts.Experts`) every layer's MLP is a router and
experts instead: the layer's figures are its attention's part of the above and the experts'
(:mod:`.transformer_experts`). The first ``dense_layers`` keep a dense MLP: their FLOPs,
activations and bytes are a dense layer's (``experts=False`` of each figure; which stages hold
them: :meth:`TransformerSpec.dense_per_stage`).

These are the model's own figures, whatever the pipeline and the hardware; :mod:`.estimate`
lays them out over a pipeline's stages and turns them into milliseconds and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from math import prod
from typing import Optional, Sequence

from ..errors import ConfigError
from ..sharded_bytes import ParamSpec, tp_dims
from .transformer_experts import Experts

ATTENTION_KERNELS = ("flash", "eager")
ENDS = ("bare", "gpt")  # the embedding and head: V x h each; or also learned positions, final norm, head bias
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class TransformerSpec:
    """A GPT-style decoder: ``layers`` identical blocks, optional embedding and head."""

    layers: int
    hidden: int
    seq_len: int
    microbatch_size: int
    heads: Optional[int] = None  # default: hidden // 64 (64-wide heads)
    vocab: Optional[int] = None  # None: no embedding or head
    attention: str = "flash"  # flash / SDPA (keeps no score matrix) or eager
    dtype_bytes: int = 2  # bytes per activation value: 2 (bf16, fp16) or 4 (fp32)
    dropout: bool = False
    ends: str = "bare"  # one of ENDS
    experts: Optional[Experts] = None  # None: a dense MLP in every layer

    def __post_init__(self) -> None:
        if self.ends not in ENDS:
            raise ConfigError(f"ends {self.ends!r} is not known: use one of {', '.join(ENDS)}")
        if self.attention not in ATTENTION_KERNELS:
            raise ConfigError(f"attention {self.attention!r} is not known: use one of {', '.join(ATTENTION_KERNELS)}")
        if self.dtype_bytes not in (2, 4):
            raise ConfigError(f"bytes per activation value must be 2 or 4, got {self.dtype_bytes!r}")
        for label in ("layers", "hidden", "seq_len", "microbatch_size"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"model {label.replace('_', ' ')} must be a whole number of at least 1, got {value!r}")
        for label in ("heads", "vocab"):
            value = getattr(self, label)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"model {label} must be a whole number of at least 1, got {value!r}")

        if self.experts is not None and self.experts.dense_layers > self.layers:
            raise ConfigError(f"{self.experts.dense_layers} dense layers but the model has {self.layers} layers")

    @property
    def head_count(self) -> int:
        return self.heads if self.heads is not None else max(1, self.hidden // 64)

    @property
    def dense_layers(self) -> int:
        """Layers with a dense MLP at the model's start (0 without experts: every layer is alike)."""
        return self.experts.dense_layers if self.experts is not None else 0

    def dense_per_stage(self, counts: Sequence[int]) -> tuple[int, ...]:
        """How many of each stage's layers (``counts``, in model order) are the first dense ones."""
        out, before = [], 0
        for n in counts:
            out.append(max(0, min(n, self.dense_layers - before)))
            before += n
        return tuple(out)

    def layer_flops(self, b: float, experts: bool = True) -> tuple[float, float, float]:
        """F, B, W FLOPs of one layer for a microbatch of ``b`` sequences (``experts=False``: one
        of the first dense layers)."""
        s, h = self.seq_len, self.hidden
        if self.experts is None or not experts:
            return s * b * h * (24 * h + 4 * s), s * b * h * (24 * h + 8 * s), 24.0 * s * b * h * h
        mlp = self.experts.mlp_flops(s * b, h)  # in place of the dense MLP's 16h^2 per token and pass
        return s * b * h * (8 * h + 4 * s) + mlp, s * b * h * (8 * h + 8 * s) + mlp, 8.0 * s * b * h * h + mlp

    def head_flops(self, b: float) -> float:
        """FLOPs of each of the head's F, B and W (zero without a vocabulary)."""
        return 2.0 * self.seq_len * b * self.hidden * self.vocab if self.vocab else 0.0

    def embedding_flops(self, b: float) -> float:
        """Work of each of the embedding's F, B and W, counted as one operation per token and
        width (the lookup copies a row, its backward adds one into the gradient): next to
        nothing, but not nothing, so that a stage holding the embedding alone takes some time
        (zero without a vocabulary)."""
        return float(self.seq_len * b * self.hidden) if self.vocab else 0.0

    def layer_activation_bytes(self, b: float, experts: bool = True) -> float:
        """Bytes one layer keeps from F to its backward (see the module docstring)."""
        s, h, a, d = self.seq_len, self.hidden, self.head_count, self.dtype_bytes
        held = 16 * s * b * h * d + 2 * s * b * h * self.dropout
        if self.experts is not None and experts:  # the dense MLP's 9sbh values (fc1's input, output, activation) replaced
            held += self.experts.kept_bytes(s * b, h, d) - 9 * s * b * h * d
        if self.attention == "eager":
            held += a * s * s * b * (d + 3 * self.dropout)  # softmax output (+ dropout's mask and output)
        else:
            held += 4 * a * s * b  # the kernel's fp32 log-sum-exp
        return held

    def layer_stash_bytes(self, b: float, experts: bool = True) -> float:
        """Bytes one layer's ``I`` leaves for its ``W``: each Linear's input and output gradient."""
        tokens, h, d = self.seq_len * b, self.hidden, self.dtype_bytes
        if self.experts is None or not experts:
            return 16 * tokens * h * d
        return 6 * tokens * h * d + self.experts.stash_bytes(tokens, h, d)  # attention's 6sbh, then the experts'

    def head_activation_bytes(self, b: float) -> float:
        return self.seq_len * b * (self.dtype_bytes * self.hidden + 4 * self.vocab) if self.vocab else 0.0

    def layer_specs(self, experts: bool = True) -> tuple[ParamSpec, ...]:
        """One block's parameters as pipesched's gpt builds it (pre-norm LayerNorms, Linears with
        biases; q, k and v in one matrix), with the dims Megatron's tensor parallelism splits:
        ``qkv`` and ``fc1`` column-wise, ``proj`` and ``fc2`` row-wise. ``12h^2 + 13h`` elements.
        With experts (and ``experts``: not one of the first dense layers) the MLP is the router
        and the shared experts; the routed ones are :meth:`Experts.routed_specs`, split by EP."""
        h = self.hidden
        norm = [ParamSpec((h,)), ParamSpec((h,))]
        attention = norm + _linear(3 * h, h, "colwise") + _linear(h, h, "rowwise") + norm
        if experts and self.experts is not None:
            return tuple(attention) + self.experts.shared_specs(h)
        return tuple(attention + _linear(4 * h, h, "colwise") + _linear(h, 4 * h, "rowwise"))

    def embedding_specs(self, vocab_parallel: bool = True) -> tuple[ParamSpec, ...]:
        """The first stage's embedding (none without a vocabulary); ``vocab_parallel``: tensor
        parallelism splits the vocabulary (torchtitan, Megatron) rather than replicating it."""
        if not self.vocab:
            return ()
        tokens = ParamSpec((self.vocab, self.hidden), 0 if vocab_parallel else None)
        return (tokens,) + ((ParamSpec((self.seq_len, self.hidden)),) if self.ends == "gpt" else ())

    def head_specs(self, vocab_parallel: bool = True) -> tuple[ParamSpec, ...]:
        """The last stage's head: the output matrix, and with ``ends="gpt"`` its final norm and bias."""
        if not self.vocab:
            return ()
        if self.ends == "bare":
            return (ParamSpec((self.vocab, self.hidden), 0 if vocab_parallel else None),)
        norm = (ParamSpec((self.hidden,)), ParamSpec((self.hidden,)))
        return norm + tuple(_linear(self.vocab, self.hidden, "colwise" if vocab_parallel else None))

    @cached_property
    def layer_params(self) -> int:
        """One block's elements, all its experts included (the most a block has)."""
        routed = self.experts.routed_specs(self.hidden, 1) if self.experts is not None else ()
        return sum(prod(p.shape) for p in self.layer_specs() + routed)

    @cached_property
    def embedding_params(self) -> int:
        """The token embedding's elements (what each end counts in the pipeline-only advisor's
        layer balance and gradient sizes)."""
        return self.vocab * self.hidden if self.vocab else 0

    def p2p_bytes(self, b: float) -> float:
        """One stage boundary's activation (also all a recomputed layer keeps)."""
        return float(self.dtype_bytes * self.seq_len * b * self.hidden)


def _linear(out: int, inp: int, style: Optional[str]) -> list[ParamSpec]:
    """An ``nn.Linear(inp, out)``'s weight and bias, split as tensor-parallel ``style`` splits
    them (None: replicated)."""
    weight, bias = tp_dims(style) if style else (None, None)
    return [ParamSpec((out, inp), weight), ParamSpec((out,), bias)]

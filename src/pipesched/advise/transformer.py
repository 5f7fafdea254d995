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
- parameters: ``12h^2 + 13h``.

The token embedding has ``V*h`` parameters (its work, counted as one operation per token and
width, is next to nothing); the output head takes ``2*s*b*h*V`` FLOPs for each of F, B and W, and
its logits are counted as ``s*b*(2h + 4V)`` bytes (its input plus fp32 logits). Between stages
one activation of ``2*s*b*h`` bytes crosses per microbatch.

These are the model's own figures, whatever the pipeline and the hardware; :mod:`.estimate`
lays them out over a pipeline's stages and turns them into milliseconds and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import ConfigError

ATTENTION_KERNELS = ("flash", "eager")
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

    def __post_init__(self) -> None:
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

    @property
    def head_count(self) -> int:
        return self.heads if self.heads is not None else max(1, self.hidden // 64)

    def layer_flops(self, b: float) -> tuple[float, float, float]:
        """F, B, W FLOPs of one layer for a microbatch of ``b`` sequences."""
        s, h = self.seq_len, self.hidden
        return s * b * h * (24 * h + 4 * s), s * b * h * (24 * h + 8 * s), 24.0 * s * b * h * h

    def head_flops(self, b: float) -> float:
        """FLOPs of each of the head's F, B and W (zero without a vocabulary)."""
        return 2.0 * self.seq_len * b * self.hidden * self.vocab if self.vocab else 0.0

    def embedding_flops(self, b: float) -> float:
        """Work of each of the embedding's F, B and W, counted as one operation per token and
        width (the lookup copies a row, its backward adds one into the gradient): next to
        nothing, but not nothing, so that a stage holding the embedding alone takes some time
        (zero without a vocabulary)."""
        return float(self.seq_len * b * self.hidden) if self.vocab else 0.0

    def layer_activation_bytes(self, b: float) -> float:
        """Bytes one layer keeps from F to its backward (see the module docstring)."""
        s, h, a, d = self.seq_len, self.hidden, self.head_count, self.dtype_bytes
        held = 16 * s * b * h * d + 2 * s * b * h * self.dropout
        if self.attention == "eager":
            held += a * s * s * b * (d + 3 * self.dropout)  # softmax output (+ dropout's mask and output)
        else:
            held += 4 * a * s * b  # the kernel's fp32 log-sum-exp
        return held

    def layer_stash_bytes(self, b: float) -> float:
        """Bytes one layer's ``I`` leaves for its ``W``: each Linear's input and output gradient."""
        return 16 * self.seq_len * b * self.hidden * self.dtype_bytes

    def head_activation_bytes(self, b: float) -> float:
        return self.seq_len * b * (self.dtype_bytes * self.hidden + 4 * self.vocab) if self.vocab else 0.0

    @property
    def layer_params(self) -> int:
        return 12 * self.hidden ** 2 + 13 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden if self.vocab else 0

    def p2p_bytes(self, b: float) -> float:
        """One stage boundary's activation (also all a recomputed layer keeps)."""
        return float(self.dtype_bytes * self.seq_len * b * self.hidden)

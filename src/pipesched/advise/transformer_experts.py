"""A mixture-of-experts layer's figures: what replaces a dense layer's MLP, and what expert
parallelism sends.

A layer with experts keeps the dense layer's attention (``8h^2`` of its ``24h^2`` FLOPs per token
and pass, the ``4s``/``8s`` attention terms, ``7sbh`` of its ``16sbh`` activation values and ``6sbh``
of its ``16sbh`` stash; :mod:`.transformer`) and replaces its MLP with:

- a **router**, an ``E x h`` matrix scoring each token (``2hE`` FLOPs per token and pass) whose
  fp32 probabilities it keeps (``4E`` bytes per token);
- ``per_token`` routed experts of the ``E`` and ``shared`` experts on every token, each a SwiGLU
  MLP of width ``hidden`` (gate, up and down, no biases: ``3 h hidden`` parameters, ``6 h hidden``
  FLOPs per token and pass, as Mixtral, Qwen-MoE and DeepSeek-V3 build them). Per token and
  active expert it keeps its input, its gate and up outputs and their product
  (``h + 3 hidden`` values) and leaves for ``W`` each matrix's input (gate and up share theirs)
  and output gradient (``2h + 3 hidden``).

Expert parallelism (``ep``) splits the routed experts over ``ep`` ranks of a stage's data-parallel
ranks (torchtitan's convention): each rank holds ``E/ep`` of them, and every layer's forward
sends each token to its ``per_token`` experts and back (a dispatch and a combine
``all_to_all``, each ``tokens x per_token x h`` values per rank, of which ``(ep-1)/ep`` leave
it); the backward sends their gradients the same way. Shared experts and the router stay with
the dense part (replicated or FSDP-sharded, split by ``tp`` as an MLP is).

The first ``dense_layers`` layers have a dense MLP instead (DeepSeek-V3's first 3).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..sharded_bytes import ParamSpec, tp_dims

ROUTER_PROB_BYTES = 4  # the router's probabilities, fp32


@dataclass(frozen=True)
class Experts:
    """The experts of each MoE layer (see the module doc)."""

    routed: int  # E
    per_token: int  # routed experts each token goes to (top-k)
    hidden: int  # each expert's intermediate width
    shared: int = 0  # experts every token goes to besides
    dense_layers: int = 0  # first layers with a dense MLP

    def __post_init__(self) -> None:
        for label, least in (("routed", 1), ("per_token", 1), ("hidden", 1), ("shared", 0), ("dense_layers", 0)):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"experts' {label.replace('_', ' ')} must be a whole number of at least {least}, "
                                  f"got {value!r}")
        if self.per_token > self.routed:
            raise ConfigError(f"{self.per_token} experts per token but only {self.routed} experts")

    @property
    def active(self) -> int:
        """Experts that run on each token: its routed ones and the shared ones."""
        return self.per_token + self.shared

    def mlp_flops(self, tokens: float, h: int) -> float:
        """FLOPs of the router and the active experts for ``tokens``, each of F, B and W."""
        return 6.0 * tokens * h * self.hidden * self.active + 2.0 * tokens * h * self.routed

    def kept_bytes(self, tokens: float, h: int, d: int) -> float:
        """Bytes the router and the active experts keep from F to the backward."""
        return tokens * (d * self.active * (h + 3 * self.hidden) + ROUTER_PROB_BYTES * self.routed)

    def stash_bytes(self, tokens: float, h: int, d: int) -> float:
        """Bytes the experts' ``I`` leaves for their ``W``: each matrix's input (``h`` for gate and
        up together, ``hidden`` for down) and output gradient (``hidden``, ``hidden``, ``h``)."""
        return tokens * d * self.active * (2 * h + 3 * self.hidden)

    def dispatch_bytes(self, tokens: float, h: int, d: int) -> float:
        """One all-to-all's buffer on a rank holding ``tokens``: a copy of each per routed expert."""
        return tokens * self.per_token * h * d

    def shared_specs(self, h: int) -> tuple[ParamSpec, ...]:
        """The router and the shared experts (split by ``tp`` as an MLP: gate and up column-wise,
        down row-wise): what stays with the dense part."""
        col, row = tp_dims("colwise")[0], tp_dims("rowwise")[0]
        shared = [ParamSpec((self.hidden, h), col), ParamSpec((self.hidden, h), col), ParamSpec((h, self.hidden), row)]
        return (ParamSpec((self.routed, h)),) + tuple(shared * self.shared)

    def routed_specs(self, h: int, ep: int) -> tuple[ParamSpec, ...]:
        """This rank's ``routed/ep`` routed experts, each matrix stacked (whole on every tp rank)."""
        if self.routed % ep:
            raise ConfigError(f"--ep {ep} does not divide the {self.routed} experts")
        local = self.routed // ep
        return (ParamSpec((local, self.hidden, h)), ParamSpec((local, self.hidden, h)),
                ParamSpec((local, h, self.hidden)))

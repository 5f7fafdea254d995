"""How many blocks each stage gets: balanced by estimated cost, or given as decoder layers per stage.

The blocks are the embeddings, the ``L`` decoder layers and the head (``L + 2``). Costs are per
token: a layer's matmuls (twice its parameters, only the routed share of an MoE layer's
experts) plus its attention scores; the head's matmul against the vocabulary; the embeddings'
lookups (almost nothing). The runtime's balancing (``balanced_block_counts``) then minimises the
heaviest rank for the schedule's placement (a V placement holds both ends on its first rank).
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

from torch import nn

from ..errors import ConfigError
from ..schedule import Schedule


def _routed_share(config) -> float:
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    chosen = getattr(config, "num_experts_per_tok", None)
    return chosen / experts if experts and chosen else 1.0


def block_costs(blocks: Sequence[nn.Module], config, seq_len: int) -> list[float]:
    """Estimated compute per token of every block (relative to the mean decoder layer)."""
    share = _routed_share(config)
    hidden = config.hidden_size

    def matmul_work(block: nn.Module) -> float:
        work = 0.0
        for name, param in block.named_parameters():
            if param.dim() < 2 or isinstance(_owner(block, name), nn.Embedding):
                continue
            work += 2 * param.numel() * (share if ".experts." in f".{name}" else 1.0)
        return work

    layers = [matmul_work(b) + 4 * seq_len * hidden for b in blocks[1:-1]]
    unit = sum(layers) / len(layers)
    embed = 2 * hidden * sum(isinstance(m, nn.Embedding) for m in blocks[0].modules())
    return [embed / unit, *(c / unit for c in layers), matmul_work(blocks[-1]) / unit]


def deferred_weight_grad_share(blocks: Iterable[nn.Module], config) -> float:
    """The share of the weight-gradient work (matmul FLOPs per token, estimated) of ``blocks``
    that the split backward defers to ``W``: their Linears' and Conv1Ds'; the rest (norms,
    embeddings, MoE experts stored as 3D tensors) is computed in ``I``."""
    from ..runtime.engine.split_backward import TRANSPOSED_LINEARS
    from .splitting import prepare_split_backward

    prepare_split_backward()
    deferrable = (nn.Linear, *TRANSPOSED_LINEARS)
    share = _routed_share(config)
    deferred = other = 0.0
    for block in blocks:
        for module in block.modules():
            direct = list(module.parameters(recurse=False))
            if isinstance(module, deferrable):
                deferred += sum(2 * p.numel() for p in direct)
            elif isinstance(module, nn.Embedding):
                other += sum(p.shape[-1] for p in direct)  # a row gathered per token
            else:
                other += sum(p.numel() * (2 * share if p.dim() > 2 else 2 if p.dim() == 2 else 1) for p in direct)
    total = deferred + other
    return deferred / total if total else 0.0


def _owner(root: nn.Module, param_name: str) -> nn.Module:
    return root.get_submodule(param_name.rpartition(".")[0])


def check_stage_count(stages: int, layers: int) -> None:
    if stages > layers + 2:
        raise ConfigError(
            f"{stages} stages but a model of {layers} decoder layers splits into at most {layers + 2} "
            "(embeddings, each layer, head): use fewer ranks or chunks"
        )


def stage_block_counts(schedule: Schedule, costs: Sequence[float], layers_per_stage: Optional[Sequence[int]]) -> list[int]:
    """Blocks per stage of one model copy: from ``layers_per_stage`` (the embeddings join the
    first stage, the head the last) or balanced for the schedule's placement."""
    from ..runtime.stages.copies import balanced_block_counts

    layers = len(costs) - 2
    stages = schedule.pipeline_length
    check_stage_count(stages, layers)
    if layers_per_stage is None:
        return balanced_block_counts(costs, schedule)
    counts = list(layers_per_stage)
    if len(counts) != stages or sum(counts) != layers or min(counts) < 0:
        raise ConfigError(f"layers per stage {counts}: give {stages} counts that sum to {layers} (the decoder layers)")
    counts[0] += 1
    counts[-1] += 1
    if min(counts) < 1:
        raise ConfigError(f"layers per stage {list(layers_per_stage)}: a middle stage needs at least one layer")
    return counts

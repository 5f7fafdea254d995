"""What a model is to ``pipesched train``: its blocks, loss, batches, block costs and tied weights
(the built-in models of :mod:`.models` and the Hugging Face ones of :mod:`pipesched.hf` alike)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Optional

import torch
from torch import nn

from ..runtime.checkpoints.checkpoint_names import same_name
from ..expert_plans import ExpertPlan


@dataclass(frozen=True)
class ModelDef:
    """A model as blocks plus what training it needs: the loss and a deterministic batch source."""

    name: str
    num_blocks: int
    build_block: Callable[[int], nn.Module]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    batch: Callable[[int, int, int], tuple[torch.Tensor, torch.Tensor]]  # (step, batch_size, seed)
    block_costs: tuple[float, ...]  # estimated compute of each block (relative), to balance stages
    tied: tuple[tuple[str, ...], ...] = ()  # parameters that are one weight (RuntimeOptions.tied)
    # a checkpoint's name of each unpipelined name ("0.model.embed_tokens.weight"): hf: models drop
    # the block index, so the CLI's checkpoints are keyed as the model names its weights
    checkpoint_name: Callable[[str], str] = same_name
    # held-out batch ``index`` of ``size`` samples, the same at every evaluation (None: no held-out data)
    eval_batch: Optional[Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]] = None
    # how many distinct windows the held-out data holds (eval_batch wraps around past them)
    eval_windows: int = 0
    # which of its modules tensor parallelism splits column- or row-wise (runtime.sharding.model_plans; None:
    # the model has no plan, and tensor parallelism is refused for it)
    tp_plan: Optional[dict] = None
    # which experts modules expert parallelism splits (expert_plans; None: none), and the
    # check of an --ep for the model (expert_plans.check_ep: ep, data ranks; None: a dense model)
    expert_plan: Optional[ExpertPlan] = None
    ep_check: Optional[Callable[[int, int], None]] = None
    # the head counts (attention, key-value) tensor parallelism divides where its plan splits the attention
    heads: tuple[int, ...] = ()
    # the batch context of a batch's inputs, what every block reads besides its input
    # (runtime.stages.batch_context; hf: models' --packing documents: the position ids); None: none
    context: Optional[Callable[[torch.Tensor], dict]] = None
    # what of a microbatch's batch context decides the sizes of what its blocks save: microbatches
    # with equal keys are predicted once before launch (launch_checks.activation_peaks); None:
    # every microbatch whose context differs in value is predicted
    sizes_key: Optional[Callable[[dict], Hashable]] = None
    # the folder of the tokenizer its text is read with (hf: models; --save-hf writes it beside the model)
    tokenizer: Optional[str] = None

    def batch_context(self, inputs: torch.Tensor) -> Optional[dict]:
        """The context of a batch with these ``inputs`` (the same on every rank: it depends on them alone)."""
        return self.context(inputs) if self.context is not None else None

    def forward(self, model: nn.Sequential, inputs: torch.Tensor) -> torch.Tensor:
        """The one-process model (:meth:`sequential`) on a batch, every block given its context."""
        if self.context is None:
            return model(inputs)
        from ..runtime.stages.partition import run_block

        context, x = self.context(inputs), inputs
        for block in model:
            x = run_block(block, x, context)
        return x

    def sequential(self, seed: int) -> nn.Sequential:
        """The whole model in one process (the reference), block i seeded as a stage builds it,
        each tied group one parameter (the first name's)."""
        from ..runtime.stages.partition import build_block_seeded

        model = nn.Sequential(*(build_block_seeded(self.build_block, i, seed) for i in range(self.num_blocks)))
        for first, *others in self.tied:
            for name in others:
                owner, _, attr = name.rpartition(".")
                setattr(model.get_submodule(owner), attr, model.get_parameter(first))
        return model

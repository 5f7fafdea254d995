"""The step a pipeline computes, in one process: the reference for a model that draws.

Without dropout or router noise, a pipeline equals the model on the whole batch
(``model(**batch).loss``). With them, what a step computes depends on the draws, and the
pipeline's are keyed by microbatch and block (:mod:`.randomness`), so its reference is the model
run the same way: its blocks in order, microbatch by microbatch, each keyed as the pipeline keys
it, the loss normalised over the whole batch as the pipeline normalises it (:mod:`.loss`).
"""

from __future__ import annotations

from torch import nn

from ..runtime.stages import batch_context
from .architectures import architecture_of
from .blocks import model_blocks
from .loss import StepNormalisedLoss
from .pipeline import Batch, check_batch, step_context


def one_process_step(model: nn.Module, batch: Batch, *, microbatches: int, seed: int = 0, step: int = 0) -> float:
    """Step ``step`` of a pipeline of ``model`` with ``seed``, cutting ``batch`` into
    ``microbatches`` (``m * dp`` of the pipeline), computed in this process: gradients accumulate
    into the parameters' ``.grad`` (zero them before, step the optimizer after, as around
    ``loss.backward()``); returns the loss on the whole batch."""
    check_batch(batch, model.config)
    blocks = model_blocks(model, architecture_of(model))
    loss_fn = StepNormalisedLoss(model.config.vocab_size, microbatches, 1)
    loss_fn.start_step(batch["labels"])
    contexts = batch_context.split(step_context(batch, seed, step), microbatches, batch["input_ids"].device)
    total = 0.0
    for context, ids, labels in zip(contexts, batch["input_ids"].chunk(microbatches), batch["labels"].chunk(microbatches)):
        hidden = ids
        for block in blocks:
            hidden = block(hidden, context)
        loss = loss_fn(hidden, labels) * (1.0 / microbatches)
        loss.backward()
        total += loss.item()
    return total

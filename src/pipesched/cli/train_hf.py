"""``pipesched train``'s Hugging Face options: ``--data``, ``--hf-weights``, ``--save-hf`` (with ``--model hf:...``;
declared in :mod:`.run_config`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import ConfigError

def hf_model_options(model: str, data: Optional[Path], weights: Optional[Path], save_hf: Optional[Path]) -> dict:
    """What ``get_model`` takes besides the name: the data and weights of an ``hf:`` model
    (its flags refused with any other model)."""
    from ..training.models import HF_PREFIX

    given = {flag: value for flag, value in (("--data", data), ("--hf-weights", weights), ("--save-hf", save_hf))
             if value is not None}
    if not model.startswith(HF_PREFIX):
        if given:
            raise ConfigError(f"{' and '.join(given)} only {'apply' if len(given) > 1 else 'applies'} to --model "
                              "hf:CONFIG.json (a Hugging Face causal LM)")
        return {}
    if save_hf is not None:
        from ..hf.save_folder import check_save_folder

        check_save_folder(save_hf)
    if weights is not None:
        from ..hf.weights_index import narrowed

        note = narrowed(weights)
        if note:
            typer.echo(f"pipesched: {note}", err=True)
    return {k: str(v) for k, v in (("data", data), ("weights", weights)) if v is not None}


def report_and_save(plan, model_def, params: Optional[dict], save_hf: Optional[Path]) -> None:
    """Say what share of the weight-gradient work ``W`` deferred (split-backward schedules), and
    write ``--save-hf``."""
    from ..hf.split import deferred_weight_grad_share

    config = model_def.build_block.config
    if plan is not None and plan.split_backward:
        blocks = [model_def.build_block.meta_block(i) for i in range(model_def.num_blocks)]
        share = deferred_weight_grad_share(blocks, config)
        typer.echo(f"split backward: W deferred {100 * share:.1f}% of the weight-gradient work (every Linear and "
                   "Conv1D; norms, embeddings and 3D expert weights get theirs in I)")
    if save_hf is not None and params is not None:
        from ..hf.pipeline import model_name
        from ..hf.save_folder import SaveLost, save_into
        from ..hf.saving import write_pretrained

        state = {model_name(k): v for k, v in params.items()}
        try:
            save_into(lambda folder: write_pretrained(config, state, folder), save_hf)
        except SaveLost as err:
            typer.echo(f"pipesched: error: {err}", err=True)
            raise typer.Exit(code=1) from None
        typer.echo(f"wrote {save_hf} (from_pretrained loads it)")

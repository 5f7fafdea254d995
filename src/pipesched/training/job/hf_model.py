"""``pipesched train``'s Hugging Face options: ``--data``, ``--hf-weights``, ``--save-hf`` (with ``--model hf:...``;
declared in :mod:`pipesched.training.config.run_config`).

``hf:FOLDER`` is a whole model: its config, the tokenizer beside it (:mod:`pipesched.hf.cli_model`)
and, unless ``--hf-weights`` names others, its ``*.safetensors`` weights; the run says which it
took, and that it initialises the weights when the folder has none. ``--save-hf`` writes the
run's tokenizer beside the trained model, so the folder loads whole (``AutoTokenizer`` and
``AutoModelForCausalLM``, or ``hf:`` again).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ...errors import ConfigError
from .ended import JobEnded
from .say import say, tell


def hf_model_options(model: str, data: Optional[Path], weights: Optional[Path], save_hf: Optional[Path]) -> dict:
    """What ``get_model`` takes besides the name: the data and weights of an ``hf:`` model
    (its flags refused with any other model)."""
    from ..models import HF_PREFIX

    given = {flag: value for flag, value in (("--data", data), ("--hf-weights", weights), ("--save-hf", save_hf))
             if value is not None}
    if not model.startswith(HF_PREFIX):
        if given:
            raise ConfigError(f"{' and '.join(given)} only {'apply' if len(given) > 1 else 'applies'} to --model "
                              "hf:CONFIG.json (a Hugging Face causal LM)")
        return {}
    if save_hf is not None:
        from ...hf.save_folder import check_save_folder

        check_save_folder(save_hf)
    named = "--hf-weights"
    if weights is None and (weights := _folder_weights(model[len(HF_PREFIX):])) is not None:
        named = f"the weights of {model}"
    if weights is not None:
        from ...hf.weights_index import narrowed

        note = narrowed(weights, named)
        if note:
            say(f"pipesched: {note}")
    return {k: str(v) for k, v in (("data", data), ("weights", weights)) if v is not None}


def _folder_weights(spec: str) -> Optional[Path]:
    """``hf:FOLDER``'s own weights: the folder, when it holds ``*.safetensors`` (None otherwise)."""
    from ...hf.weights_index import weight_files

    folder = Path(spec)
    return folder if folder.is_dir() and weight_files(folder) else None


def say_what_the_folder_gave(model_def) -> None:
    """For ``hf:FOLDER``: one line on stderr saying which of its config, tokenizer and weights the
    run takes (a folder with no weights: initialised at random)."""
    from ...hf.weights_index import weight_files

    folder = Path(model_def.name.split(":", 1)[1])
    if not folder.is_dir():
        return
    tokenizer = model_def.tokenizer
    said_tokenizer = ("its tokenizer" if tokenizer is not None and Path(tokenizer) == folder else
                      f"the tokenizer of {tokenizer!r}" if tokenizer is not None else "no tokenizer")
    weights = model_def.build_block.weights
    if weights is None:
        said_weights = "no weights, so it initialises them at random"
    elif weights.folder == folder:
        said_weights = f"its weights ({len(weight_files(folder))} safetensors file(s))"
    else:
        said_weights = f"the weights of {str(weights.folder)!r}"
    say(f"pipesched: hf:{folder}: its config, {said_tokenizer} and {said_weights}")


def report_and_save(plan, model_def, params: Optional[dict], save_hf: Optional[Path]) -> None:
    """Say what share of the weight-gradient work ``W`` deferred (split-backward schedules), and
    write ``--save-hf``."""
    from ...hf.split import deferred_weight_grad_share

    config = model_def.build_block.config
    if plan is not None and plan.split_backward:
        blocks = [model_def.build_block.meta_block(i) for i in range(model_def.num_blocks)]
        share = deferred_weight_grad_share(blocks, config)
        tell(f"split backward: W deferred {100 * share:.1f}% of the weight-gradient work (every Linear and "
             "Conv1D; norms, embeddings and 3D expert weights get theirs in I)")
    if save_hf is not None and params is not None:
        from ...hf.pipeline import model_name
        from ...hf.save_folder import SaveLost, save_into
        from ...hf.saving import write_pretrained, write_tokenizer

        state = {model_name(k): v for k, v in params.items()}
        tokenizer = model_def.tokenizer

        def write(folder: Path) -> None:
            write_pretrained(config, state, folder)
            if tokenizer is not None:
                write_tokenizer(Path(tokenizer), folder)

        try:
            save_into(write, save_hf)
        except SaveLost as err:
            raise JobEnded(f"pipesched: error: {err}", 1) from None
        tell(f"wrote {save_hf} (from_pretrained loads the model and its tokenizer)" if tokenizer is not None else
             f"wrote {save_hf} (from_pretrained loads it; no tokenizer: the run read no text through one)")

"""``--save-hf DIR``: checked before any rank starts, written so that the trained model is never lost.

Up front, ``DIR`` must be a new folder, or one that holds a previous save and nothing else (its
config, generation config, safetensors and their index, tokenizer files: transformers removes the shard-named
files it did not write, so anything else there could be lost), and the nearest existing folder
must accept new files. After training the model is written into a fresh temporary folder next
to ``DIR`` (or in the system's temporary folder when that fails), given the usual file mode,
and only then moved into ``DIR`` file by file, replacing the previous save. When that fails
anyway (a disk filled, a folder removed during the run) the written copy is kept where it is and
:class:`SaveLost` says where, in one line.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from ..errors import ConfigError
from ..outfiles import _umask, check_output_folder

SAVED_NAMES = re.compile(  # the model's files, and those a tokenizer's save_pretrained may write
    r"^(config\.json|generation_config\.json|model\.safetensors(\.index\.json)?|model-\d+-of-\d+\.safetensors"
    r"|tokenizer(_config)?\.json|special_tokens_map\.json|added_tokens\.json|chat_template\.(jinja|json)"
    r"|vocab\.(json|txt)|merges\.txt|tokenizer\.model)$"
)


class SaveLost(RuntimeError):
    """The trained model could not be written into ``--save-hf`` (the message says where it is)."""


def check_save_folder(folder: Path) -> None:
    """Refuse (one line) a ``--save-hf`` folder a save would clobber or could not write."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--save-hf {str(folder)!r} is a file, not a folder")
    if folder.is_dir():
        others = sorted(p.name for p in folder.iterdir() if not (SAVED_NAMES.match(p.name) and p.is_file()))
        if others:
            raise ConfigError(f"--save-hf {str(folder)!r} holds {others[0]!r}{' and more' if len(others) > 1 else ''}, "
                              "which is not a previous save: choose a new or empty folder")
    try:
        check_output_folder(folder)
    except ConfigError as err:
        raise ConfigError(f"--save-hf: {err}") from None


def save_into(write, folder: Path) -> None:
    """``write(tmp)`` the model into a temporary folder, then move its files into ``folder``;
    SaveLost naming where the copy is kept when that fails."""
    kept = _write_somewhere(write, folder)
    try:
        _move_into(kept, folder)
    except OSError as err:
        raise SaveLost(f"the run finished, but could not write --save-hf {folder} "
                       f"({err.strerror or type(err).__name__}): kept in {kept} instead") from None


def _write_somewhere(write, folder: Path) -> Path:
    """A temporary folder holding the written model: next to ``folder``, else in the system's."""
    failure = None
    for place in (folder.parent, None):
        tmp = None
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.pipesched-" if place else "pipesched-save-hf-", dir=place))
            write(tmp)
            for path in tmp.iterdir():  # the usual file mode (some are written 0600)
                os.chmod(path, 0o666 & ~_umask())
            return tmp
        except OSError as err:
            failure = err
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
    raise SaveLost(f"the run finished, but could not write --save-hf {folder} nor a temporary copy "
                   f"({failure.strerror or type(failure).__name__})")


def _move_into(tmp: Path, folder: Path) -> None:
    folder.mkdir(exist_ok=True)
    new = {p.name for p in tmp.iterdir()}
    for old in folder.iterdir():  # the previous save's files this one does not replace (other shards)
        if old.name not in new and SAVED_NAMES.match(old.name):
            old.unlink()
    for name in sorted(new):
        os.replace(tmp / name, folder / name)
    tmp.rmdir()

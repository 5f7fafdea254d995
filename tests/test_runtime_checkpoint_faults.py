"""A hostile world for checkpoints, through the installed ``pipesched`` console script: a full
disk while saving, damaged, truncated and swapped files, a second run on the same folder, stale
locks and partial folders, outputs that cannot be written after training. Each is one line, the
right exit status, no traceback, and nothing lost: the last good checkpoint stays and loads.

Faults are injected cheaply and at known points by ``fault_hooks/sitecustomize.py`` (a full
disk is ``OSError(ENOSPC)`` from the streams DCP opens, or from the atomic writer of outputs;
a folder is removed once training returns), and by flipping, truncating and copying bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SRC

torch = pytest.importorskip("torch")

from pipesched.runtime.checkpoints import checkpoint
from pipesched.runtime.checkpoints.folder_lock import LOCK_FILE, FolderLock  # noqa: E402
from pipesched.training.models import get_model  # noqa: E402
from pipesched.training.optimizers import make_optimizer  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

PIPESCHED = Path(sys.executable).with_name("pipesched")
HOOKS = Path(__file__).resolve().parent / "fault_hooks"
RUN = ["--model", "mlp", "--batch-size", "16", "-m", "4", "--optimizer", "adamw", "--lr", "0.001", "--timeout", "60"]


def _pipesched(*args: str, **faults: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=os.pathsep.join([str(HOOKS), str(SRC)]))
    env.update({f"PIPESCHED_TEST_{k.upper()}": v for k, v in faults.items()})
    return subprocess.run([str(PIPESCHED), *args], capture_output=True, text=True, env=env, timeout=240)


def _last_line(result: subprocess.CompletedProcess, status: int) -> str:
    """The run's final word: exit ``status``, no traceback, one ``pipesched: error:`` line."""
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("pipesched: error: "), result.stderr
    return last


def _weights(step: Path) -> dict:
    """A checkpoint's model, loaded into the one-process model."""
    model = get_model("mlp").sequential(0)
    checkpoint.load(step, model, make_optimizer("adamw", 0.001)(list(model.parameters())))
    return model.state_dict()


def _flip(path: Path, at: int = 200, count: int = 64) -> None:
    data = bytearray(path.read_bytes())
    for i in range(at, min(at + count, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def full_disk(tmp_path_factory):
    """A 2-rank run whose disk is full when step 3 of 3 is checkpointed: (its result, a pristine
    copy of what it left: step-000001 and step-000002)."""
    root = tmp_path_factory.mktemp("full-disk")
    ck = root / "ck"
    result = _pipesched("train", *RUN, "--ranks", "2", "--steps", "3", "--checkpoint-dir", str(ck),
                        "--checkpoint-every", "1", "--checkpoint-keep", "3", full_disk_step="3")
    pristine = root / "pristine"
    shutil.copytree(ck, pristine)
    return result, ck, pristine


def test_a_full_disk_while_saving_is_one_line_naming_the_step_and_the_intact_checkpoint(full_disk):
    result, ck, _ = full_disk
    assert _last_line(result, 1) == (
        f"pipesched: error: ranks 0, 1: step 3: could not write {ck}/step-000003: No space left on device "
        f"({ck}/.step-000003.partial/__0_0.distcp); {ck}/step-000002 is intact"
    )
    assert sorted(p.name for p in ck.iterdir()) == ["step-000001", "step-000002"]  # no partial, no lock left
    verified = _pipesched("checkpoint", "verify", str(ck))
    assert verified.returncode == 0 and verified.stdout.splitlines() == ["step-000001: intact", "step-000002: intact"]


def test_resume_passes_over_a_damaged_checkpoint_and_outputs_that_cannot_be_written_are_kept(full_disk, tmp_path):
    _, _, pristine = full_disk
    ck = tmp_path / "ck"
    shutil.copytree(pristine, ck)
    _flip(ck / "step-000002" / "__1_0.distcp")  # 64 bytes of rank 1's file
    verified = _pipesched("checkpoint", "verify", str(ck))
    assert verified.returncode == 1 and verified.stdout.splitlines() == [
        "step-000001: intact",
        f"step-000002: damaged: {ck}/step-000002/__1_0.distcp does not match its checksum "
        "(damaged, or copied from another checkpoint)",
    ]
    # a lock left by a process that is gone, and a partial folder of an interrupted save
    gone = subprocess.Popen(["true"])
    gone.wait()
    (ck / LOCK_FILE).write_text(json.dumps({"pid": gone.pid, "host": socket.gethostname()}))
    (ck / ".step-000005.partial").mkdir()
    full, removed = tmp_path / "full", tmp_path / "removed"
    full.mkdir()
    removed.mkdir()
    result = _pipesched("train", *RUN, "--schedule", "none", "--steps", "2", "--checkpoint-dir", str(ck), "--resume",
                        "--json", str(full / "summary.json"), "--save-params", str(removed / "params.pt"),
                        full_disk_under=str(full), remove_after_run=str(removed))
    said = result.stderr
    assert f"took over the lock of {ck} from pid {gone.pid} on {socket.gethostname()}, which is no longer running" in said
    assert f"removed .step-000005.partial in {ck} (left by an interrupted save)" in said
    assert ("step-000002 is damaged: " in said and "set aside as step-000002.damaged, resuming from step-000001, "
            "the newest intact checkpoint" in said)
    last = _last_line(result, 1)  # the run is done; its outputs were not written where asked
    assert last.startswith(f"pipesched: error: the run finished, but could not write {full / 'summary.json'} "
                           "(No space left on device): kept in ")
    assert f"could not write {removed / 'params.pt'} (folder '{removed}' does not exist): kept in " in last
    assert last.endswith(f"({ck}/step-000002 holds the same weights)")
    kept_summary, kept_params = (Path(part.split(" instead")[0]) for part in last.split("kept in ")[1:])
    assert len(json.loads(kept_summary.read_text())["losses"]) == 1
    # resumed from step 1 and saved step 2 again: it equals the step 2 the damage replaced
    assert sorted(p.name for p in ck.iterdir()) == ["step-000001", "step-000002", "step-000002.damaged"]
    again, before = _weights(ck / "step-000002"), _weights(pristine / "step-000002")
    assert all(torch.allclose(again[k], before[k], rtol=0, atol=1e-6) for k in before)
    params = torch.load(kept_params, weights_only=True)
    assert all(torch.equal(params[k], again[k]) for k in again)
    for kept in (kept_summary, kept_params):
        kept.unlink()


def test_resume_with_no_intact_checkpoint_is_refused_naming_each_damaged_file(full_disk, tmp_path):
    _, _, pristine = full_disk
    ck = tmp_path / "ck"
    shutil.copytree(pristine, ck)
    shutil.copy(ck / "step-000001" / "__0_0.distcp", ck / "step-000002" / "__0_0.distcp")  # a rank file of another step
    (ck / "step-000001" / ".metadata").write_bytes(b"")  # empty (once: exit 130 "aborted")
    verified = _pipesched("checkpoint", "verify", str(ck))
    assert verified.returncode == 1 and [line.split(": ")[1] for line in verified.stdout.splitlines()] == ["damaged"] * 2
    result = _pipesched("train", *RUN, "--schedule", "none", "--steps", "3", "--checkpoint-dir", str(ck), "--resume")
    assert result.stderr.count("\n") == 1 and not result.stdout
    metadata_size = json.loads((pristine / "step-000001" / "manifest.json").read_text())["files"][".metadata"]["bytes"]
    assert _last_line(result, 2) == (
        f"pipesched: error: --resume: no intact checkpoint in '{ck}': step-000002: {ck}/step-000002/__0_0.distcp "
        "does not match its checksum (damaged, or copied from another checkpoint); "
        f"step-000001: {ck}/step-000001/.metadata is 0 bytes, its manifest says {metadata_size}"
    )


def test_a_second_run_on_a_locked_folder_is_refused_naming_the_first(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    lock = FolderLock(ck).acquire()  # this test process is "the first run"
    try:
        result = _pipesched("train", "--schedule", "none", "--steps", "1", "--batch-size", "4", "--checkpoint-dir", str(ck))
    finally:
        lock.release()
    last = _last_line(result, 2)
    assert last.startswith(f"pipesched: error: --checkpoint-dir '{ck}' is in use by another run "
                           f"(pid {os.getpid()} on {socket.gethostname()} since ")
    assert last.endswith("): wait for it to end or choose another folder") and result.stderr.count("\n") == 1
    assert not any(ck.iterdir())
    nothing = _pipesched("checkpoint", "verify", str(ck))
    assert _last_line(nothing, 2) == f"pipesched: error: '{ck}' holds no checkpoint (step-NNNNNN folders)"


def test_a_checkpoint_damaged_without_a_manifest_fails_to_load_in_one_line(full_disk, tmp_path):
    """What a load meets past verification (a checkpoint from before manifests): DCP's own
    errors, BaseExceptions among them, become one line naming the step and the file."""
    _, _, pristine = full_disk
    step = tmp_path / "step-000002"
    shutil.copytree(pristine / "step-000002", step)
    (step / "manifest.json").unlink()
    metadata = step / ".metadata"
    whole = metadata.read_bytes()
    for damaged in (b"", whole[: len(whole) // 2], b"\xff" * 64):
        metadata.write_bytes(damaged)
        with pytest.raises(checkpoint.CheckpointUnreadable, match=rf"^step 2: could not read {step}/.metadata: "):
            _weights(step)
    metadata.write_bytes(whole)
    (step / "__1_0.distcp").write_bytes(b"")
    with pytest.raises(checkpoint.CheckpointUnreadable, match=rf"^step 2: could not read {step}: "):
        _weights(step)

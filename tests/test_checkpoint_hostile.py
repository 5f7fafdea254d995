"""Checkpoint folders that trust nothing they read (issue 31), through the installed console
script: a link or a folder where the lock goes, step folders renamed, copied or linked under
another step's name, manifests naming devices, FIFOs and paths outside the step, hand-edited
manifests of every wrong shape, and a disk that fills while ``torch.save`` writes. Each is one
line with the right exit status, never a wait, nothing outside the folder changed and no
checkpoint lost. The many ``checkpoint verify`` cases run in one process through the console
script's entry point (:func:`fuzz_cases.run_batch`, bounded per case).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SRC, concurrently
from fuzz_cases import run_batch

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.timeout(200)]

PIPESCHED = Path(sys.executable).with_name("pipesched")
HOOKS = Path(__file__).resolve().parent / "fault_hooks"
RUN = ["train", "--model", "mlp", "--schedule", "none", "--batch-size", "4", "--timeout", "30"]


def _pipesched(*args: str, timeout: float = 120, **faults: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=os.pathsep.join([str(HOOKS), str(SRC)]))
    env.update({f"PIPESCHED_TEST_{k.upper()}": v for k, v in faults.items()})
    return subprocess.run([str(PIPESCHED), *args], capture_output=True, text=True, env=env, timeout=timeout)


def _one_line(result: subprocess.CompletedProcess, status: int) -> str:
    assert result.returncode == status, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesched: error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """Four checkpoints (steps 1-4) of a one-process run."""
    ck = tmp_path_factory.mktemp("pristine") / "ck"
    run = _pipesched(*RUN, "--steps", "4", "--checkpoint-dir", str(ck), "--checkpoint-every", "1",
                     "--checkpoint-keep", "4")
    assert run.returncode == 0, run.stderr
    return ck


def _copy(pristine: Path, tmp_path: Path) -> Path:
    ck = tmp_path / "ck"
    shutil.copytree(pristine, ck, symlinks=True)
    return ck


def test_what_sits_where_the_lock_goes_is_refused_and_nothing_outside_is_written(tmp_path):
    outside = tmp_path / "precious.txt"
    outside.write_text("not a lock")
    folders = {name: tmp_path / name for name in ("link", "folder", "fifo")}
    for folder in folders.values():
        folder.mkdir()
    (folders["link"] / ".pipesched-lock").symlink_to(outside)
    (folders["folder"] / ".pipesched-lock").mkdir()
    os.mkfifo(folders["fifo"] / ".pipesched-lock")
    results = concurrently(lambda folder: _pipesched(*RUN, "--steps", "1", "--checkpoint-dir", str(folder)),
                           list(folders.values()))
    lines = {name: _one_line(result, 2) for name, result in zip(folders, results)}
    assert lines["link"].endswith("/.pipesched-lock is a link: remove it if no run uses the folder")
    assert lines["folder"].endswith("/.pipesched-lock is not a regular file: remove it if no run uses the folder")
    assert lines["fifo"].endswith("/.pipesched-lock is not a regular file: remove it if no run uses the folder")
    assert outside.read_text() == "not a lock"
    assert all(sorted(p.name for p in folder.iterdir()) == [".pipesched-lock"] for folder in folders.values())


def test_a_step_renamed_copied_or_linked_under_another_name_is_never_resumed_nor_rotated(pristine, tmp_path):
    ck = _copy(pristine, tmp_path)
    (ck / "step-000009").symlink_to("step-000001")  # a link: not a step of this folder
    shutil.copytree(ck / "step-000002", ck / "step-000008")  # a copy: its manifest says step 2
    verified = _pipesched("checkpoint", "verify", str(ck))
    assert verified.returncode == 1 and verified.stdout.splitlines() == [
        "step-000001: intact", "step-000002: intact", "step-000003: intact", "step-000004: intact",
        "step-000008: damaged: its manifest.json is of step 2, not 8 (renamed, copied or linked from another step's folder)",
    ]
    linked = _pipesched("checkpoint", "verify", str(ck / "step-000009"))
    assert linked.returncode == 1 and "is of step 1, not 9" in linked.stdout
    resumed = _pipesched(*RUN, "--steps", "5", "--checkpoint-dir", str(ck), "--resume", "--checkpoint-keep", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert "(resumed after step 4)" in resumed.stdout
    assert "step-000008 is damaged: its manifest.json is of step 2, not 8" in resumed.stderr
    assert sorted(p.name for p in ck.iterdir()) == ["step-000004", "step-000005", "step-000008.damaged", "step-000009"]
    assert (ck / "step-000009").is_symlink()


def test_a_finished_step_whose_metadata_is_missing_a_fifo_a_folder_or_a_link_is_damaged(pristine, tmp_path):
    """A ``step-N`` folder is finished (saves write under ``.step-N.partial``), whatever its
    ``.metadata`` has become since: verify lists it as damaged, and --resume sets it aside."""
    ck = _copy(pristine, tmp_path)
    (ck / "step-000002" / ".metadata").unlink()
    os.unlink(ck / "step-000003" / ".metadata")
    os.mkfifo(ck / "step-000003" / ".metadata")
    (ck / "step-000004" / ".metadata").unlink()
    (ck / "step-000004" / ".metadata").mkdir()
    linked = _copy(pristine, tmp_path / "linked")
    (linked / "step-000004" / ".metadata").unlink()
    (linked / "step-000004" / ".metadata").symlink_to(linked / "step-000003" / ".metadata")
    verified, verified_link = concurrently(lambda folder: _pipesched("checkpoint", "verify", str(folder), timeout=30),
                                           [ck, linked])
    assert verified.returncode == 1 and verified.stdout.splitlines() == [
        "step-000001: intact",
        f"step-000002: damaged: {ck}/step-000002/.metadata is missing",
        f"step-000003: damaged: {ck}/step-000003/.metadata is not a regular file",
        f"step-000004: damaged: {ck}/step-000004/.metadata is not a regular file",
    ], verified.stdout
    assert verified_link.returncode == 1 and verified_link.stdout.splitlines()[-1] == (
        f"step-000004: damaged: {linked}/step-000004/.metadata is a link, not a file")
    resumed = _pipesched(*RUN, "--steps", "2", "--checkpoint-dir", str(ck), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "(resumed after step 1)" in resumed.stdout and "Traceback" not in resumed.stderr
    for step in (2, 3, 4):
        assert f"step-00000{step} is damaged: {ck}/step-00000{step}/.metadata " in resumed.stderr
    assert sorted(p.name for p in ck.iterdir()) == [
        "step-000001", "step-000002", "step-000002.damaged", "step-000003.damaged", "step-000004.damaged"]


def _manifest(step: Path) -> dict:
    return json.loads((step / "manifest.json").read_text())


def _edited(ck: Path, edit) -> Path:
    """``ck``'s step 4 with its manifest as ``edit(manifest)`` returns it (a str: written as is)."""
    step = ck / "step-000004"
    manifest = edit(_manifest(step))
    (step / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    return step


def _entry(manifest: dict, name: str, value) -> dict:
    manifest["files"][name] = value
    return manifest


def test_hand_edited_manifests_and_entries_naming_devices_fifos_or_outside_files_are_damaged_at_once(pristine, tmp_path):
    some = {"bytes": 2, "sha256": "0" * 64}
    cases = {
        "/dev/zero": (lambda m: _entry(m, "/dev/zero", some), "not a plain file name inside the folder"),
        "dotdot": (lambda m: _entry(m, "../../outside", some), "not a plain file name inside the folder"),
        "nul": (lambda m: _entry(m, "a\0b", some), "not a plain file name inside the folder"),
        "not an object": (lambda m: _entry(m, ".metadata", [1, 2]), "is not a byte count and a SHA-256"),
        "bytes as text": (lambda m: _entry(m, ".metadata", {**m["files"][".metadata"], "bytes": "2"}),
                          "is not a byte count and a SHA-256"),
        "deep": (lambda m: "[" * 200_000 + "]" * 200_000, "its manifest.json is not JSON"),
        "fifo": (lambda m: _entry(m, "fifo", some), "/fifo is not a regular file"),
        "link": (lambda m: _entry(m, "zero", some), "/zero is a link, not a file"),
        "no step": (lambda m: {**m, "step": "4"}, "its manifest.json names no step"),
    }
    folders = {}
    for i, (label, (edit, _)) in enumerate(cases.items()):
        ck = tmp_path / f"case{i}"
        ck.mkdir()
        shutil.copytree(pristine / "step-000004", ck / "step-000004")
        step = _edited(ck, edit)
        if label == "fifo":
            os.mkfifo(step / "fifo")
        if label == "link":
            (step / "zero").symlink_to("/dev/zero")
        folders[label] = ck
    results = run_batch([["checkpoint", "verify", str(ck)] for ck in folders.values()], tmp_path, bound_s=10, warm=("torch",))
    for (label, (_, why)), result in zip(cases.items(), results):
        assert result.code == 1, (label, result.stderr)
        assert not result.stderr and len(result.stdout.splitlines()) == 1, (label, result.stdout)
        assert result.stdout.startswith("step-000004: damaged: ") and why in result.stdout, (label, result.stdout)
    # --resume passes over such a step (set aside, named) for the intact one before it
    ck = _copy(pristine, tmp_path)
    _edited(ck, cases["/dev/zero"][0])
    resumed = _pipesched(*RUN, "--steps", "5", "--checkpoint-dir", str(ck), "--resume", "--checkpoint-keep", "4")
    assert resumed.returncode == 0, resumed.stderr
    assert "(resumed after step 3)" in resumed.stdout and "step-000004 is damaged: its manifest.json names" in resumed.stderr


def test_a_disk_that_fills_while_torch_writes_is_named_as_a_full_disk(tmp_path):
    ck = tmp_path / "ck"
    run = _pipesched(*RUN, "--steps", "2", "--checkpoint-dir", str(ck), "--checkpoint-every", "1",
                     disk_fills_at_step="2")
    assert _one_line_after_progress(run) == (
        f"pipesched: error: step 2: could not write {ck}/step-000002: No space left on device "
        f"({ck}/.step-000002.partial/__0_0.distcp); {ck}/step-000001 is intact"
    )
    assert sorted(p.name for p in ck.iterdir()) == ["step-000001"]


def _one_line_after_progress(result: subprocess.CompletedProcess) -> str:
    """The last line of a run that failed while running (exit 1; before it only its progress)."""
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]

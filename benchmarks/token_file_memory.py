"""Memory of reading a large token file: ``pipesched train --data BIG.bin`` against the same run on
a small one, launcher and ranks measured apart.

A 1 GiB nanoGPT-layout token file (``uint16`` ids, 512 Mi tokens) and a 1 MiB one, each trained
on for 2 steps by a tiny Llama under 1f1b on 2 ranks. Every process of the run is watched through
``/proc`` (its ``VmHWM``, the peak resident memory the kernel keeps, polled every 20 ms until it
exits); the figure is the peak of the big file's run minus the small file's, per role
(the launcher; the ranks, the larger of the two). The file is memory-mapped by every process and
its ids checked with chunked reads, so the extra memory is the windows a step reads and the
check's 8 MiB buffer, not the file.

Run: python benchmarks/token_file_memory.py [--gib 1]   (needs transformers; writes to a temp folder)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def write_tokens(path: Path, count: int, vocab: int) -> None:
    chunk = (np.arange(1 << 24) % vocab).astype(np.uint16)
    with open(path, "wb") as f:
        for start in range(0, count, len(chunk)):
            f.write(chunk[: min(len(chunk), count - start)].tobytes())


def descendants(pid: int) -> set[int]:
    found, frontier = set(), [pid]
    while frontier:
        parent = frontier.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found.add(child)
            frontier.append(child)
    return found


def peak_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure(config: Path, data: Path) -> dict[str, int]:
    """Peak resident bytes of the launcher and of the largest rank of one run."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    cmd = [sys.executable, "-m", "pipesched", "train", "--model", f"hf:{config}", "--data", str(data), "--steps", "2",
           "--ranks", "2", "--batch-size", "8", "-m", "4"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peaks: dict[int, int] = {}
    while proc.poll() is None:
        for pid in {proc.pid} | descendants(proc.pid):
            peaks[pid] = max(peaks.get(pid, 0), peak_kib(pid))
        time.sleep(0.02)
    if proc.returncode != 0:
        raise SystemExit(f"the run failed: {proc.stderr.read()}")
    ranks = [kib for pid, kib in peaks.items() if pid != proc.pid]
    return {"launcher": 1024 * peaks[proc.pid], "rank": 1024 * max(ranks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    args = parser.parse_args()
    from hf_cases import make_config

    with tempfile.TemporaryDirectory(prefix="pipesched-tokens-") as tmp:
        folder = Path(tmp)
        make_config("llama").to_json_file(str(folder / "config.json"))
        big, small = folder / "big.bin", folder / "small.bin"
        write_tokens(big, int(args.gib * 2**30) // 2, 64)
        write_tokens(small, 2**19, 64)
        results = {name: measure(folder / "config.json", path) for name, path in (("small", small), ("big", big))}
    print(f"token file {args.gib:g} GiB ({big.name}) against 1 MiB, peak resident memory (MiB):")
    print("| process | 1 MiB file | big file | extra |")
    print("|---|---|---|---|")
    for role in ("launcher", "rank"):
        s, b = results["small"][role], results["big"][role]
        print(f"| {role} | {s / 2**20:.1f} | {b / 2**20:.1f} | {(b - s) / 2**20:+.1f} |")


if __name__ == "__main__":
    main()

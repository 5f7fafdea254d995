"""Peak memory of tokenizing one long document: the launcher's ``--data`` tokenization of a
``.jsonl`` whose one line is a document of ``--mb`` MB (issue 39: 10 MB peaked at 2.8 GB, 30 MB
aborted the launcher), against the same text as many short documents.

Each case runs in a fresh process (``pipesched.data.tokenize_text.tokenized_file`` into an empty
cache folder) that prints its peak resident memory (``ru_maxrss``) after importing transformers
and loading the tokenizer, and again after tokenizing (the peak of the whole process). The tokenizer is
the tests' small BPE (``tests/tokenizer_cases.py``), the text English words from the shipped text.
``--src`` runs another checkout's ``src`` (the code before a change) with this one's tokenizer.

Run: python benchmarks/long_document_memory.py [--mb 10] [--src OTHER/src]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

PROBE = """
import resource, sys
from pathlib import Path
from pipesched.data.tokenize_text import load_tokenizer, tokenized_file
load_tokenizer(Path(sys.argv[2]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
path = tokenized_file(sys.argv[1], Path(sys.argv[2]), 128)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(before // 1024, after // 1024, Path(path).stat().st_size)
"""


def long_text(megabytes: float) -> str:
    from tokenizer_cases import shipped_documents

    words = " ".join(shipped_documents()).split()
    text, size, i = [], 0, 0
    while size < megabytes * 1e6:
        text.append(words[i % len(words)])
        size += len(text[-1]) + 1
        i += 1
    return " ".join(text)


def measure(data: Path, tokenizer: Path, src: Path) -> tuple[int, int, int]:
    """(the process's peak MiB once the tokenizer is loaded, its peak MiB after tokenizing, bytes
    of the token file)."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PYTHONPATH=str(src), PIPESCHED_CACHE_DIR=cache)
        done = subprocess.run([sys.executable, "-c", PROBE, str(data), str(tokenizer)], capture_output=True,
                              text=True, env=env, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"{src}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
        loaded, peak, size = done.stdout.split()
        return int(loaded), int(peak), int(size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=10.0)
    parser.add_argument("--src", type=Path, default=ROOT / "src")
    args = parser.parse_args()
    from tokenizer_cases import model_folder

    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(Path(tmp) / "model")
        text = long_text(args.mb)
        one = Path(tmp) / "one.jsonl"
        one.write_text(json.dumps({"text": text}) + "\n", encoding="utf-8")
        many = Path(tmp) / "many.jsonl"
        lines = text.split(" ")
        many.write_text("".join(json.dumps({"text": " ".join(lines[i:i + 200])}) + "\n"
                                for i in range(0, len(lines), 200)), encoding="utf-8")
        for label, data in (("one document", one), ("short documents", many)):
            loaded, peak, size = measure(data, folder, args.src)
            print(f"{args.src}: {label} of {args.mb:g} MB: peak {peak} MiB ({loaded} MiB once the tokenizer "
                  f"is loaded); token file {size} bytes")


if __name__ == "__main__":
    main()

"""``pipesched train --model hf:...``'s data: token files memory-mapped, text through the model
folder's own tokenizer (the same token stream as the tokenizer gives in one process), bytes as
the fallback of a folder without one; held-out batches fixed; reading a large token file costs
a bounded amount of memory; bad data refused in one line, exit 2, before any rank starts."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import cli_env, concurrently, run_cli

pytest.importorskip("transformers")
pytest.importorskip("pyarrow")
import torch  # noqa: E402
from tokenizer_cases import (  # noqa: E402
    EOS,
    VOCAB,
    model_folder,
    shipped_documents,
    write_jsonl,
    write_parquet,
)

from pipesched.data.streams import TokenStream, eval_windows, train_windows  # noqa: E402
from pipesched.data.token_files import open_token_file  # noqa: E402
from pipesched.training.models import get_model  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny Llama's folder with its BPE tokenizer, the shipped text's lines as .jsonl and .parquet."""
    root = tmp_path_factory.mktemp("model")
    docs = shipped_documents()
    return {"model": model_folder(root / "llama"), "docs": docs, "jsonl": write_jsonl(root / "docs.jsonl", docs),
            "parquet": write_parquet(root / "docs.parquet", docs), "root": root}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPESCHED_CACHE_DIR", str(tmp_path / "cache"))  # the tests' own (run_cli passes it on)


def one_process_stream(model_dir, docs: list[str]) -> list[int]:
    """What the tokenizer gives in one process: each document's ids, then EOS."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    assert tok.eos_token == EOS
    return [i for doc in docs for i in tok(doc, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_text_through_the_folders_tokenizer_is_the_one_process_token_stream(folder, kind):
    from pipesched.data.tokenize_text import find_tokenizer
    from pipesched.hf.cli_model import token_stream

    config = folder["model"] / "config.json"
    md = get_model(f"hf:{config}", data=str(folder[kind]), context=16)
    stream = token_stream(str(folder[kind]), VOCAB, str(find_tokenizer(None, folder["model"])))
    want = one_process_stream(folder["model"], folder["docs"])
    assert stream.ids.tolist() == want
    assert isinstance(stream.ids, np.memmap)  # the ranks map the cached file, they do not hold it
    x, y = md.batch(3, 4, 0)  # step 3's windows: offsets drawn from (seed, step) alone
    starts = torch.randint(0, len(want) - 16, (4,), generator=torch.Generator().manual_seed(3))
    assert x.tolist() == [want[s:s + 16] for s in starts.tolist()] and torch.equal(x, y)


def test_packed_documents_each_compute_what_they_compute_alone(folder):
    """--packing documents: a window holding the end of one document and the start of the next
    gives each the logits and per-token losses it has alone, in one process."""
    import torch.nn.functional as F
    from transformers import AutoTokenizer

    md = get_model(f"hf:{folder['model'] / 'config.json'}", data=str(folder["jsonl"]), context=32, packing="documents")
    tok = AutoTokenizer.from_pretrained(str(folder["model"]), local_files_only=True)
    a = tok(folder["docs"][0], add_special_tokens=False)["input_ids"][-12:] + [tok.eos_token_id]  # a document's end
    b = tok(folder["docs"][1], add_special_tokens=False)["input_ids"][:14]  # the next one's start
    packed = torch.tensor([a + b])
    assert md.batch_context(packed)["position_ids"].tolist() == [list(range(len(a))) + list(range(len(b)))]
    model = md.sequential(0).double()
    with torch.no_grad():
        together = md.forward(model, packed)[0]
        alone = [md.forward(model, torch.tensor([doc]))[0] for doc in (a, b)]
        leaked = model(packed)[0, len(a):]  # --packing across: b attends to a, its positions start at len(a)
    # float64: packed and alone run the same operations on the same values but for the masked
    # keys (exact zeros after the softmax) and how the kernels block reductions of other lengths:
    # sums of at most 64 terms (the hidden size) in another order, each within 64 u (u = 2^-53)
    # relative, over 4 layers: below 1e-13 of the logits' scale; 1e-12 bounds it, while what the
    # mask keeps out (b attending to a) moves b's logits by ~0.25 here, eleven orders of magnitude more
    scale = together.abs().max().item()
    for doc, part, own in ((a, together[:len(a)], alone[0]), (b, together[len(a):], alone[1])):
        assert (part - own).abs().max().item() <= 1e-12 * scale
        targets = torch.tensor(doc[1:])
        losses = F.cross_entropy(part[:-1], targets, reduction="none")  # the predictions inside the document
        assert (losses - F.cross_entropy(own[:-1], targets, reduction="none")).abs().max().item() <= 1e-12 * losses.max().item()
    assert (leaked - alone[1]).abs().max().item() > 1e-3 * scale


@pytest.mark.timeout(240)
def test_activations_are_predicted_for_the_microbatch_kind_that_holds_the_most(folder, tmp_path):
    """--packing documents: a microbatch whose windows cross a document's end gets transformers'
    explicit block mask, which attention saves; one inside a document runs SDPA's causal kernel
    without one. The first step mixes both here, the first microbatch of the plainer kind, and the
    activations predicted before launch (on fake tensors, one microbatch of each kind) are the
    run's own prediction to the byte (before: the first microbatch's alone, 8% short)."""
    import pipesched
    from pipesched.training.launch_checks import activation_peaks
    from pipesched.hf.cli_model import packed_documents

    config = folder["model"] / "config.json"
    md = get_model(f"hf:{config}", data=str(folder["jsonl"]), context=16, packing="documents")
    x, _ = md.batch(0, 8, 0)
    positions = md.batch_context(x)["position_ids"]
    kinds = [packed_documents({"position_ids": positions[i:i + 2]}) for i in range(0, 8, 2)]
    assert not kinds[0] and any(kinds), kinds  # the case this test is about: the shipped text gives it
    predicted = activation_peaks(md, pipesched.build_schedule("1f1b", 2, 4), None, 8, 1, 0, None, torch.float32)
    run = run_cli("train", "--model", f"hf:{config}", "--data", str(folder["jsonl"]), "--packing", "documents",
                  "--seq-len", "16", "--ranks", "2", "-s", "1f1b", "-m", "4", "--steps", "1", "--batch-size", "8",
                  "--summary", str(tmp_path / "run.json"), timeout=200)
    assert run.returncode == 0, run.stderr
    for rank in json.loads((tmp_path / "run.json").read_text())["memory"]:
        assert rank["predicted_peak_activation_bytes"] == predicted[rank["rank"]], rank


def test_document_positions_restart_after_every_end_of_sequence():
    from pipesched.data.packing import document_positions

    ids = torch.tensor([[5, 0, 7, 8, 0, 0, 9], [0, 3, 4, 5, 6, 7, 8]])  # 0 ends a document
    assert document_positions(ids, torch.tensor([0])).tolist() == [[0, 1, 0, 1, 2, 0, 0], [0, 0, 1, 2, 3, 4, 5]]
    assert document_positions(ids, torch.tensor([0, 4])).tolist()[1] == [0, 0, 1, 0, 1, 2, 3]  # a list of ids (Llama 3)


def test_token_files_are_memory_mapped_in_nanogpts_layout(tmp_path):
    ids = np.arange(1000) % VOCAB
    ids.astype(np.uint16).tofile(tmp_path / "train.bin")  # nanoGPT's train.bin: uint16, no header
    np.save(tmp_path / "train.npy", ids.astype(np.int32))
    for name in ("train.bin", "train.npy"):
        mapped = open_token_file(str(tmp_path / name), VOCAB)
        assert isinstance(mapped, np.memmap) and mapped.tolist() == ids.tolist()
    big = open_token_file(str(tmp_path / "train.bin"), 1 << 16)  # 65,536 ids still fit uint16
    assert big.dtype == np.uint16
    np.arange(10, dtype=np.uint32).tofile(tmp_path / "wide.bin")  # more ids: uint32
    assert open_token_file(str(tmp_path / "wide.bin"), 1 << 17).tolist() == list(range(10))


def test_held_out_batches_are_consecutive_windows_and_the_same_every_time():
    stream = TokenStream(np.arange(100))
    first = eval_windows(stream, 0, 3, 10)
    assert first.tolist() == [list(range(0, 10)), list(range(10, 20)), list(range(20, 30))]
    assert torch.equal(eval_windows(stream, 4, 3, 10)[-1], torch.arange(40, 50))  # window 14 = 14 % 10 windows: 4
    assert torch.equal(train_windows(stream, 5, 4, 0, 10), train_windows(stream, 5, 4, 0, 10))
    train, held = stream.split(0.25)
    assert (len(train), held.ids[0]) == (75, 75)


def test_without_a_tokenizer_text_is_read_as_bytes_and_the_command_says_so(tmp_path):
    from hf_cases import make_config

    make_config("llama").to_json_file(str(tmp_path / "config.json"))
    (tmp_path / "text.txt").write_bytes(bytes(range(200)))
    md = get_model(f"hf:{tmp_path / 'config.json'}", data=str(tmp_path / "text.txt"), context=8)
    x, _ = md.batch(0, 2, 0)
    assert x.max() < 64 and x.tolist()[0] == [(x[0, 0].item() + i) % 64 for i in range(8)]  # bytes modulo 64
    run = run_cli("train", "--model", f"hf:{tmp_path / 'config.json'}", "--data", str(tmp_path / "text.txt"),
                  "-s", "none", "--steps", "1", "--batch-size", "2")  # the one-process run: no ranks to start
    assert run.returncode == 0, run.stderr
    assert run.stderr.strip() == (f"pipesched: no tokenizer.json in {str(tmp_path)!r}: reading --data as bytes "
                                  "(token id = byte modulo the vocabulary)")


def test_without_a_tokenizer_documents_end_at_the_configs_eos_and_bytes_hold_none(tmp_path):
    from hf_cases import make_config

    from pipesched.errors import ConfigError

    config = make_config("llama")
    config.to_json_file(str(tmp_path / "config.json"))
    eos = config.eos_token_id
    np.save(tmp_path / "ids.npy", np.array([5, 6, eos, 7, 8, 9, eos, 10] * 4, dtype=np.int32))
    md = get_model(f"hf:{tmp_path / 'config.json'}", data=str(tmp_path / "ids.npy"), context=8, packing="documents")
    x, _ = md.batch(0, 2, 0)
    want = [[i - max([0] + [j + 1 for j in range(i) if row[j] == eos]) for i in range(8)] for row in x.tolist()]
    assert md.batch_context(x)["position_ids"].tolist() == want
    (tmp_path / "text.txt").write_bytes(bytes(range(200)))
    with pytest.raises(ConfigError, match=r"^--packing documents: --data is read as bytes \(no tokenizer\)"):
        get_model(f"hf:{tmp_path / 'config.json'}", data=str(tmp_path / "text.txt"), context=8, packing="documents")


def test_reading_a_large_token_file_holds_its_windows_not_the_file(tmp_path):
    """A 64 MiB token file opened, checked and sampled as a rank does: the process's peak memory
    grows by far less than the file (the full file as int64 would be 256 MiB). Measured in a fresh
    process (ru_maxrss is a high-water mark); the bound leaves room for numpy's 8 MiB check buffer
    and allocator noise. benchmarks/token_file_memory.py measures a 1 GB file through the CLI."""
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        chunk = (np.arange(1 << 22) % 50000).astype(np.uint16).tobytes()
        for _ in range(8):
            f.write(chunk)
    code = f"""
import resource, numpy as np
from pipesched.data.streams import TokenStream, train_windows
from pipesched.data.token_files import open_token_file
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
stream = TokenStream(open_token_file({str(path)!r}, 50257))
for step in range(20):
    train_windows(stream, step, 64, 0, 1024)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""
    extra = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(),
                               check=True).stdout)
    assert extra < 24 * 2**20, extra


def test_bad_data_is_one_line_and_exit_2_before_any_rank_starts(folder, tmp_path):
    config = f"hf:{folder['model'] / 'config.json'}"
    no_text = tmp_path / "no_text.jsonl"
    no_text.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "no text here"}) + "\n")
    (tmp_path / "empty_tokenizer").mkdir()
    beyond = tmp_path / "beyond.bin"
    np.array([1, 2, VOCAB], dtype=np.uint16).tofile(beyond)
    rows = [
        (["--data", str(folder["jsonl"]), "--tokenizer", str(tmp_path / "empty_tokenizer")],
         f"--tokenizer {str(tmp_path / 'empty_tokenizer')!r}: no tokenizer.json in that folder"),
        (["--data", str(no_text)], f"--data {str(no_text)!r}: line 2 has no \"text\" field (a string)"),
        (["--data", str(beyond)], f"--data {str(beyond)!r}: token ids must be in 0..{VOCAB - 1} (the vocabulary), found 1..{VOCAB}"),
        (["--seq-len", "33"], "--seq-len 33 is beyond the model's 32 positions (max_position_embeddings)"),
        (["--eval-every", "2"], "--eval-every needs held-out data: --eval-data FILE or --eval-share SHARE"),
        (["--packing", "pad"], "--packing 'pad' is not one of across, documents"),
    ]
    results = concurrently(lambda row: run_cli("train", "--model", config, "--steps", "3", "--ranks", "2", *row[0]), rows)
    for (args, message), result in zip(rows, results):
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"pipesched: error: {message}"), (args, lines)


def test_a_long_text_reaches_the_tokenizer_in_pieces_cut_where_pre_tokenizers_cut():
    from pipesched.data.text_documents import pieces

    assert pieces("short", 8) == ["short"]
    assert pieces("one two three four", 8) == ["one two", " three", " four"]  # before a space: GPT-2's cut
    assert pieces("ab\ncd ef ghi", 8) == ["ab\n", "cd ef", " ghi"]  # after a line's end first
    assert pieces("x" * 20, 8) == ["x" * 8, "x" * 8, "x" * 4]  # no whitespace: at the size
    text = " ".join(shipped_documents()) * 3
    cut = pieces(text, 1000)
    assert "".join(cut) == text and all(0 < len(p) <= 1000 for p in cut) and len(cut) > 3


def test_one_long_document_is_tokenized_in_bounded_memory(folder, tmp_path):
    """A 2 MB one-line document: tokenized whole, it grew the process's peak by ~300 MiB past
    loading the tokenizer (benchmarks/long_document_memory.py); in pieces of 256Ki characters,
    by almost nothing."""
    words = " ".join(folder["docs"]).split()
    text = " ".join(words[i % len(words)] for i in range(400_000))[:2_000_000]
    data = write_jsonl(tmp_path / "long.jsonl", [text])
    code = (
        "import resource, sys\nfrom pathlib import Path\n"
        "from pipesched.data.tokenize_text import load_tokenizer, tokenized_file\n"
        f"load_tokenizer(Path({str(folder['model'])!r}))\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"tokenized_file({str(data)!r}, Path({str(folder['model'])!r}), {VOCAB})\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    grown_kib = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(),
                                   check=True, timeout=300).stdout)
    assert grown_kib < 128 << 10, grown_kib  # KiB


def test_more_held_out_batches_than_the_held_out_windows_are_clamped_in_one_line(folder):
    """``--eval-batches 100000000`` once re-evaluated the same windows for ever (each batch built
    before step 1): clamped to the batches that hold every held-out window once, and said."""
    run = run_cli("train", "--model", f"hf:{folder['model'] / 'config.json'}", "--data", str(folder["jsonl"]),
                  "-s", "none", "--steps", "1", "--batch-size", "4", "--seq-len", "16", "--eval-share", "0.05",
                  "--eval-batches", "100000000", "--timeout", "60", timeout=180)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    line = next(x for x in run.stderr.splitlines() if x.startswith("pipesched: --eval-batches 100000000: "))
    windows, batches = (int(w) for w in re.findall(r"holds (\d+) windows of --seq-len tokens, (\d+) batch", line)[0])
    assert batches == -(-windows // 4) and line.endswith(f"evaluating {batches}, each window once")


def test_a_tokenizer_without_an_eos_token_ends_documents_at_the_configs_eos_or_says_it_cannot(tmp_path, capsys):
    """A tokenizer saved by the ``tokenizers`` package alone (tokenizer.json, no
    tokenizer_config.json) names no eos_token. Its documents then end with the config's
    eos_token_id, the id ``--packing documents`` finds them by (they were joined with nothing
    between them, silently, and --packing documents then found no boundary); with no id at all,
    one line says they are joined so."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from pipesched.data.tokenize_text import tokenized_file

    docs = shipped_documents()[:3]
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.train_from_iterator(shipped_documents(), trainers.BpeTrainer(vocab_size=120, special_tokens=[EOS, "[UNK]"]))
    bpe.save(str(tmp_path / "tokenizer.json"))
    data = str(write_jsonl(tmp_path / "docs.jsonl", docs))
    ids = [bpe.encode(doc, add_special_tokens=False).ids for doc in docs]
    eos = bpe.token_to_id(EOS)
    # one id, a list (Llama 3's), none, one that is no id of the vocabulary
    for config_eos, separator in ((eos, [eos]), ((eos, 2), [eos]), (None, []), (-1, [])):
        stream = open_token_file(tokenized_file(data, tmp_path, VOCAB, "--data", config_eos), VOCAB)
        assert stream.tolist() == [i for one in ids for i in one + separator]
    joined = ": its documents are joined with nothing between them (name an eos_token in the tokenizer's " \
             "tokenizer_config.json, or eos_token_id in the config)"
    assert capsys.readouterr().err.splitlines() == [
        f"pipesched: --data {data!r}: the tokenizer in {str(tmp_path)!r} has no eos_token and the config no eos_token_id"
        + joined,
        f"pipesched: --data {data!r}: the config's eos_token_id -1 is no token id of the vocabulary (0 to {VOCAB - 1})"
        + joined]

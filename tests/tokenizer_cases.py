"""A model folder with its own tokenizer, built in the test: a small BPE trained with the
``tokenizers`` package on the text pipesched ships, saved as ``tokenizer.json`` beside a tiny
Llama's ``config.json``; and the same documents as ``.jsonl`` and ``.parquet``."""

from __future__ import annotations

import json
from pathlib import Path

from hf_cases import make_config

VOCAB = 128  # the model's; the BPE uses fewer (its alphabet and merges)
EOS = "<|endoftext|>"


def shipped_documents() -> list[str]:
    """The shipped text's lines, each a document."""
    from pipesched.data.streams import shipped_text_path

    text = Path(shipped_text_path()).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def model_folder(folder: Path, bpe_vocab: int = 120) -> Path:
    """``folder`` with config.json (Llama, vocabulary VOCAB) and a BPE's tokenizer files."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    make_config("llama", vocab_size=VOCAB, max_position_embeddings=32).to_json_file(str(folder / "config.json"))
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.train_from_iterator(shipped_documents(), trainers.BpeTrainer(vocab_size=bpe_vocab, special_tokens=[EOS, "[UNK]"]))
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, unk_token="[UNK]").save_pretrained(str(folder))
    return folder


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    return path


def write_parquet(path: Path, texts: list[str]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": texts}), str(path), row_group_size=7)  # several row groups
    return path

import functools
import hashlib
from pathlib import Path

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

DATA_DIR = Path(__file__).parent / "data"
GPT2_BPE_FILES = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}


@functools.cache
def gpt2_tokenizer() -> tiktoken.Encoding:
    """GPT-2's byte-level BPE, built from the tables shipped in course_lib/data (no network)."""
    for name, expected in GPT2_BPE_FILES.items():
        actual = hashlib.sha256((DATA_DIR / name).read_bytes()).hexdigest()
        if actual != expected:
            raise ValueError(f"{DATA_DIR / name} has sha256 {actual}, expected {expected}: "
                             "the file is damaged; restore it from the course repository")
    # tiktoken keeps a copy in its cache folder; passing the hashes stops it from ever serving a stale one.
    ranks = data_gym_to_mergeable_bpe_ranks(
        str(DATA_DIR / "vocab.bpe"), str(DATA_DIR / "encoder.json"),
        vocab_bpe_hash=GPT2_BPE_FILES["vocab.bpe"], encoder_json_hash=GPT2_BPE_FILES["encoder.json"])
    return tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)

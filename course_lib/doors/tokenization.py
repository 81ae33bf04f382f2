"""Not a lesson: the doors of notebook 01 (course_lib/tokenization.py): token ids, tokenizers' vocabularies and
merges, the texts they read, and the dataset and loader of training windows."""

import hashlib
import math
import operator

import torch

from ..guards import require_bool, require_int, require_type


def token_ids(ids, vocab_size: float = math.inf, name: str = "ids") -> list[int]:
    """Return `ids` (a sequence of ints or a 1-D tensor) as a list of ints in [0, vocab_size)."""
    try:  # a bool, a float, a str or a nested list is not an int: operator.index raises TypeError
        if isinstance(ids, (str, bytes)) or (isinstance(ids, torch.Tensor) and ids.dim() != 1):
            raise TypeError
        ids = [operator.index(None if isinstance(i, bool) else i) for i in
               (ids.tolist() if isinstance(ids, torch.Tensor) else list(ids))]
    except TypeError:
        got = (f"a tensor of shape {tuple(ids.shape)}, {ids.dtype}" if isinstance(ids, torch.Tensor)
               else type(ids).__name__)
        raise TypeError(f"{name} must be a sequence of int token ids or a 1-D integer tensor, got {got}: pass a list "
                        "like [15496, 11], or one row of a batch, ids[0]") from None
    for position, token_id in enumerate(ids):
        if not 0 <= token_id < vocab_size:
            raise ValueError(f"{name}[{position}] = {token_id} is not a token id: they run from 0 to {vocab_size - 1}")
    return ids


def text(text) -> None:
    """A str, the only thing a tokenizer can cut into chunks or characters."""
    require_type("text", text, str, "decode bytes first with .decode('utf-8')")


def char_vocabulary(chars) -> list[str]:
    """CharTokenizer's vocabulary as a list: a str or a list (or tuple) of distinct single characters, in order."""
    if not isinstance(chars, (str, list, tuple)):  # a set has no order: the ids would change from run to run
        raise TypeError(f"chars must be a str or a list of single characters, got {type(chars).__name__}")
    chars = list(chars)
    last = {ch: i for i, ch in enumerate(chars) if isinstance(ch, str) and len(ch) == 1}  # character -> its last place
    for i, ch in enumerate(chars):
        if not (isinstance(ch, str) and len(ch) == 1) or last[ch] != i:
            raise ValueError(f"chars[{i}] = {ch!r}: every entry must be one character, and none may repeat")
    return chars


def char_text(text, stoi: dict) -> None:
    """CharTokenizer.encode: a str whose every character is in the vocabulary `stoi` (no <unk>: section 2)."""
    require_type("text", text, str, "decode bytes first with .decode('utf-8')")
    unknown = sorted(set(text) - stoi.keys())
    if unknown:
        raise ValueError(f"characters {unknown} are not in the vocabulary: build it from a text that has them")


def words(words) -> None:
    """count_pairs: a dict from word (a tuple of symbols) to its count."""
    require_type("words", words, dict, "map each word, a tuple of symbols, to its count: {(b'h', b'i'): 3}")


def pair(pair) -> None:
    """merge_pair: two symbols (left, right); anything else would never match, a silent no-op."""
    if not (isinstance(pair, tuple) and len(pair) == 2):
        raise ValueError(f"pair must be two symbols (left, right), like (b'h', b'e'), got {pair!r}")


def num_merges(num_merges) -> None:
    """train_bpe: a whole number of merges, at least 0 (the text is refused by split_words' door)."""
    require_int("num_merges", num_merges, minimum=0)


def merges(merges) -> None:
    """BPETokenizer: a list of (bytes, bytes) pairs, each new, each made of tokens that exist by then (the 256 bytes
    and the tokens of the merges before it)."""
    require_type("merges", merges, list, "pass train_bpe(...) or gpt2_merges(), a list of (bytes, bytes) pairs")
    known, seen = {bytes([i]) for i in range(256)}, set()
    for rank, pair in enumerate(merges):
        if (not isinstance(pair, tuple) or len(pair) != 2
                or not all(isinstance(part, bytes) and part in known for part in pair) or pair in seen):
            raise ValueError(f"merges[{rank}] = {pair!r} is not a new pair of tokens that earlier merges made, "
                             "like (b'h', b'e'): list the merges once each, in the order they were learned")
        seen.add(pair)
        known.add(pair[0] + pair[1])


def gpt2_tables(folder, hashes: dict[str, str]) -> None:
    """gpt2_tokenizer: each table in `folder` has the sha256 it must have, so a damaged copy never gives wrong ids."""
    for name, expected in hashes.items():
        actual = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        if actual != expected:
            raise ValueError(f"{folder / name} has sha256 {actual}, expected {expected}: "
                             "the file is damaged; restore it from the course repository")


def dataset(ids, context_length, stride) -> list[int]:
    """GPTDataset: the token stream as a list of ids, positive window sizes, and at least one window's tokens."""
    for name, value in (("context_length", context_length), ("stride", stride)):
        require_int(name, value, minimum=1)
    ids = token_ids(ids, name="token_ids")
    if len(ids) < context_length + 1:
        raise ValueError(f"token_ids has {len(ids)} tokens, but one window needs context_length + 1 = "
                         f"{context_length + 1}: use a longer text or a smaller context_length")
    return ids


def dataloader(dataset, batch_size, shuffle, drop_last, seed) -> None:
    """create_dataloader, once the dataset is built: DataLoader's own arguments, refused here rather than deep
    inside its sampler, and a batch_size that leaves at least one batch."""
    require_int("batch_size", batch_size, minimum=1)
    require_int("seed", seed)
    require_bool("shuffle", shuffle)  # DataLoader would shuffle for any truthy value, "no" included
    require_bool("drop_last", drop_last)  # DataLoader would refuse None only when its sampler is built
    if drop_last and len(dataset) < batch_size:
        raise ValueError(f"batch_size {batch_size} is larger than the {len(dataset)} windows, so drop_last=True "
                         "would give no batch at all; lower batch_size or stride, or pass drop_last=False")

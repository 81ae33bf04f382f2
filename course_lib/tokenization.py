import functools
import hashlib
import numbers
from collections import Counter
from collections.abc import Iterable
from importlib.resources import files
from pathlib import Path

import regex
import tiktoken
import torch
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str
from torch.utils.data import DataLoader, Dataset


def check_token_ids(ids, vocab_size: int | None = None, name: str = "ids") -> list[int]:
    """Return `ids` (a sequence of ints or a 1-D tensor) as a list of ints in [0, vocab_size)."""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"{name} must be a sequence of token ids (ints), got {type(ids).__name__}; "
                        "turn text into ids with a tokenizer's encode() first")
    checked = []
    for position, token_id in enumerate(ids):
        if isinstance(token_id, bool) or not isinstance(token_id, numbers.Integral):
            raise TypeError(f"{name}[{position}] = {token_id!r} is not an int; token ids are whole numbers")
        if token_id < 0:
            raise ValueError(f"{name}[{position}] = {token_id} is negative; token ids start at 0")
        if vocab_size is not None and token_id >= vocab_size:
            raise ValueError(f"{name}[{position}] = {token_id} >= vocab_size {vocab_size}; "
                             f"this tokenizer only knows ids 0 to {vocab_size - 1}")
        checked.append(int(token_id))
    return checked


class CharTokenizer:
    """One id per character: id i stands for chars[i]."""

    def __init__(self, chars):
        if isinstance(chars, str) or not isinstance(chars, Iterable):
            raise TypeError(f"chars must be a sequence of one-character strings, got {type(chars).__name__}; "
                            "to build the vocabulary from a text use CharTokenizer.from_text(text)")
        self.chars = list(chars)
        if not self.chars:
            raise ValueError("chars is empty: a tokenizer needs at least one character; "
                             "build one from a text with CharTokenizer.from_text(text)")
        self.stoi = {}  # character -> id
        for i, ch in enumerate(self.chars):
            if not isinstance(ch, str) or len(ch) != 1:
                raise ValueError(f"chars[{i}] = {ch!r} is not a single character")
            if ch in self.stoi:
                raise ValueError(f"chars[{i}] = {ch!r} repeats chars[{self.stoi[ch]}]; "
                                 "every character needs exactly one id")
            self.stoi[ch] = i

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        """The vocabulary is the sorted set of characters that occur in `text`."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if not text:
            raise ValueError("text is empty: there are no characters to build a vocabulary from")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = []
        for position, ch in enumerate(text):
            if ch not in self.stoi:
                raise ValueError(f"character {ch!r} at position {position} is not in the vocabulary of "
                                 f"{self.vocab_size} characters; build the tokenizer from a text that "
                                 "contains it, e.g. CharTokenizer.from_text(training_text + new_text)")
            ids.append(self.stoi[ch])
        return ids

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in check_token_ids(ids, self.vocab_size))


GPT2_SPLIT_PATTERN = regex.compile(r50k_pat_str)


def split_words(text: str) -> list[str]:
    """Cut text into GPT-2's chunks (a word with its leading space, a number, punctuation, spaces)."""
    return GPT2_SPLIT_PATTERN.findall(text)


def count_pairs(words: dict[tuple[bytes, ...], int]) -> Counter:
    """How often each adjacent pair of symbols occurs; a word counts as often as it appears."""
    pairs = Counter()
    for symbols, freq in words.items():
        for pair in zip(symbols, symbols[1:]):
            pairs[pair] += freq
    return pairs


def merge_pair(symbols: tuple[bytes, ...], pair: tuple[bytes, bytes]) -> tuple[bytes, ...]:
    """Replace every occurrence of `pair` in `symbols`, scanning left to right, by the joined symbol."""
    merged, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            merged.append(pair[0] + pair[1])
            i += 2
        else:
            merged.append(symbols[i])
            i += 1
    return tuple(merged)


def check_int(name: str, value, minimum: int) -> None:
    """Raise TypeError unless `value` is an int, ValueError unless it is >= minimum."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def train_bpe(text: str, num_merges: int) -> list[tuple[bytes, bytes]]:
    """Learn up to `num_merges` byte-pair merges from `text`, GPT-2 style.

    Works on the UTF-8 bytes of each split_words chunk, so no merge crosses a chunk boundary. Each step
    merges the most frequent adjacent pair; a tie goes to the pair that sorts first as (left, right)
    bytes. Stops early when every chunk is a single symbol."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text:
        raise ValueError("text is empty: BPE learns its merges from pair counts, so it needs some text")
    check_int("num_merges", num_merges, 0)
    words = Counter(tuple(bytes([b]) for b in chunk.encode("utf-8")) for chunk in split_words(text))
    merges = []
    for _ in range(num_merges):
        pairs = count_pairs(words)
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))  # highest count, then smallest bytes
        merges.append(best)
        words = {merge_pair(symbols, best): freq for symbols, freq in words.items()}
    return merges


class BPETokenizer:
    """Byte-level BPE: ids 0-255 are the single bytes, id 256 + k is the token made by merges[k]."""

    def __init__(self, merges: list[tuple[bytes, bytes]]):
        self.vocab = {i: bytes([i]) for i in range(256)}  # id -> bytes
        self.token_to_id = {token: i for i, token in self.vocab.items()}  # bytes -> id
        self.ranks = {}  # pair -> its position in merges: lower ranks are applied first
        for rank, pair in enumerate(merges):
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(p, bytes) for p in pair)):
                raise TypeError(f"merges[{rank}] = {pair!r} is not a pair of bytes like (b'h', b'e')")
            if pair in self.ranks:
                raise ValueError(f"merges[{rank}] = {pair!r} repeats merges[{self.ranks[pair]}]")
            for part in pair:
                if part not in self.token_to_id:
                    raise ValueError(f"merges[{rank}] = {pair!r} uses {part!r}, which no earlier merge made; "
                                     "list the merges in the order they were learned")
            self.ranks[pair] = rank
            self.vocab[256 + rank] = pair[0] + pair[1]
            self.token_to_id[pair[0] + pair[1]] = 256 + rank

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """Apply the merges to each chunk, always the earliest-learned pair first, as GPT-2 does."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = []
        for chunk in split_words(text):
            symbols = tuple(bytes([b]) for b in chunk.encode("utf-8"))
            while len(symbols) > 1:
                pair = min(zip(symbols, symbols[1:]), key=lambda p: self.ranks.get(p, len(self.ranks)))
                if pair not in self.ranks:
                    break  # no learned merge applies any more
                symbols = merge_pair(symbols, pair)
            ids += [self.token_to_id[s] for s in symbols]
        return ids

    def decode(self, ids) -> str:
        """Join the tokens' bytes; bytes that are not valid UTF-8 (a cut character) become U+FFFD."""
        data = b"".join(self.vocab[i] for i in check_token_ids(ids, self.vocab_size))
        return data.decode("utf-8", errors="replace")


DATA_DIR = Path(files("course_lib")) / "data"
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


def gpt2_merges() -> list[tuple[bytes, bytes]]:
    """GPT-2's 50,000 merges from vocab.bpe, in the order learned, as pairs of bytes for BPETokenizer."""
    gpt2_tokenizer()  # checks the sha256 of both tables (cached after the first call)
    # vocab.bpe spells every byte as a visible character: the 188 printable Latin-1 bytes stand for
    # themselves, the other 68 (space, control bytes, ...) for chr(256), chr(257), ... in byte order.
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    hidden = [b for b in range(256) if b not in printable]
    char_to_byte = {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(hidden)}
    lines = (DATA_DIR / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:-1]  # skip "#version" line
    return [tuple(bytes(char_to_byte[c] for c in part) for part in line.split()) for line in lines]


class GPTDataset(Dataset):
    """Next-token training pairs cut from one token stream by a sliding window.

    Window k starts at token k * stride; its input is the next context_length tokens and its target
    is the same span shifted one token to the right."""

    def __init__(self, token_ids, context_length: int, stride: int):
        check_int("context_length", context_length, 1)
        check_int("stride", stride, 1)
        ids = check_token_ids(token_ids, name="token_ids")
        if not ids:
            raise ValueError("token_ids is empty: encode a non-empty text first")
        if len(ids) < context_length + 1:
            raise ValueError(f"token_ids has {len(ids)} tokens, but one window needs context_length + 1 = "
                             f"{context_length + 1} (the target reaches one token further); "
                             "use a longer text or a smaller context_length")
        self.token_ids = torch.tensor(ids, dtype=torch.long)  # (num_tokens,)
        self.context_length = context_length
        self.stride = stride

    def __len__(self) -> int:
        return (len(self.token_ids) - self.context_length - 1) // self.stride + 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"window {index} is out of range: the dataset has {len(self)} windows")
        start = (index % len(self)) * self.stride
        window = self.token_ids[start:start + self.context_length + 1]  # (context_length + 1,)
        return window[:-1], window[1:]  # input, target: (context_length,) each


def create_dataloader(token_ids, batch_size: int, context_length: int, stride: int,
                      shuffle: bool = True, drop_last: bool = True, seed: int = 123) -> DataLoader:
    """Batches of (inputs, targets), each (batch_size, context_length), from a token stream.

    Shuffling draws from a torch.Generator seeded with `seed`: the same seed gives the same batches."""
    check_int("batch_size", batch_size, 1)
    check_int("seed", seed, 0)
    for name, value in (("shuffle", shuffle), ("drop_last", drop_last)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    dataset = GPTDataset(token_ids, context_length, stride)
    if drop_last and len(dataset) < batch_size:
        raise ValueError(f"batch_size {batch_size} is larger than the {len(dataset)} windows, so drop_last=True "
                         "would give no batch at all; lower batch_size or stride, or pass drop_last=False")
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, generator=generator)

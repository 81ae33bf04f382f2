"""Issue 30: the doors of course_lib.tokenization, called as a user who has not read the code would call them. Each
case is a call and its expected outcome: ("error", type, a fragment of the message that names the argument) or
("result", check). `python tests/test_doors_tokenization.py` counts the outcomes as clear / correct / unclear /
silent."""


import numpy as np
import pytest
import torch

import course_lib.tokenization as tokenization
from course_lib.tokenization import (EOS_ID, BPETokenizer, CharTokenizer, GPTDataset, count_pairs,
                                     create_dataloader, gpt2_merges, gpt2_tokenizer, merge_pair, split_words,
                                     train_bpe)
from course_lib.doors.tokenization import token_ids

from doors import door_tests, report

CHARS = CharTokenizer("abc")
BPE = BPETokenizer(train_bpe("hello hello world", 5))
IDS = list(range(20))


def equals(expected):
    return lambda result: result == expected


def dataset_len(expected):
    return lambda ds: len(ds) == expected and torch.equal(ds[0][1], ds[0][0] + 1)


CASES = [
    # token_ids, the door every decode goes through
    ("ids list", lambda: token_ids([1, 2], 5), ("result", equals([1, 2]))),
    ("ids tensor", lambda: token_ids(torch.tensor([1, 2]), 5), ("result", equals([1, 2]))),
    ("ids numpy", lambda: token_ids(np.array([1, 2]), 5), ("result", equals([1, 2]))),
    ("ids tuple", lambda: token_ids((3,)), ("result", equals([3]))),
    ("ids empty", lambda: token_ids([]), ("result", equals([]))),
    ("ids float list", lambda: token_ids([1.0, 2]), ("error", TypeError, "ids must be a sequence of int token ids")),
    ("ids float tensor", lambda: token_ids(torch.tensor([1.0])), ("error", TypeError, "ids must be a sequence of int")),
    ("ids bool", lambda: token_ids([True, 2]), ("error", TypeError, "ids must be a sequence of int token ids")),
    ("ids bool tensor", lambda: token_ids(torch.tensor([True])), ("error", TypeError, "ids must be a sequence of int")),
    ("ids 2-D tensor", lambda: token_ids(torch.tensor([[1, 2]])), ("error", TypeError, "1-D integer tensor")),
    ("ids 0-D tensor", lambda: token_ids(torch.tensor(3)), ("error", TypeError, "1-D integer tensor")),
    ("ids nested list", lambda: token_ids([[1, 2]]), ("error", TypeError, "ids must be a sequence of int token ids")),
    ("ids int", lambda: token_ids(3), ("error", TypeError, "or a 1-D integer tensor, got int")),
    ("ids str", lambda: token_ids("12"), ("error", TypeError, "or a 1-D integer tensor, got str")),
    ("ids None", lambda: token_ids(None), ("error", TypeError, "ids must be a sequence of int token ids")),
    ("ids negative", lambda: token_ids([-1]), ("error", ValueError, "ids[0] = -1 is not a token id")),
    ("ids = vocab", lambda: token_ids([0, 5], 5), ("error", ValueError, "ids[1] = 5 is not a token id")),
    # CharTokenizer
    ("char ok", lambda: CharTokenizer("cab").encode("abc"), ("result", equals([1, 2, 0]))),
    ("char list", lambda: CharTokenizer(["x", "y"]).decode([1, 0]), ("result", equals("yx"))),
    ("char empty", lambda: CharTokenizer("").vocab_size, ("result", equals(0))),
    ("char repeat", lambda: CharTokenizer("abca"), ("error", ValueError, "none may repeat")),
    ("char two letters", lambda: CharTokenizer(["ab"]), ("error", ValueError, "every entry must be one character")),
    ("char None", lambda: CharTokenizer(None), ("error", TypeError, "chars must be")),
    ("char int", lambda: CharTokenizer(5), ("error", TypeError, "chars must be")),
    ("char nested list", lambda: CharTokenizer([["a"]]), ("error", ValueError, "chars[0] = ['a']: every entry")),
    ("from_text ok", lambda: CharTokenizer.from_text("hello").chars, ("result", equals(["e", "h", "l", "o"]))),
    ("from_text None", lambda: CharTokenizer.from_text(None), ("error", TypeError, "text must be a str")),
    ("from_text bytes", lambda: CharTokenizer.from_text(b"hi"), ("error", TypeError, "text must be a str")),
    ("char encode unknown", lambda: CHARS.encode("abz"), ("error", ValueError, "characters ['z'] are not in")),
    ("char encode None", lambda: CHARS.encode(None), ("error", TypeError, "text must be a str")),
    ("char encode bytes", lambda: CHARS.encode(b"ab"), ("error", TypeError, "text must be a str")),
    ("char decode tensor", lambda: CHARS.decode(torch.tensor([2, 0])), ("result", equals("ca"))),
    ("char decode 2-D", lambda: CHARS.decode(torch.tensor([[0, 1]])), ("error", TypeError, "1-D integer tensor")),
    ("char decode 3", lambda: CHARS.decode([3]), ("error", ValueError, "ids[0] = 3 is not a token id")),
    ("char decode str", lambda: CHARS.decode("01"), ("error", TypeError, "ids must be a sequence of int token ids")),
    ("char decode float", lambda: CHARS.decode([0.0]), ("error", TypeError, "ids must be a sequence of int token ids")),
    # split_words, count_pairs, merge_pair
    ("split ok", lambda: split_words("Hi, you 42"), ("result", equals(["Hi", ",", " you", " 42"]))),
    ("split empty", lambda: split_words(""), ("result", equals([]))),
    ("split None", lambda: split_words(None), ("error", TypeError, "text must be a str")),
    ("split bytes", lambda: split_words(b"hi"), ("error", TypeError, "text must be a str")),
    ("split list", lambda: split_words(["a b"]), ("error", TypeError, "text must be a str")),
    ("count ok", lambda: count_pairs({(b"a", b"b", b"a"): 2}), ("result", equals({(b"a", b"b"): 2, (b"b", b"a"): 2}))),
    ("count list", lambda: count_pairs([(b"a", b"b")]), ("error", TypeError, "words must be a dict")),
    ("count None", lambda: count_pairs(None), ("error", TypeError, "words must be a dict")),
    ("merge ok", lambda: merge_pair((b"a", b"b", b"a", b"b"), (b"a", b"b")), ("result", equals((b"ab", b"ab")))),
    ("merge overlapping", lambda: merge_pair((b"a", b"a", b"a"), (b"a", b"a")), ("result", equals((b"aa", b"a")))),
    ("merge list symbols", lambda: merge_pair([b"a", b"b"], (b"a", b"b")), ("result", equals((b"ab",)))),
    ("merge pair of 3", lambda: merge_pair((b"a", b"b"), (b"a", b"b", b"c")), ("error", ValueError, "pair must be two")),
    ("merge pair bytes", lambda: merge_pair((b"a", b"b"), b"ab"), ("error", ValueError, "pair must be two")),
    # train_bpe
    ("train ok", lambda: train_bpe("aaab", 2), ("result", equals([(b"a", b"a"), (b"a", b"b")]))),
    ("train 0", lambda: train_bpe("aaab", 0), ("result", equals([]))),
    ("train empty text", lambda: train_bpe("", 3), ("result", equals([]))),
    ("train -1", lambda: train_bpe("aa", -1), ("error", ValueError, "num_merges must be >= 0")),
    ("train 1.5", lambda: train_bpe("aa", 1.5), ("error", TypeError, "num_merges must be an int")),
    ("train True", lambda: train_bpe("aa", True), ("error", TypeError, "num_merges must be an int")),
    ("train None text", lambda: train_bpe(None, 2), ("error", TypeError, "text must be a str")),
    ("train bytes text", lambda: train_bpe(b"aaa", 2), ("error", TypeError, "text must be a str")),
    # BPETokenizer
    ("bpe no merges", lambda: BPETokenizer([]).encode("hi"), ("result", equals([104, 105]))),
    ("bpe round trip", lambda: BPE.decode(BPE.encode("héllo 🤖 world")), ("result", equals("héllo 🤖 world"))),
    ("bpe duplicate", lambda: BPETokenizer([(b"a", b"b"), (b"a", b"b")]), ("error", ValueError, "merges[1]")),
    ("bpe unknown part", lambda: BPETokenizer([(b"ab", b"c")]), ("error", ValueError, "merges[0]")),
    ("bpe str pair", lambda: BPETokenizer([("a", "b")]), ("error", ValueError, "merges[0]")),
    ("bpe list pair", lambda: BPETokenizer([[b"a", b"b"]]), ("error", ValueError, "merges[0]")),
    ("bpe list in pair", lambda: BPETokenizer([([b"a"], b"b")]), ("error", ValueError, "merges[0]")),
    ("bpe str merges", lambda: BPETokenizer("ab"), ("error", TypeError, "merges must be a list")),
    ("bpe None", lambda: BPETokenizer(None), ("error", TypeError, "merges must be a list")),
    ("bpe encode None", lambda: BPE.encode(None), ("error", TypeError, "text must be a str")),
    ("bpe encode bytes", lambda: BPE.encode(b"hi"), ("error", TypeError, "text must be a str")),
    ("bpe decode too big", lambda: BPE.decode([BPE.vocab_size]), ("error", ValueError, "is not a token id")),
    ("bpe decode 2-D", lambda: BPE.decode(torch.tensor([[104]])), ("error", TypeError, "1-D integer tensor")),
    ("bpe decode cut char", lambda: BPE.decode(list("é".encode())[:1]), ("result", equals("\ufffd"))),
    # GPT-2's tables
    ("gpt2 encode", lambda: gpt2_tokenizer().encode("<|endoftext|>", allowed_special="all"), ("result", equals([EOS_ID]))),
    ("gpt2 merges", lambda: gpt2_merges()[:1], ("result", lambda merges: len(merges) == 1 and all(isinstance(p, bytes) for p in merges[0]))),
    # GPTDataset
    ("dataset ok", lambda: GPTDataset(IDS, 4, 2), ("result", dataset_len(8))),
    ("dataset tensor", lambda: GPTDataset(torch.arange(20), 4, 2), ("result", dataset_len(8))),
    ("dataset stride > window", lambda: GPTDataset(IDS, 4, 100), ("result", dataset_len(1))),
    ("dataset 2-D tensor", lambda: GPTDataset(torch.arange(20).view(2, 10), 4, 2), ("error", TypeError, "token_ids must")),
    ("dataset text", lambda: GPTDataset("hello world", 4, 2), ("error", TypeError, "token_ids must be a sequence of int")),
    ("dataset floats", lambda: GPTDataset([1.0] * 10, 4, 2), ("error", TypeError, "token_ids must be a sequence of int")),
    ("dataset negative id", lambda: GPTDataset([-1] * 10, 4, 2), ("error", ValueError, "token_ids[0] = -1")),
    ("dataset too short", lambda: GPTDataset(IDS[:4], 4, 2), ("error", ValueError, "token_ids has 4 tokens")),
    ("dataset context 0", lambda: GPTDataset(IDS, 0, 2), ("error", ValueError, "context_length must be >= 1")),
    ("dataset stride 0", lambda: GPTDataset(IDS, 4, 0), ("error", ValueError, "stride must be >= 1")),
    ("dataset stride 1.5", lambda: GPTDataset(IDS, 4, 1.5), ("error", TypeError, "stride must be an int")),
    ("dataset index -1", lambda: GPTDataset(IDS, 4, 2)[-1][0].tolist(), ("result", equals([14, 15, 16, 17]))),
    ("dataset index 99", lambda: GPTDataset(IDS, 4, 2)[99], ("error", IndexError, "out of range")),
    # create_dataloader
    ("loader ok", lambda: [x.shape for x, _ in create_dataloader(IDS, 2, 4, 4, shuffle=False)],
     ("result", equals([(2, 4), (2, 4)]))),
    ("loader seed", lambda: [torch.equal(a, b) for (a, _), (b, _) in zip(create_dataloader(IDS, 2, 4, 2, seed=5),
                                                                           create_dataloader(IDS, 2, 4, 2, seed=5))],
     ("result", equals([True] * 4))),
    ("loader keep last", lambda: len(create_dataloader(IDS, 100, 4, 2, drop_last=False)), ("result", equals(1))),
    ("loader batch 0", lambda: create_dataloader(IDS, 0, 4, 2), ("error", ValueError, "batch_size must be >= 1")),
    ("loader batch 2.0", lambda: create_dataloader(IDS, 2.0, 4, 2), ("error", TypeError, "batch_size must be an int")),
    ("loader batch str", lambda: create_dataloader(IDS, "2", 4, 2), ("error", TypeError, "batch_size must be an int")),
    ("loader batch too big", lambda: create_dataloader(IDS, 100, 4, 2), ("error", ValueError, "batch_size 100 is larger")),
    ("loader shuffle 'no'", lambda: create_dataloader(IDS, 2, 4, 2, shuffle="no"), ("error", TypeError, "shuffle must be True or False")),
    ("loader drop_last None", lambda: create_dataloader(IDS, 2, 4, 2, drop_last=None),
     ("error", TypeError, "drop_last must be True or False, got None")),
    ("loader drop_last 0", lambda: create_dataloader(IDS, 2, 4, 2, drop_last=0),
     ("error", TypeError, "drop_last must be True or False, got 0")),
    ("loader seed None", lambda: create_dataloader(IDS, 2, 4, 2, seed=None), ("error", TypeError, "seed must be an int")),
    ("loader seed 1.5", lambda: create_dataloader(IDS, 2, 4, 2, seed=1.5), ("error", TypeError, "seed must be an int")),
]


def damaged_tables(tmp_path, monkeypatch):
    """gpt2_tokenizer reading a truncated vocab.bpe: the checksum refuses it before tiktoken reads a line."""
    for name in ("vocab.bpe", "encoder.json"):
        (tmp_path / name).write_bytes((tokenization.DATA_DIR / name).read_bytes())
    (tmp_path / "vocab.bpe").write_bytes((tmp_path / "vocab.bpe").read_bytes()[:1000])
    monkeypatch.setattr(tokenization, "DATA_DIR", tmp_path)
    return gpt2_tokenizer.__wrapped__


def test_damaged_tables_are_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="vocab.bpe has sha256 .*the file is damaged"):
        damaged_tables(tmp_path, monkeypatch)()


def test_missing_table_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenization, "DATA_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="vocab.bpe"):
        gpt2_tokenizer.__wrapped__()


test_door = door_tests(CASES)


if __name__ == "__main__":  # the counts of issue 30's closing note
    report(CASES)

import hashlib
import re
import shutil
import socket

import pytest
import torch

from course_lib import tokenization
from course_lib.tokenization import (
    GPT2_BPE_FILES, BPETokenizer, CharTokenizer, GPTDataset, count_pairs, create_dataloader, gpt2_merges,
    gpt2_tokenizer, merge_pair, split_words, train_bpe)
from course_lib.doors.tokenization import token_ids

# The hashes tiktoken itself expects for GPT-2's tables (stated in issue 2).
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

# Reference ids of Hugging Face's GPT-2 tokenizer; every one also agrees with our from-scratch
# BPETokenizer run on GPT-2's merges (test_our_bpe_with_gpt2_merges_agrees_with_tiktoken).
GPT2_GOLDEN = {
    "Every effort moves you": [6109, 3626, 6100, 345],
    "Hello, my dog is cute": [15496, 11, 616, 3290, 318, 13779],
    "The quick brown fox jumps over the lazy dog.": [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13],
    "caf\u00e9 na\u00efve": [66, 1878, 2634, 41492],
    "\U0001F600 emoji": [47249, 222, 44805],
}


@pytest.fixture
def fresh_cache():
    """Each use builds gpt2_tokenizer anew, and leaves no patched build behind in the cache."""
    gpt2_tokenizer.cache_clear()
    yield
    gpt2_tokenizer.cache_clear()


# ---- GPT-2's tables and tokenizer ------------------------------------------------------------------

def test_shipped_tables_have_the_hashes_tiktoken_expects():
    assert GPT2_BPE_FILES == {"vocab.bpe": VOCAB_BPE_SHA256, "encoder.json": ENCODER_JSON_SHA256}
    for name, expected in GPT2_BPE_FILES.items():
        assert hashlib.sha256((tokenization.DATA_DIR / name).read_bytes()).hexdigest() == expected


@pytest.mark.parametrize("text, ids", GPT2_GOLDEN.items())
def test_gpt2_exact_ids_and_round_trip(text, ids):
    enc = gpt2_tokenizer()
    assert enc.encode(text) == ids
    assert enc.decode(ids) == text


def test_gpt2_special_token():
    enc = gpt2_tokenizer()
    assert enc.n_vocab == 50257 and enc.eot_token == 50256
    assert enc.encode("Hello<|endoftext|>world", allowed_special={"<|endoftext|>"}) == [15496, 50256, 6894]
    assert 50256 not in enc.encode("Hello<|endoftext|>world", disallowed_special=())
    with pytest.raises(ValueError, match="special token"):
        enc.encode("Hello<|endoftext|>world")


def test_gpt2_round_trip_of_non_ascii_and_emoji():
    enc = gpt2_tokenizer()
    text = "Zo\u00eb's caf\u00e9 \u2615, \u4f60\u597d\uff0c\u4e16\u754c \U0001F30A\n\ttabs  and   spaces"
    assert enc.decode(enc.encode(text)) == text


def test_gpt2_tokenizer_is_cached():
    assert gpt2_tokenizer() is gpt2_tokenizer()


def test_gpt2_tokenizer_needs_no_network(monkeypatch, tmp_path, fresh_cache):
    def no_network(*args, **kwargs):
        raise OSError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # empty: tiktoken finds no cached copy
    enc = gpt2_tokenizer()
    assert enc.encode("Every effort moves you") == [6109, 3626, 6100, 345]
    assert enc.n_vocab == 50257
    assert len(list(tmp_path.iterdir())) == 2  # tiktoken read both tables afresh (and cached them there)


def test_damaged_table_gives_a_clear_error(monkeypatch, tmp_path, fresh_cache):
    for name in GPT2_BPE_FILES:
        shutil.copy(tokenization.DATA_DIR / name, tmp_path / name)
    data = bytearray((tmp_path / "vocab.bpe").read_bytes())
    data[100] ^= 1  # one bit of one byte
    (tmp_path / "vocab.bpe").write_bytes(bytes(data))
    monkeypatch.setattr(tokenization, "DATA_DIR", tmp_path)
    with pytest.raises(ValueError, match=rf"vocab\.bpe has sha256 [0-9a-f]{{64}}, expected {VOCAB_BPE_SHA256}: "
                                         "the file is damaged; restore it from the course repository"):
        gpt2_tokenizer()


def test_our_bpe_with_gpt2_merges_agrees_with_tiktoken():
    merges = gpt2_merges()
    assert len(merges) == 50000 and merges[:3] == [(b" ", b"t"), (b" ", b"a"), (b"h", b"e")]
    ours, enc = BPETokenizer(merges), gpt2_tokenizer()
    text = " ".join(GPT2_GOLDEN) + " isn't it?  1,000.50 a\tb \u4f60\u597d\uff0c\u4e16\u754c  trailing   "
    our_ids, their_ids = ours.encode(text), enc.encode(text)
    assert [ours.vocab[i] for i in our_ids] == [enc.decode_single_token_bytes(i) for i in their_ids]
    assert all(a == b for a, b in zip(our_ids, their_ids) if a >= 256)  # merge k is id 256 + k in both
    for text, ids in GPT2_GOLDEN.items():
        assert [ours.vocab[i] for i in ours.encode(text)] == [enc.decode_single_token_bytes(i) for i in ids]


# ---- CharTokenizer ---------------------------------------------------------------------------------

def test_char_tokenizer_round_trip_and_vocabulary():
    tok = CharTokenizer.from_text("hello world")
    assert tok.chars == [" ", "d", "e", "h", "l", "o", "r", "w"] and tok.vocab_size == 8
    assert tok.encode("hello") == [3, 2, 4, 4, 5]
    assert tok.decode([3, 2, 4, 4, 5]) == "hello"
    assert tok.decode(torch.tensor([7, 5, 6])) == "wor"
    assert tok.decode(tok.encode("world hello")) == "world hello"
    assert tok.encode("") == [] and tok.decode([]) == ""
    rebuilt = CharTokenizer(tok.chars)
    assert rebuilt.encode("hello world") == tok.encode("hello world")


def test_char_tokenizer_unknown_character():
    tok = CharTokenizer.from_text("hello world")
    with pytest.raises(ValueError, match=r"characters \['Z', 'a', 'b'\] are not in the vocabulary: build it from a text "
                                         r"that has them"):
        tok.encode("hello Zebra")


@pytest.mark.parametrize("chars, error, message", [
    (["a", "bc"], ValueError, r"chars\[1\] = 'bc': every entry must be one character, and none may repeat"),
    (["a", 5], ValueError, r"chars\[1\] = 5: every entry must be one character"),
    (["a", "b", "a"], ValueError, r"chars\[0\] = 'a': every entry must be one character, and none may repeat"),
    (42, TypeError, "chars must be a str or a list of single characters, got int"),
    ({"a", "b"}, TypeError, "chars must be a str or a list of single characters, got set"),  # a set has no order
])
def test_char_tokenizer_rejects_bad_vocabularies(chars, error, message):
    with pytest.raises(error, match=message):
        CharTokenizer(chars)


def test_char_tokenizer_from_text_errors():
    with pytest.raises(TypeError, match=re.escape("text must be a str, got bytes: decode bytes first with .decode('utf-8')")):
        CharTokenizer.from_text(b"ab")
    with pytest.raises(TypeError, match="text must be a str, got int"):
        CharTokenizer.from_text(3)


def test_char_tokenizer_encode_and_decode_errors():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(TypeError, match="text must be a str, got int"):
        tok.encode(3)
    with pytest.raises(ValueError, match=r"ids\[1\] = 3 is not a token id: they run from 0 to 2"):
        tok.decode([0, 3])
    with pytest.raises(ValueError, match=r"ids\[0\] = -1 is not a token id: they run from 0 to 2"):
        tok.decode([-1])  # chars[-1] would silently be the last character
    with pytest.raises(TypeError, match="ids must be a sequence of int token ids or a 1-D integer tensor, got list"):
        tok.decode([0, 1.0])
    with pytest.raises(TypeError, match="ids must be a sequence of int token ids or a 1-D integer tensor, got str"):
        tok.decode("abc")
    with pytest.raises(TypeError, match="got list"):
        tok.decode([True, 0])  # a bool is not a token id


def test_token_ids_door_accepts_tensors_and_rejects_2d():
    assert token_ids(torch.tensor([1, 2]), vocab_size=3) == [1, 2]
    with pytest.raises(TypeError, match=re.escape("token_ids must be a sequence of int token ids or a 1-D integer "
                                                  "tensor, got a tensor of shape (1, 2), torch.int64: pass a list like "
                                                  "[15496, 11], or one row of a batch, ids[0]")):
        token_ids(torch.tensor([[1, 2]]), name="token_ids")
    with pytest.raises(TypeError, match="ids must be a sequence of int token ids or a 1-D integer tensor, got int"):
        token_ids(5)


def test_check_token_ids_still_imports_from_the_lesson_with_a_warning():
    with pytest.warns(DeprecationWarning, match="course_lib.doors.tokenization.token_ids"):
        from course_lib.tokenization import check_token_ids
    assert check_token_ids is token_ids


# ---- BPE from scratch ------------------------------------------------------------------------------

def test_split_words_keeps_the_leading_space_with_the_word():
    assert split_words("The sea, 412 waves!  ok") == ["The", " sea", ",", " 412", " waves", "!", " ", " ok"]


def test_count_pairs_and_merge_pair():
    words = {(b"a", b"b", b"a", b"b"): 2, (b"b", b"a"): 1}
    assert count_pairs(words) == {(b"a", b"b"): 4, (b"b", b"a"): 3}
    assert merge_pair((b"a", b"b", b"a", b"b"), (b"a", b"b")) == (b"ab", b"ab")
    assert merge_pair((b"a", b"a", b"a"), (b"a", b"a")) == (b"aa", b"a")  # left to right, no overlap
    assert merge_pair((b"x",), (b"a", b"b")) == (b"x",)


def test_train_bpe_merges_a_tiny_text_as_worked_out_by_hand():
    # Chunks: "aaab" once and " aaab" twice.
    # Step 0: (a,a) 6, (a,b) 3, (' ',a) 2 -> merge a+a;   "aa a b" / " aa a b"
    # Step 1: (aa,a) 3, (a,b) 3 tie; (b'a', b'b') sorts before (b'aa', b'a') -> merge a+b
    # Step 2: (aa,ab) 3 -> "aaab";  step 3: (' ', aaab) 2 -> " aaab"; then nothing is left to merge.
    merges = train_bpe("aaab aaab aaab", num_merges=10)
    assert merges == [(b"a", b"a"), (b"a", b"b"), (b"aa", b"ab"), (b" ", b"aaab")]
    tok = BPETokenizer(merges)
    assert tok.vocab_size == 260 and tok.vocab[259] == b" aaab"
    assert tok.encode("aaab aaab") == [258, 259]
    assert train_bpe("aaab aaab aaab", num_merges=2) == merges[:2]
    assert train_bpe("abc", num_merges=0) == [] and train_bpe("", num_merges=5) == []


def test_train_bpe_tie_breaking_is_by_bytes_not_by_order_of_appearance():
    # Every pair occurs once, so each step is a tie: the smallest (left, right) bytes win, wherever they are.
    assert train_bpe("yz ab", num_merges=5) == [(b" ", b"a"), (b" a", b"b"), (b"y", b"z")]  # then stops early
    assert train_bpe("ab yz", num_merges=1) == [(b" ", b"y")]


def test_bpe_round_trip_on_unseen_text():
    train = "the cat sat on the mat with the hat. the rat ran past the cat and the bat."
    tok = BPETokenizer(train_bpe(train, num_merges=30))
    for text in ["the bat sat on a hat", "Zoë drinks café au lait ☕ 🌊", "", "\n\n  \t x"]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
    assert len(tok.encode("the cat")) < len("the cat".encode("utf-8"))  # merges actually compress


def test_bpe_decode_of_a_cut_character_gives_the_replacement_character():
    tok = BPETokenizer([])
    assert tok.decode(list("é".encode("utf-8"))[:1]) == "\ufffd"


@pytest.mark.parametrize("args, error, message", [
    ((b"abc", 5), TypeError, "text must be a str, got bytes"),
    (("abc", -1), ValueError, "num_merges must be >= 0, got -1"),
    (("abc", 2.0), TypeError, r"num_merges must be an int, got 2.0 \(float\)"),
    (("abc", True), TypeError, r"num_merges must be an int, got True \(bool\)"),
])
def test_train_bpe_rejects_bad_inputs(args, error, message):
    with pytest.raises(error, match=message):
        train_bpe(*args)


@pytest.mark.parametrize("merges, error, message", [
    ([(b"a", b"b"), (b"ab",)], ValueError, r"merges\[1\] = \(b'ab',\) is not a new pair of tokens"),
    ([("a", "b")], ValueError, r"merges\[0\] = \('a', 'b'\) is not a new pair of tokens that earlier merges made"),
    ([(b"a", b"b"), (b"a", b"b")], ValueError, r"merges\[1\] = \(b'a', b'b'\) is not a new pair of tokens"),
    ([(b"ab", b"c")], ValueError, r"merges\[0\] = \(b'ab', b'c'\) is not a new pair of tokens that earlier merges "
                                  r"made, like \(b'h', b'e'\): list the merges once each, in the order they were learned"),
])
def test_bpe_tokenizer_rejects_bad_merges(merges, error, message):
    with pytest.raises(error, match=message):
        BPETokenizer(merges)


def test_bpe_tokenizer_encode_and_decode_errors():
    tok = BPETokenizer([(b"a", b"b")])
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        tok.encode(b"ab")
    with pytest.raises(ValueError, match=r"ids\[0\] = 257 is not a token id: they run from 0 to 256"):
        tok.decode([257])


# ---- GPTDataset and create_dataloader ---------------------------------------------------------------

@pytest.mark.parametrize("n, context_length, stride", [(5, 4, 1), (20, 4, 4), (21, 4, 4), (100, 7, 3), (9, 1, 1)])
def test_dataset_length_and_windows(n, context_length, stride):
    ids = list(range(100, 100 + n))
    dataset = GPTDataset(ids, context_length, stride)
    assert len(dataset) == (n - context_length - 1) // stride + 1
    for k in range(len(dataset)):
        x, y = dataset[k]
        start = k * stride
        assert x.dtype == y.dtype == torch.long and x.shape == y.shape == (context_length,)
        assert x.tolist() == ids[start:start + context_length]
        assert y.tolist() == ids[start + 1:start + context_length + 1]  # the input shifted by one
    last_start = (len(dataset) - 1) * stride
    assert last_start + context_length + 1 <= n < last_start + stride + context_length + 1  # no window missed
    assert torch.equal(dataset[-1][0], dataset[len(dataset) - 1][0])
    with pytest.raises(IndexError, match="range object index out of range"):
        dataset[len(dataset)]


def test_dataset_stride_controls_overlap():
    ids = list(range(13))
    no_overlap, overlap = GPTDataset(ids, 4, 4), GPTDataset(ids, 4, 2)
    assert [no_overlap[k][0].tolist() for k in range(len(no_overlap))] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert [overlap[k][0].tolist() for k in range(len(overlap))] == [
        [0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7], [6, 7, 8, 9], [8, 9, 10, 11]]


def test_dataset_accepts_a_tensor():
    dataset = GPTDataset(torch.arange(10), 3, 3)
    assert len(dataset) == 3 and dataset[2][1].tolist() == [7, 8, 9]


@pytest.mark.parametrize("token_ids, context_length, stride, error, message", [
    ([], 4, 1, ValueError, r"token_ids has 0 tokens, but one window needs context_length \+ 1 = 5"),
    ("some text", 4, 1, TypeError, "token_ids must be a sequence of int token ids or a 1-D integer tensor, got str"),
    ([1, 2, 3, 4], 4, 1, ValueError, r"token_ids has 4 tokens, but one window needs context_length \+ 1 = 5: "
                                     r"use a longer text or a smaller context_length"),
    (list(range(10)), 0, 1, ValueError, "context_length must be >= 1, got 0"),
    (list(range(10)), -3, 1, ValueError, "context_length must be >= 1, got -3"),
    (list(range(10)), 4, 0, ValueError, "stride must be >= 1, got 0"),
    (list(range(10)), 4.0, 1, TypeError, r"context_length must be an int, got 4.0 \(float\)"),
    (list(range(10)), 4, "2", TypeError, r"stride must be an int, got '2' \(str\)"),
    ([0, 1, 2.5, 3, 4, 5], 2, 1, TypeError, "token_ids must be a sequence of int token ids"),
    ([0, 1, -2, 3, 4, 5], 2, 1, ValueError, r"token_ids\[2\] = -2 is not a token id"),
    (torch.tensor([0.0, 1.0, 2.0]), 1, 1, TypeError, "1-D integer tensor, got a tensor of shape \\(3,\\), torch.float32"),
])
def test_dataset_rejects_bad_inputs(token_ids, context_length, stride, error, message):
    with pytest.raises(error, match=message):
        GPTDataset(token_ids, context_length, stride)


def test_dataloader_shapes_and_targets():
    ids = list(range(200))
    loader = create_dataloader(ids, batch_size=4, context_length=8, stride=8, shuffle=False)
    batches = list(loader)
    assert len(batches) == 24 // 4  # (200 - 9) // 8 + 1 = 24 windows
    x, y = batches[0]
    assert x.shape == y.shape == (4, 8) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert x[1].tolist() == list(range(8, 16))  # no shuffling: windows in order


def test_dataloader_drop_last():
    ids = list(range(100))  # (100 - 5) // 4 + 1 = 24 windows
    assert [len(x) for x, _ in create_dataloader(ids, 10, 4, 4)] == [10, 10]
    assert [len(x) for x, _ in create_dataloader(ids, 10, 4, 4, drop_last=False)] == [10, 10, 4]


def test_dataloader_is_reproducible_with_a_seed():
    ids = list(range(481))  # (481 - 9) // 8 + 1 = 60 windows: 15 full batches, nothing dropped

    def epoch(seed):
        return torch.cat([x for x, _ in create_dataloader(ids, 4, 8, 8, seed=seed)])

    first = epoch(123)
    assert torch.equal(first, epoch(123))
    assert not torch.equal(first, epoch(124))
    in_order = torch.cat([x for x, _ in create_dataloader(ids, 4, 8, 8, shuffle=False)])
    assert not torch.equal(first, in_order)
    assert sorted(first[:, 0].tolist()) == sorted(in_order[:, 0].tolist())  # same windows, another order


@pytest.mark.parametrize("kwargs, error, message", [
    ({"batch_size": 0}, ValueError, "batch_size must be >= 1, got 0"),
    ({"batch_size": 2.5}, TypeError, r"batch_size must be an int, got 2.5 \(float\)"),
    ({"shuffle": "no"}, TypeError, "shuffle must be True or False, got 'no'"),  # DataLoader would shuffle
    ({"batch_size": 8, "stride": 10}, ValueError, "batch_size 8 is larger than the 4 windows, so drop_last=True "
                                                  "would give no batch at all"),
    ({"drop_last": None}, TypeError, "drop_last must be True or False, got None"),  # refused before DataLoader
    ({"seed": 1.5}, TypeError, r"seed must be an int, got 1.5 \(float\)"),
    ({"context_length": 0}, ValueError, "context_length must be >= 1, got 0"),
    ({"stride": 0}, ValueError, "stride must be >= 1, got 0"),
    ({"token_ids": []}, ValueError, "token_ids has 0 tokens"),
])
def test_dataloader_rejects_bad_inputs(kwargs, error, message):
    args = {"token_ids": list(range(40)), "batch_size": 2, "context_length": 4, "stride": 4} | kwargs
    with pytest.raises(error, match=message):
        create_dataloader(**args)

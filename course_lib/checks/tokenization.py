"""The checks of the exercises in notebooks/01_tokenization.ipynb."""

import operator
from collections import Counter

import torch

from course_lib.tokenization import BPETokenizer, count_pairs, merge_pair, split_words, train_bpe

from .core import Checker, first_matching_bug, isolated_rng, require_function


@isolated_rng
def check_merge_pair(learner_impl) -> None:
    """Check `learner_impl(symbols, pair)`, the BPE merge step of notebook 01.

    symbols: a tuple of bytes such as (b"h", b"e", b"l", b"l", b"o"); pair: two bytes such as (b"l", b"l").
    Must return a new tuple in which every occurrence of the pair, scanning left to right, is replaced by the
    joined symbol b"ll", like course_lib.tokenization.merge_pair."""
    ck = Checker("check_merge_pair")
    require_function(ck, learner_impl, "my_merge_pair(symbols, pair)")
    a, b, c, x = b"a", b"b", b"c", b"x"
    cases = [  # (symbols, pair, {wrong answer: the bug it reveals})
        ((b"h", b"e", b"l", b"l", b"o"), (b"l", b"l"), {
            (b"h", b"e", b"ll"): "the last symbol is lost: after the loop, append the symbols that are left",
            (b"h", b"e", b"l", b"l", b"o"): "the pair is never merged: compare (symbols[i], symbols[i + 1]) "
                                             "with the pair as a tuple",
            (b"h", b"e", b"ll", b"l", b"o"): "the second symbol of the pair is kept: after a merge, skip it "
                                             "(i += 2)",
            (b"h", b"e", b"l", b"o"): "the merged symbol is just pair[0]: append pair[0] + pair[1]"}),
        ((a, b), (a, b), {(b"ba",): "the joined symbol is reversed: it must be pair[0] + pair[1]"}),
        ((a, b, c, a, b), (a, b), {
            (b"ab", c, a, b): "only the first occurrence is merged: keep scanning after a merge"}),
        ((c, a, b), (a, b), {
            (c, a, b): "a pair at the very end is missed: the loop must test position len(symbols) - 2"}),
        ((a, b, c), (x, c), {
            (a, b): "the last symbol is lost when nothing merges: after the loop, append the symbols that are left"}),
        ((a, a, a), (a, a), {
            (b"aa", b"aa"): "overlapping pairs are merged twice: a symbol used in a merge cannot start the next "
                            "pair, so skip both (i += 2)",
            (a, b"aa"): "the scan runs right to left: BPE merges the leftmost occurrence first",
            (b"aa",): "three symbols became one: after a merge, move on by exactly two symbols"}),
        ((a, a, a, a), (a, a), {}),
        ((a, x, b), (a, b), {(b"ab",): "symbols that are not neighbours were merged: only symbols[i] and "
                                       "symbols[i + 1] form a pair"}),
        ((b, a), (a, b), {(b"ab",): "the pair matched in the wrong order: (b'b', b'a') is not the pair "
                                    "(b'a', b'b')",
                          (b"ba",): "the pair matched in the wrong order: (b'b', b'a') is not the pair (b'a', b'b')"}),
        ((a,), (a, b), {}),
        ((), (a, b), {}),
    ]
    for symbols, pair, known in cases:
        expected = merge_pair(symbols, pair)
        got = ck.call(f"my_merge_pair({symbols}, {pair})", learner_impl, symbols, pair,
                      bug="one-symbol and empty words must work too: check i + 1 < len(symbols) before "
                          "reading symbols[i + 1]" if len(symbols) < 2 else None)
        if isinstance(got, list) and tuple(got) == expected:
            ck.fail(f"for symbols={symbols}, pair={pair} you returned a list",
                    "BPE uses the merged words as dictionary keys, so return a tuple: tuple(merged)")
        if got != expected:
            bug = known.get(tuple(got) if isinstance(got, (list, tuple)) else got,
                            "print the list you build step by step for this input and compare it with the "
                            "expected answer")
            ck.fail(f"for symbols={symbols}, pair={pair} you returned {got!r}, expected {expected!r}", bug)
        ck.ok()
    generator = torch.Generator().manual_seed(0)
    alphabet = (a, b, c)
    for _ in range(200):  # random words over three letters, compared with the reference
        length = int(torch.randint(0, 12, (1,), generator=generator))
        symbols = tuple(alphabet[i] for i in torch.randint(0, 3, (length,), generator=generator).tolist())
        pair = tuple(alphabet[i] for i in torch.randint(0, 3, (2,), generator=generator).tolist())
        got = ck.call(f"my_merge_pair({symbols}, {pair})", learner_impl, symbols, pair)
        if got != merge_pair(symbols, pair):
            ck.fail(f"for symbols={symbols}, pair={pair} you returned {got!r}, expected "
                    f"{merge_pair(symbols, pair)!r}", "trace this input by hand, symbol by symbol")
    ck.ok()
    ck.done("Your merge step matches course_lib's merge_pair, overlapping pairs included.")


@isolated_rng
def check_count_pairs(learner_impl) -> None:
    """Check `learner_impl(words)`, the pair counter of notebook 01.

    words: a dict mapping a word as a tuple of bytes to how often it occurs, e.g. {(b"l", b"o", b"w"): 5}.
    Must return a dict (or Counter) mapping each adjacent pair to its total count, like
    course_lib.tokenization.count_pairs."""
    ck = Checker("check_count_pairs")
    require_function(ck, learner_impl, "my_count_pairs(words)")
    words = {(b"l", b"o", b"w"): 5, (b"l", b"o", b"w", b"e", b"r"): 2, (b"a", b"a", b"a"): 3, (b"x",): 4,
             (b"w", b"e"): 1}

    def tally(count_word):
        total = Counter()
        for symbols, freq in words.items():
            for pair, n in count_word(symbols).items():
                total[pair] += n * freq
        return dict(total)

    expected = dict(count_pairs(words))
    variants = [
        ("each word counted once, whatever its frequency: add freq (the dict's value), not 1",
         lambda: dict(Counter(p for s in words for p in zip(s, s[1:])))),
        ("a pair that repeats inside a word is counted once: count every position, e.g. (b'a', b'a') twice "
         "in a, a, a", lambda: tally(lambda s: Counter(set(zip(s, s[1:]))))),
        ("overlapping pairs are skipped: count every adjacent position, overlaps included",
         lambda: tally(lambda s: Counter(zip(s[::2], s[1::2])))),
        ("the last symbol is paired with the first: pair symbols[i] with symbols[i + 1] only, without wrapping",
         lambda: tally(lambda s: Counter(zip(s, s[1:] + s[:1])))),
    ]
    got = ck.call("my_count_pairs(words)", learner_impl, dict(words))
    if not isinstance(got, dict):
        ck.fail(f"my_count_pairs returned a {type(got).__name__}", "return a dict or collections.Counter "
                "mapping each pair (a tuple of two bytes) to its count")
    got = {pair: n for pair, n in got.items() if n}  # a Counter may keep zero counts
    if got != expected:
        bug = first_matching_bug(got, variants, operator.eq)
        ck.fail(f"for {words} you returned {got}, expected {expected}",
                "count pairs (symbols[i], symbols[i + 1]) for every i and add the word's frequency" if bug is None
                else bug)
    ck.ok()
    got = ck.call("my_count_pairs({})", learner_impl, {})
    if dict(got) != {}:
        ck.fail(f"for no words at all you returned {got}", "an empty dict of words has no pairs")
    ck.ok()
    ck.done("Your pair counter matches course_lib's count_pairs.")


def encode_with(text: str, merges, rule: str | None = None) -> list[int]:
    """BPE encoding under one (correct or mistaken) rule; ids 0-255 are bytes, 256 + k the token of merges[k]."""
    ranks = {pair: k for k, pair in enumerate(merges)}
    ids = {bytes([i]): i for i in range(256)}
    for k, (left, right) in enumerate(merges):
        ids[left + right] = {"id_from_255": 255 + k, "id_from_0": k}.get(rule, 256 + k)
    chunks = [text] if rule == "no_split" else split_words(text)
    out = []
    for chunk in chunks:
        if rule == "characters":
            symbols = tuple(bytes([ord(ch)]) if ord(ch) < 256 else ch.encode("utf-8") for ch in chunk)
        else:
            symbols = tuple(bytes([b]) for b in chunk.encode("utf-8"))
        done = 0
        while len(symbols) > 1 and not (rule == "one_merge" and done):
            pairs = [p for p in zip(symbols, symbols[1:]) if p in ranks]
            if not pairs:
                break
            if rule == "leftmost":
                pair = pairs[0]
            elif rule == "latest_first":
                pair = max(pairs, key=ranks.get)
            else:
                pair = min(pairs, key=ranks.get)
            symbols = merge_pair(symbols, pair)
            done += 1
        out += [ids[s] for s in symbols]
    return out


BPE_ENCODE_BUGS = {
    "leftmost": "the first mergeable pair of the text is merged first: merge the pair learned EARLIEST (lowest rank) "
                "first, wherever it is, as GPT-2 does",
    "latest_first": "the merges are applied latest-learned first: the earliest-learned merge (lowest rank) goes first",
    "no_split": "merges cross chunk boundaries: cut the text with split_words first and encode each chunk on its own",
    "characters": "characters are encoded instead of UTF-8 bytes: start from tuple(bytes([b]) for b in "
                  "chunk.encode('utf-8')), so a character like é is two bytes",
    "id_from_255": "the merged tokens' ids are off by one: merges[k] makes token 256 + k (ids 0-255 are the bytes)",
    "id_from_0": "the merged tokens' ids restart at 0: merges[k] makes token 256 + k (ids 0-255 are the bytes)",
    "one_merge": "only one merge is applied per chunk: keep merging while some adjacent pair is a learned merge",
}


@isolated_rng
def check_bpe_encode(learner_impl) -> None:
    """Check `learner_impl(text, merges)`, BPE encoding with learned merges from notebook 01.

    merges: the list train_bpe returns, pairs of bytes in the order they were learned. Must return a list of ids:
    each split_words chunk of the text's UTF-8 bytes, merged always with the earliest-learned pair that applies,
    ids 0-255 for the bytes and 256 + k for merges[k], like course_lib.tokenization.BPETokenizer(merges).encode."""
    ck = Checker("check_bpe_encode")
    require_function(ck, learner_impl, "my_bpe_encode(text, merges)")
    corpus = "the cat sat on the mat. the rat sat on the hat; that cat is fat. " * 3
    cases = [("abcde", [(b"b", b"c"), (b"a", b"b"), (b"c", b"d"), (b"d", b"e")], "merges that compete for symbols"),
             ("abc abcd", [(b"b", b"c"), (b"a", b"b")], "merges that compete for the symbol b"),
             ("the cat", [(b"e", b" "), (b"t", b"h")], "a merge (b'e', b' ') that would cross two chunks"),
             ("café au lait", [(b"\xc3", b"\xa9"), (b"a", b"u")], "the two-byte character é"),
             ("aaaa b", [(b"a", b"a"), (b"aa", b"aa")], "merges of merges"),
             ("the fat cat sat on a mat", train_bpe(corpus, 20), "20 merges learned from a short text"),
             ("that hat? the rat!", train_bpe(corpus, 40), "40 merges learned from a short text"),
             ("", [(b"a", b"b")], "an empty text")]
    for text, merges, what in cases:
        situation = f"for the text {text!r} and {what} ({len(merges)} merges)"
        got = ck.call(f"my_bpe_encode({text!r}, merges)", learner_impl, text, list(merges))
        if isinstance(got, (list, tuple)) and got and all(isinstance(t, bytes) for t in got):
            ck.fail(f"{situation}, you returned the tokens' bytes {got}",
                    "return ids: b'x' (one byte) is id ord(b'x'), the token of merges[k] is 256 + k")
        if isinstance(got, torch.Tensor):
            got = got.tolist()
        if not isinstance(got, (list, tuple)) or not all(isinstance(t, int) for t in got):
            ck.fail(f"{situation}, you returned {got!r}", "return a list of int ids")
        expected = BPETokenizer(merges).encode(text)
        if list(got) != expected:
            bug = first_matching_bug(list(got), [(bug, lambda rule=rule: encode_with(text, merges, rule))
                                                 for rule, bug in BPE_ENCODE_BUGS.items()], operator.eq)
            ck.fail(f"{situation}, you returned {list(got)}, expected {expected}",
                    bug or "for each split_words chunk: start from its bytes, and while some adjacent pair is a "
                    "learned merge, merge (merge_pair) the one with the lowest rank; then map each symbol to its id")
        ck.ok()
    ck.done("Your encoder matches course_lib's BPETokenizer.encode: merges in the order they were learned.")

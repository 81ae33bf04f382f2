"""The checks of the exercises in notebooks/01_tokenization.ipynb."""

import operator
from collections import Counter

import torch

from course_lib.tokenization import count_pairs, merge_pair

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

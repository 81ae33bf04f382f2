"""The exercise checks of notebook 17 (the window mask, the ring cache, YaRN's ramp) name each planted bug and pass
correct code, and their references are what course_lib.long_context computes.

The learner code below is written independently of course_lib, the way a learner would write it, with a `bug`
argument: None is correct; any other value plants one named mistake. make_ring_cache(bug) builds the learner's
class, my_* functions take bug=. LONG_CONTEXT_PLANTED and LONG_CONTEXT_CORRECT are shaped like
tests/test_checks.py's PLANTED and CORRECT, which counts them too."""

import math

import pytest
import torch

from course_lib.checks import CheckFailed, check_ring_cache, check_window_mask, check_yarn_ramp
from course_lib.checks.long_context import decode_columns, ring_columns, yarn_config
from course_lib.long_context import RingKVCache, window_may_attend, yarn_ramp

# ------------------------------------------------------------------------------------------------- window mask


def my_window_may_attend(query_columns, key_columns, window, bug=None):
    if bug == "local":  # positions within this call, as if no key were cached
        query_columns, key_columns = torch.arange(len(query_columns)), torch.arange(len(key_columns))
    i, j = query_columns[:, None], key_columns[None, :]  # (queries, 1), (1, keys)
    if window is None and bug != "none_unhandled":
        allowed = j <= i
    elif bug == "not_causal":
        allowed = i - j < window
    elif bug == "off_by_one":
        allowed = (j <= i) & (i - j <= window)
    elif bug == "minus_one":
        allowed = (j <= i) & (j > i - window - 1)
    elif bug == "too_few":
        allowed = (j <= i) & (i - j < window - 1)
    else:
        allowed = (j <= i) & (i - j < window)
    if bug == "additive":  # the mask to add to the scores: 0 where allowed, -inf where hidden
        return torch.zeros(allowed.shape).masked_fill(~allowed, -math.inf)
    return allowed.float() if bug == "float" else allowed.int() if bug == "int" else allowed


# ------------------------------------------------------------------------------------------------- ring cache

def make_ring_cache(bug=None):
    """A learner's ring cache with one named bug planted (None: correct)."""

    class MyRingCache:
        def __init__(self, window):
            self.window, self.seen = window, 0
            self.keys = self.values = None

        def __len__(self):
            return min(self.seen, self.window) if bug == "len_held" else self.seen

        def append(self, keys, values):
            if bug == "grow":  # slot c instead of c % window, storage growing
                self.keys = keys if self.keys is None else torch.cat([self.keys, keys], dim=2)
                self.values = values if self.values is None else torch.cat([self.values, values], dim=2)
                self.seen += keys.shape[2]
                start = max(self.seen - keys.shape[2] - self.window, 0)
                return self.keys[:, :, start:], self.values[:, :, start:]
            if self.keys is None:
                self.keys = keys.new_zeros(keys.shape[0], keys.shape[1], self.window, keys.shape[3])
                self.values = values.new_zeros(values.shape[0], values.shape[1], self.window, values.shape[3])
            first = max(self.seen - self.window, 0)
            if bug == "slot_order":  # the held slots as they lie, the wrap not undone
                slots = torch.arange(self.seen - first)
            else:
                slots = torch.arange(first, self.seen) % self.window
            held_keys, held_values = self.keys[:, :, slots], self.values[:, :, slots]
            tokens = keys.shape[2]
            order = range(min(tokens, self.window)) if bug == "chunk_first" else range(tokens)
            for i in order:  # later columns overwrite earlier ones
                slot = self.seen + i if bug == "no_wrap" else (self.seen + i) % self.window
                self.keys[:, :, slot], self.values[:, :, slot] = keys[:, :, i], values[:, :, i]
            self.seen += tokens
            if bug == "write_first":  # the window's slots read after the new are written, oldest first
                slots = torch.arange(max(self.seen - self.window, 0), self.seen) % self.window
                return self.keys[:, :, slots], self.values[:, :, slots]
            if bug == "no_new":
                return held_keys, held_values
            if bug == "only_new":
                return keys, values
            return torch.cat([held_keys, keys], dim=2), torch.cat([held_values, values], dim=2)

    return MyRingCache


def make_float32_ring_cache(bug=None):
    """Correct but for its slots, allocated with torch.zeros (float32) while the keys are float64."""

    class Float32RingCache(make_ring_cache()):
        def append(self, keys, values):
            if self.keys is None:
                self.keys = torch.zeros(keys.shape[0], keys.shape[1], self.window, keys.shape[3])
                self.values = torch.zeros(values.shape[0], values.shape[1], self.window, values.shape[3])
            return super().append(keys, values)

    return Float32RingCache


# ------------------------------------------------------------------------------------------------- YaRN ramp

def my_yarn_ramp(cfg, theta, pairs, bug=None):
    head_dim = 2 * pairs
    context = cfg.context_length if bug == "new_context" else cfg.original_context

    def pair_of(turns):  # the (fractional) pair whose speed turns `turns` times in the original context
        wavelength = context / turns  # the wavelength (in tokens) of that pair
        if bug != "no_two_pi":
            wavelength = wavelength / (2 * math.pi)
        dims = pairs if bug == "half_index" else head_dim
        return dims * math.log(wavelength) / (2 * math.log(theta))

    fast, slow = (cfg.beta_slow, cfg.beta_fast) if bug == "swapped" else (cfg.beta_fast, cfg.beta_slow)
    low, high = pair_of(fast), pair_of(slow)
    if bug != "no_rounding":
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, (pairs if bug == "clamp_pairs" else head_dim) - 1)
    if high == low:
        high += 0.001
    entries = head_dim if bug == "head_dim_entries" else pairs
    ramp = ((torch.arange(entries, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    return 1 - ramp if bug == "reversed" else ramp


# ------------------------------------------------------------------------------------------------ the tables

# (check, learner code, planted bug, what the check's message must match)
LONG_CONTEXT_PLANTED = [
    (check_window_mask, my_window_may_attend, "off_by_one", "the window holds one key too many"),
    (check_window_mask, my_window_may_attend, "minus_one", r"one key too many: .*j > i - window - 1"),
    (check_window_mask, my_window_may_attend, "too_few", "the window holds one key too few"),
    (check_window_mask, my_window_may_attend, "not_causal", "the window ignores causality, so future keys are "
                                                            "allowed"),
    (check_window_mask, my_window_may_attend, "float", r"torch.float32 tensor.*\nLikely bug: the mask is a float or "
                                                       "int tensor instead of bool"),
    (check_window_mask, my_window_may_attend, "int", r"torch.int32 tensor.*\nLikely bug: the mask is a float or int "
                                                     "tensor instead of bool"),
    (check_window_mask, my_window_may_attend, "local", r"3 new queries after 7 cached keys.*\nLikely bug: the columns "
                                                       "are taken as local indices"),
    (check_window_mask, my_window_may_attend, "none_unhandled", r"window=None.*raised TypeError.*\nLikely bug: "
                                                                "window None means a global layer"),
    (check_window_mask, my_window_may_attend, "additive", "you return an additive mask"),
    (check_ring_cache, make_ring_cache, "no_wrap", r"raised IndexError.*\nLikely bug: .*the wrap is missing: "
                                                   r"column c goes into slot c % window"),
    (check_ring_cache, make_ring_cache, "grow", r"stores \d+ numbers.*\nLikely bug: the wrap is missing, so the "
                                                "storage grows"),
    (check_ring_cache, make_ring_cache, "slot_order", r"hold the stream columns \[4, 1, 2, 3, 5\], expected "
                                                      r"\[1, 2, 3, 4, 5\].*\nLikely bug: the wrap is not undone "
                                                      "when reading"),
    (check_ring_cache, make_ring_cache, "len_held", r"len\(\) is 4, expected 5.*\nLikely bug: len\(\) counts the "
                                                    "held slots instead of the positions seen"),
    (check_ring_cache, make_ring_cache, "chunk_first", r"chunks longer than the window.*\nLikely bug: a chunk "
                                                       "longer than the window writes its first positions"),
    (check_ring_cache, make_ring_cache, "no_new", "append returns only the held positions without the new ones"),
    (check_ring_cache, make_ring_cache, "write_first", r"the keys returned hold the stream columns \[1, 2, 3, 4\], "
                                                       r"expected \[0, 1, 2, 3, 4\].*\nLikely bug: the new positions "
                                                       "are written before the held ones are read"),
    (check_ring_cache, make_ring_cache, "only_new", "append returns only the new positions without the held ones"),
    (check_ring_cache, make_float32_ring_cache, "float32", r"the right columns .*\nLikely bug: the slots are "
                                                           "allocated in another dtype"),
    (check_yarn_ramp, my_yarn_ramp, "reversed", r"the ramp is reversed \(1 - ramp\)"),
    (check_yarn_ramp, my_yarn_ramp, "no_rounding", "the bounds are not rounded"),
    (check_yarn_ramp, my_yarn_ramp, "no_two_pi", "the turns are computed without 2 pi"),
    (check_yarn_ramp, my_yarn_ramp, "swapped", "the bounds are swapped between beta_fast and beta_slow"),
    (check_yarn_ramp, my_yarn_ramp, "head_dim_entries", r"your ramp has 64 entries, expected 32\nLikely bug: the "
                                                        "ramp is over head_dim entries instead of head_dim / 2"),
    (check_yarn_ramp, my_yarn_ramp, "half_index", "the pair index is computed over head_dim / 2 where head_dim "
                                                  "belongs"),
    (check_yarn_ramp, my_yarn_ramp, "clamp_pairs", r"high clamped at head_dim - 1.*\nLikely bug: the upper bound is "
                                                   r"clamped to pairs - 1"),
    (check_yarn_ramp, my_yarn_ramp, "new_context", r"the ramp uses cfg.context_length \(the new, longer context\)"),
]

LONG_CONTEXT_CORRECT = [  # (check, correct code, what the one line must praise)
    (check_window_mask, window_may_attend, "window - 1 keys before it"),
    (check_window_mask, my_window_may_attend, "window - 1 keys before it"),
    (check_ring_cache, RingKVCache, "column c in slot c % window"),
    (check_ring_cache, make_ring_cache, "column c in slot c % window"),
    (check_yarn_ramp, yarn_ramp, "linear in the pair index"),
    (check_yarn_ramp, my_yarn_ramp, "linear in the pair index"),
]


def learner(code, bug=None):
    if code.__name__.startswith("make_"):
        return code(bug)
    return code if bug is None else lambda *args, **kwargs: code(*args, bug=bug, **kwargs)


@pytest.mark.parametrize(("check", "code", "bug", "match"), LONG_CONTEXT_PLANTED,
                         ids=[f"{row[0].__name__}-{row[2]}" for row in LONG_CONTEXT_PLANTED])
def test_each_planted_bug_is_caught_and_named(check, code, bug, match):
    with pytest.raises(CheckFailed, match=match) as info:
        check(learner(code, bug))
    assert str(info.value).startswith(f"{check.__name__}: ") and "\nLikely bug: " in str(info.value)


@pytest.mark.parametrize(("check", "code", "praise"), LONG_CONTEXT_CORRECT,
                         ids=[f"{row[0].__name__}-{row[1].__name__}" for row in LONG_CONTEXT_CORRECT])
def test_each_check_passes_correct_code(check, code, praise, capsys):
    check(learner(code))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{check.__name__}: all ") and "checks passed" in lines[0] and praise in lines[0]


def test_the_checks_reject_what_is_not_the_learner_class_or_function():
    with pytest.raises(TypeError, match=r"expects your class, not an instance of it: call check_ring_cache"
                                        r"\(RingKVCache\)"):
        check_ring_cache(RingKVCache(4))
    with pytest.raises(TypeError, match="expects your class, e.g. check_ring_cache"):
        check_ring_cache(my_window_may_attend)
    with pytest.raises(TypeError, match="expects a function such as my_window_may_attend.*got the class"):
        check_window_mask(RingKVCache)
    with pytest.raises(TypeError, match="expects a function such as my_yarn_ramp"):
        check_yarn_ramp(3)


def test_the_column_simulation_is_what_ring_kv_cache_returns():
    """ring_columns (the checks' model of a ring cache, by stream column) gives the columns RingKVCache returns, over
    single steps, chunks and chunks longer than the window: the named variants are measured against the truth."""
    for window, appends in ((4, [1] * 9), (3, [7, 1, 1, 5, 1, 2, 1]), (5, [2, 5, 1, 4, 6, 1])):
        stream = torch.randn(1, 2, sum(appends), 3, dtype=torch.float64)
        cache, seen = RingKVCache(window), 0
        for tokens, expected in zip(appends, ring_columns(appends, window), strict=True):
            keys, _ = cache.append(stream[:, :, seen:seen + tokens], stream[:, :, seen:seen + tokens])
            assert decode_columns(keys, stream) == expected
            seen += tokens


def test_the_ramp_reference_is_yarns_from_its_formula():
    """yarn_ramp, the check's reference, on the numbers worked by hand: theta 10000, 8 pairs, original context 128
    puts the fast bound at index 8 ln(128 / (64 pi)) / ln(10000) = -0.39, floored and clamped to 0, and the slow one
    at 8 ln(128 / (2 pi)) / ln(10000) = 2.62, ceiled to 3: the ramp is i / 3."""
    expected = (torch.arange(8) / 3).clamp(0, 1)
    assert torch.allclose(yarn_ramp(yarn_config(128), 10000.0, 8), expected)
    assert torch.allclose(my_yarn_ramp(yarn_config(128), 10000.0, 8), expected)

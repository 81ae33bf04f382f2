"""The checks of the exercises in notebooks/17_long_context.ipynb."""

import functools
import inspect
import math

import torch
from torch import Tensor

from course_lib.long_context import LongConfig, RingKVCache, window_may_attend, yarn_ramp

from .core import Checker, check_unchanged, compare, first_matching_bug, isolated_rng, require_function

# ------------------------------------------------------------------------------------------------- window mask

WINDOW_SIGNATURE = "my_window_may_attend(query_columns, key_columns, window)"
WINDOW_FALLBACK = ("take distance = query_columns[:, None] - key_columns[None, :] (queries, keys); a key is allowed "
                   "when distance >= 0 (causal) and, unless window is None, distance < window")


def window_variant(query_columns: Tensor, key_columns: Tensor, window: int | None, causal: str = "yes",
                   reach: int = 0, columns: str = "stream", none: str = "causal") -> Tensor:
    """The window mask (queries, keys) with one deliberate choice: causality kept or not (yes, no: any key within
    the window, both: |i - j| < window), the window reaching `reach` keys further, the columns as given or as local
    indices 0, 1, ..., and what window None means (causal, everything, nothing)."""
    if columns == "local":
        query_columns, key_columns = torch.arange(len(query_columns)), torch.arange(len(key_columns))
    distance = query_columns[:, None] - key_columns[None, :]
    if window is None:
        return {"causal": distance >= 0, "all": torch.ones_like(distance, dtype=torch.bool),
                "none": torch.zeros_like(distance, dtype=torch.bool)}[none]
    near = {"yes": (distance >= 0) & (distance < window + reach), "no": distance < window + reach,
            "both": distance.abs() < window + reach}[causal]
    return near


def window_variants(query_columns: Tensor, key_columns: Tensor, window: int | None):
    """The known mistakes of the window mask, as (bug, make_mask) pairs."""
    v = functools.partial(window_variant, query_columns, key_columns, window)
    reference = window_may_attend(query_columns, key_columns, window)
    return [
        ("the window holds one key too many: i - j <= window (or j > i - window - 1) lets the query see itself and "
         "window keys before it; the window is the query itself and the window - 1 keys before, i - j < window",
         lambda: v(reach=1)),
        ("the window holds one key too few: i - j < window - 1 (or i - j <= window - 2) keeps window - 1 keys "
         "in all; the window is the query itself and the window - 1 keys before, i - j < window",
         lambda: v(reach=-1)),
        ("the window ignores causality, so future keys are allowed: a key within the window but after the query "
         "(j > i) must stay hidden; combine the window with the causal rule, (i - j >= 0) & (i - j < window)",
         lambda: v(causal="no")),
        ("the window ignores causality, so future keys are allowed: |i - j| < window reaches forward too; keep "
         "i - j >= 0 as well as i - j < window", lambda: v(causal="both")),
        ("the columns are taken as local indices 0, 1, ... of the queries and of the keys: the query columns come "
         "after the cached keys (here they start at column "
         f"{query_columns[0].item() if len(query_columns) else 0}, the keys at "
         f"{key_columns[0].item() if len(key_columns) else 0}); subtract the columns themselves, "
         "query_columns[:, None] - key_columns[None, :]", lambda: v(columns="local")),
        ("the columns are taken as local indices and the window ignores causality: subtract the columns themselves, "
         "query_columns[:, None] - key_columns[None, :], and keep i - j >= 0", lambda: v(columns="local", causal="no")),
        ("the window is ignored: a local layer's query sees only itself and the window - 1 keys before it; add "
         "& (distance < window)", lambda: window_variant(query_columns, key_columns, None)),
        ("window None means a global layer, which is still causal: return distance >= 0 (every earlier key and the "
         "query itself), not a mask of all True", lambda: v(none="all")),
        ("window None means a global layer: every earlier key and the query itself, distance >= 0; yours hides "
         "everything", lambda: v(none="none")),
        ("the mask is inverted: True must mark the keys the query MAY attend (the lesson hides the others with "
         "masked_fill(~allowed, -inf)); return the allowed keys, not the hidden ones", lambda: ~reference),
        ("the mask is transposed: rows are the queries and columns the keys, shape (queries, keys); subtract "
         "query_columns[:, None] - key_columns[None, :]", lambda: reference.T),
    ]


def describe_mask_difference(got: Tensor, expected: Tensor, query_columns: Tensor, key_columns: Tensor) -> str:
    """One sentence naming the first (query column, key column) where got and expected disagree."""
    if tuple(got.shape) != tuple(expected.shape):
        return (f"your mask has shape {tuple(got.shape)} but should have shape {tuple(expected.shape)} (queries, "
                "keys)")
    wrong = (got != expected).nonzero()
    row, col = (i.item() for i in wrong[0])
    yours = "allows" if bool(got[row, col]) else "hides"
    return (f"yours {yours} key column {key_columns[col].item()} for query column {query_columns[row].item()} "
            f"where the reference {'hides' if yours == 'allows' else 'allows'} it ({len(wrong)} entries differ)")


@isolated_rng
def check_window_mask(learner_impl) -> None:
    """Check `learner_impl(query_columns, key_columns, window)`, the sliding-window mask of notebook 17.

    query_columns: (queries,), key_columns: (keys,) integer stream columns (the queries may come after cached
    keys); window: int or None. Returns a bool tensor (queries, keys), True where query column i may attend key
    column j: j <= i and, with a window, i - j < window (the query itself and the window - 1 keys before it);
    window None: causal only. course_lib.long_context.window_may_attend is the reference."""
    ck = Checker("check_window_mask")
    require_function(ck, learner_impl, WINDOW_SIGNATURE)
    cases = [(torch.arange(6), torch.arange(6), 3, "a prompt of 6 tokens from column 0"),
             (torch.arange(10, 13), torch.arange(5, 13), 4, "3 new queries after 7 cached keys"),
             (torch.tensor([20]), torch.arange(16, 21), 4, "one decoding step reading a ring cache of window 4"),
             (torch.arange(4, 9), torch.arange(9), 1, "window 1 (each query sees itself only)"),
             (torch.arange(3, 6), torch.arange(6), 50, "a window longer than the stream"),
             (torch.arange(10, 13), torch.arange(13), None, "a global layer (window None)"),
             (torch.arange(5), torch.arange(5), None, "a global layer on a prompt from column 0")]
    for query_columns, key_columns, window, kind in cases:
        situation = (f"for {kind}: query_columns={query_columns.tolist()}, key_columns={key_columns.tolist()}, "
                     f"window={window}")
        inputs = [query_columns.clone(), key_columns.clone()]
        none_bug = ("window None means a global layer: no window, causal only; handle it before comparing with the "
                    "window, e.g. if window is None: return distance >= 0") if window is None else None
        got = ck.call(f"{WINDOW_SIGNATURE.split('(')[0]} {situation}", learner_impl, *inputs, window,
                      bug=none_bug or f"the function must take the lesson's arguments, {WINDOW_SIGNATURE}, two 1-D "
                      "integer tensors of stream columns and an int (or None)")
        for name, before, after in zip(("query_columns", "key_columns"), (query_columns, key_columns), inputs):
            check_unchanged(ck, before, after, f"function ({name})")
        expected = window_may_attend(query_columns, key_columns, window)
        if isinstance(got, tuple):
            ck.fail(f"{situation}, your code returned a tuple of {len(got)} items instead of one mask",
                    "return only the bool mask (queries, keys)")
        if not isinstance(got, Tensor):
            ck.fail(f"{situation}, your code returned a {type(got).__name__} instead of a torch.Tensor",
                    "return the bool tensor itself (no .tolist() or numpy conversion)")
        if got.dtype != torch.bool:
            additive = (got.is_floating_point() and tuple(got.shape) == tuple(expected.shape)
                        and bool(((got == 0) | (got == -math.inf)).all()) and torch.equal(got == 0, expected))
            ck.fail(f"{situation}, your mask is a {got.dtype} tensor, not torch.bool",
                    "you return an additive mask (0 where allowed, -inf where hidden): the lesson's mask is bool, "
                    "True where the query may attend, and the attention hides the rest with "
                    "masked_fill(~allowed, -inf)" if additive else
                    "the mask is a float or int tensor instead of bool: scaled_dot_product_attention(attn_mask=...) "
                    "adds a float mask to the scores instead of hiding keys, and ~ flips an int's bits; build it "
                    "from comparisons (>=, <) joined with & (not *), without .float() or .int()")
        if tuple(got.shape) == tuple(expected.shape) and torch.equal(got, expected):
            ck.ok()
            continue
        bug = first_matching_bug(got, window_variants(query_columns, key_columns, window),
                                 lambda mine, candidate: tuple(mine.shape) == tuple(candidate.shape)
                                 and torch.equal(mine, candidate))
        ck.fail(f"{situation}, {describe_mask_difference(got, expected, query_columns, key_columns)}.",
                bug or WINDOW_FALLBACK)
    ck.done("Your mask matches course_lib's window_may_attend: causal, and within the window of the query itself and "
            "the window - 1 keys before it.")


# ------------------------------------------------------------------------------------------------- ring cache

RING_SIGNATURE = "MyRingCache(window)"
RING_FALLBACK = ("keep window slots, write stream column c into slot c % window, and let append return the held "
                 "columns max(seen - window, 0), ..., seen - 1 (read from their slots, oldest first) followed by the "
                 "new keys and values, torch.cat([held, keys], dim=2)")


def ring_columns(appends: list[int], window: int, mode: str = "ring") -> list[list[int]]:
    """The stream columns each append returns, for token counts `appends`, by a ring cache of `window` slots with
    one deliberate choice (mode): ring (the lesson's), slot_order (the held ones read in slot order, the wrap not
    undone), no_new (the held ones only), only_new, write_first (the new written before the held are read: the
    last window columns come back), chunk_first / chunk_first_data (a chunk longer than the window keeps its first
    window positions: in their own slots, or in the slots of the last window columns)."""
    slots, seen, out = [-1] * window, 0, []
    for tokens in appends:
        new = list(range(seen, seen + tokens))
        held = [slots[c % window] for c in range(max(seen - window, 0), seen)]
        if mode == "slot_order":
            held = [c for c in slots if c >= 0][:min(seen, window)]
        if mode == "write_first":
            returned = None
        else:
            returned = {"no_new": held, "only_new": new}.get(mode, held + new)
        kept = min(tokens, window)
        if mode == "chunk_first":
            written = [(c, c) for c in new[:kept]]
        elif mode == "chunk_first_data":
            written = [(slot_column, c) for slot_column, c in zip(new[tokens - kept:], new[:kept])]
        else:
            written = [(c, c) for c in new[tokens - kept:]]
        for slot_column, c in written:
            slots[slot_column % window] = c
        seen += tokens
        if returned is None:
            returned = [slots[c % window] for c in range(max(seen - window, 0), seen)]
        out.append(returned)
    return out


def decode_columns(got: Tensor, stream: Tensor) -> list:
    """Which stream column each position (dim 2) of got holds: its index in stream (batch, heads, columns,
    head_dim), 'empty' for a row of zeros (a slot never written), '?' for anything else."""
    got, stream = got.detach().double(), stream.double()
    found = []
    for p in range(got.shape[2]):
        row = got[:, :, p]
        same = [c for c in range(stream.shape[2]) if torch.allclose(row, stream[:, :, c], atol=1e-6, rtol=1e-5)]
        found.append(same[0] if same else "empty" if not bool(row.any()) else "?")
    return found


def stored_numbers(cache) -> int:
    """How many numbers the tensors among cache's attributes hold (one level of lists, tuples and dicts too)."""
    total = 0
    for value in vars(cache).values():
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        total += sum(item.numel() for item in items if isinstance(item, Tensor))
    return total


def require_plain_class(ck: Checker, impl) -> None:
    """Raise TypeError unless impl is a class (not an instance of one, not a function)."""
    if inspect.isclass(impl):
        return
    if hasattr(impl, "append") and not inspect.isfunction(impl) and not isinstance(impl, (list, dict, set)):
        raise TypeError(f"{ck.name} expects your class, not an instance of it: call {ck.name}"
                        f"({type(impl).__name__}) instead of {ck.name}({type(impl).__name__}(...)); the check builds "
                        f"its own caches, e.g. {RING_SIGNATURE}")
    raise TypeError(f"{ck.name} expects your class, e.g. {ck.name}(MyRingCache), got {type(impl).__name__} {impl!r}")


def check_one_append(ck: Checker, got, keys: Tensor, values: Tensor, expected: tuple, stream: tuple,
                     columns: list[int], variants: dict, situation: str) -> None:
    """The learner's append result equals RingKVCache's (keys and values); otherwise name the columns returned and
    the known mistake (variants: pairs (bug, the columns it returns))."""
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, Tensor) for t in got)):
        ck.fail(f"{situation}, append returned {type(got).__name__}"
                f"{f' of {len(got)} items' if isinstance(got, (tuple, list)) else ''} instead of (keys, values)",
                "append must return two tensors, the keys and the values: return all_keys, all_values")
    for name, mine, theirs, new, whole in zip(("keys", "values"), got, expected, (keys, values), stream):
        if mine.dim() != 4 or tuple(mine.shape[:2]) != tuple(new.shape[:2]) or mine.shape[3] != new.shape[3]:
            ck.fail(f"{situation}, the {name} returned have shape {tuple(mine.shape)}, expected "
                    f"{tuple(theirs.shape)}", "return (batch, kv_heads, positions, head_dim), the positions joined "
                    "along dim=2: torch.cat([held, new], dim=2)")
        if tuple(mine.shape) == tuple(theirs.shape) and torch.equal(mine, theirs):
            continue
        found = decode_columns(mine, whole)
        if found == columns:
            ck.fail(f"{situation}, the {name} returned are the right columns {columns} but their numbers differ "
                    f"(largest difference {(mine.double() - theirs.double()).abs().max().item():.3g})",
                    "the slots are allocated in another dtype (torch.zeros(...) is float32): allocate them like the "
                    "keys, keys.new_zeros(batch, kv_heads, window, head_dim)")
        bug = next((bug for bug, cols in variants if cols == found), None)
        if bug is None and found[:len(columns) - keys.shape[2]] != columns[:len(columns) - keys.shape[2]] \
                and found[-keys.shape[2]:] == columns[-keys.shape[2]:]:
            bug = ("the held columns come back wrong while the new ones are right: the held ones are the stream "
                   "columns max(seen - window, 0), ..., seen - 1, column c in slot c % window, read oldest first")
        ck.fail(f"{situation}, the {name} returned hold the stream columns {found}, expected {columns} (the held "
                "ones, oldest first, then the new ones)", bug or RING_FALLBACK)
    ck.ok()


@isolated_rng
def check_ring_cache(learner_impl) -> None:
    """Check `learner_impl`, a class MyRingCache(window) of notebook 17, against course_lib's RingKVCache.

    cache.append(keys, values), keys and values (batch, kv_heads, tokens, head_dim), returns the (keys, values)
    of the held positions, oldest first, followed by the new ones; len(cache) counts the positions appended so
    far; the cache stores at most `window` positions (column c in slot c % window), and a chunk longer than the
    window keeps its last window positions. Runs streams of one token at a time and of chunks, with the wrap."""
    ck = Checker("check_ring_cache")
    require_plain_class(ck, learner_impl)
    batch, heads, head_dim = 2, 2, 3
    streams = [(4, [1] * 11, "one token at a time"),
               (4, [3, 1, 1, 1, 1, 1, 1, 3, 1, 2, 1], "a prompt of 3, single steps and chunks"),
               (3, [7, 1, 1, 5, 1, 1, 2, 1], "chunks longer than the window"),
               (5, [5, 1, 4, 5, 1], "chunks of the window's length")]
    with torch.no_grad():
        for window, appends, kind in streams:
            mine = ck.call(f"{RING_SIGNATURE.replace('window', str(window))}", learner_impl, window,
                           bug=f"the constructor must take the window: {RING_SIGNATURE}")
            reference = RingKVCache(window)
            length = ck.call(f"len() of a new MyRingCache({window})", len, mine,
                             bug="define __len__(self), returning the number of positions appended so far "
                             "(self.seen, 0 before any append)")
            if length != 0:
                ck.fail(f"a new MyRingCache({window}) has len() {length}", "len() counts the positions appended: "
                        "0 before any append (start a counter self.seen = 0)")
            total = sum(appends)
            stream = (torch.randn(batch, heads, total, head_dim, dtype=torch.float64),
                      torch.randn(batch, heads, total, head_dim, dtype=torch.float64))
            per_position = batch * heads * head_dim
            columns = ring_columns(appends, window)
            variants = {mode: ring_columns(appends, window, mode) for mode in
                        ("slot_order", "no_new", "only_new", "write_first", "chunk_first", "chunk_first_data")}
            bugs = {
                "slot_order": "the wrap is not undone when reading: you return the held slots in slot order, but "
                              "once the stream passes the window the oldest column sits at slot seen % window; read "
                              "the slots of the columns max(seen - window, 0), ..., seen - 1, i.e. "
                              "torch.arange(max(seen - window, 0), seen) % window, oldest first",
                "no_new": "append returns only the held positions without the new ones: the new queries attend to "
                          "themselves too; return torch.cat([held, keys], dim=2) (and the same for the values)",
                "only_new": "append returns only the new positions without the held ones: return "
                            "torch.cat([held, keys], dim=2), the held ones oldest first",
                "write_first": "the new positions are written before the held ones are read, so they overwrite "
                               "the oldest ones that the first new queries still see: read the held ones "
                               "(torch.cat([held, keys], dim=2)) first, then write",
                "chunk_first": "a chunk longer than the window writes its first positions instead of its last: "
                               "only the last window positions of the stream are read again; write keys[:, :, "
                               "-window:] into the slots of their columns (or write them all in order, so later "
                               "columns overwrite earlier ones)",
            }
            bugs["chunk_first_data"] = bugs["chunk_first"]
            named = [(bugs[mode], cols) for mode, cols in variants.items()]
            seen = 0
            for step, tokens in enumerate(appends):
                keys = stream[0][:, :, seen:seen + tokens].clone()
                values = stream[1][:, :, seen:seen + tokens].clone()
                history = "nothing" if step == 0 else f"{', '.join(map(str, appends[:step]))} tokens"
                situation = (f"in MyRingCache({window}) ({kind}), after appending {history}, then {tokens} "
                             f"token{'s' if tokens > 1 else ''} ("
                             + (f"column {seen})" if tokens == 1 else f"columns {seen} to {seen + tokens - 1})"))
                got = ck.call(f"append {situation}", mine.append, keys, values,
                              bug="append(keys, values) gets (batch, kv_heads, tokens, head_dim) tensors; an index "
                              "error here usually means the wrap is missing: column c goes into slot c % window, "
                              "not slot c (the cache has only window slots)")
                expected = reference.append(keys, values)
                check_one_append(ck, got, keys, values, expected, stream, columns[step],
                                 [(bug, cols[step]) for bug, cols in named], situation)
                seen += tokens
                length = ck.call(f"len() {situation}", len, mine, bug="define __len__(self): the positions appended")
                if length != len(reference):
                    slots = length in (min(seen, window), window)
                    ck.fail(f"{situation}, len() is {length}, expected {len(reference)}",
                            "len() counts the held slots instead of the positions seen: it must count every position "
                            "appended so far (the next position's column, which the rotary angles and the mask "
                            "need), not what the cache holds; keep a counter, self.seen += tokens" if slots else
                            "len() must count every position appended so far: self.seen += keys.shape[2] in append")
                ck.ok()
                held = stored_numbers(mine)
                if held > 2 * window * per_position + 4 * window:
                    keys_shape = getattr(mine, "keys", None)
                    shape = (f" (.keys has shape {tuple(keys_shape.shape)})" if isinstance(keys_shape, Tensor) else "")
                    ck.fail(f"{situation}, your cache stores {held} numbers{shape}, but {window} positions of keys "
                            f"and values are {2 * window * per_position}",
                            "the wrap is missing, so the storage grows with the stream: keep window slots, allocated "
                            "once, and write column c into slot c % window (overwriting the oldest)")
                ck.ok()
    ck.done("Your ring cache matches course_lib's RingKVCache: window slots, column c in slot c % window, the held "
            "positions returned oldest first, then the new ones.")


# ------------------------------------------------------------------------------------------------- YaRN ramp

YARN_SIGNATURE = "my_yarn_ramp(cfg, theta, pairs)"
YARN_FALLBACK = ("the pair index that turns `turns` times in the original context is pairs * ln(original_context / "
                 "(2 pi turns)) / ln(theta); low = max(floor(index at beta_fast), 0), high = min(ceil(index at "
                 "beta_slow), head_dim - 1) with head_dim = 2 * pairs; the ramp is ((arange(pairs) - low) / "
                 "max(high - low, 1e-3)).clamp(0, 1)")


def yarn_variant(cfg, theta: float, pairs: int, rounding: str = "floor_ceil", two_pi: bool = True,
                 index_pairs: float | None = None, swap: bool = False, context: str = "original",
                 top: str = "head_dim", flip: bool = False, span: str = "max", entries: int | None = None) -> Tensor:
    """YaRN's ramp with one deliberate choice: the bounds rounded or not, the turns with or without 2 pi, the pairs
    in the index formula, the betas swapped, which context length, the upper clamp, the ramp flipped, how a zero
    span is guarded, how many entries."""
    length = cfg.original_context if context == "original" else cfg.context_length
    n = pairs if index_pairs is None else index_pairs

    def index(turns):
        return n * math.log(length / ((2 * math.pi if two_pi else 1.0) * turns)) / math.log(theta)

    fast, slow = (cfg.beta_slow, cfg.beta_fast) if swap else (cfg.beta_fast, cfg.beta_slow)
    low, high = index(fast), index(slow)
    if rounding == "floor_ceil":
        low, high = math.floor(low), math.ceil(high)
    low = max(low, 0)
    high = {"head_dim": min(high, 2 * pairs - 1), "pairs": min(high, pairs - 1), "none": high}[top]
    gap = {"max": max(high - low, 1e-3), "plain": high - low,
           "equal": high - low + 1e-3 if high == low else high - low}[span]
    ramp = ((torch.arange(entries or pairs, dtype=torch.float64) - low) / gap).clamp(0, 1)
    return 1 - ramp if flip else ramp


def yarn_variants(cfg, theta: float, pairs: int):
    """The known mistakes of YaRN's ramp, as (bug, make_ramp) pairs."""
    y = functools.partial(yarn_variant, cfg, theta, pairs)
    swapped = ("the bounds are swapped between beta_fast and beta_slow: the ramp starts (0) at the pair that turns "
               "beta_fast times (fast pairs have small indices) and ends (1) at the one that turns beta_slow times; "
               "low = floor(index(beta_fast)), high = ceil(index(beta_slow))")
    return [
        ("the ramp is reversed (1 - ramp): it is 0 for the fast pairs, kept as they are, and 1 for the slow pairs, "
         "stretched fully; return ((arange(pairs) - low) / (high - low)).clamp(0, 1)", lambda: y(flip=True)),
        ("the bounds are not rounded: YaRN takes low = floor(...) of the fast pair's index and high = ceil(...) of "
         "the slow one's (math.floor, math.ceil) before the ramp", lambda: y(rounding="none")),
        ("the turns are computed without 2 pi (a wavelength confused with a number of turns): a pair of speed "
         "theta ** (-i / pairs) turns original_context * speed / (2 pi) times, so the index of `turns` is pairs * "
         "ln(original_context / (2 pi turns)) / ln(theta)", lambda: y(two_pi=False)),
        ("the turns are computed without 2 pi and the bounds are not rounded: index(turns) = pairs * "
         "ln(original_context / (2 pi turns)) / ln(theta), then floor and ceil",
         lambda: y(two_pi=False, rounding="none")),
        (swapped, lambda: y(swap=True)),
        (swapped, lambda: y(swap=True, span="plain")),
        (swapped, lambda: y(swap=True, span="equal")),
        ("the pair index is computed over head_dim / 2 where head_dim belongs: speeds go as theta ** (-2i / "
         "head_dim) = theta ** (-i / pairs), so the index of `turns` is pairs * ln(...) / ln(theta), not pairs / 2 "
         "* ln(...) / ln(theta)", lambda: y(index_pairs=pairs / 2)),
        ("the pair index is computed over head_dim entries where there are head_dim / 2 pairs: the index of "
         "`turns` is pairs * ln(...) / ln(theta), not 2 * pairs * ln(...) / ln(theta)",
         lambda: y(index_pairs=2 * pairs)),
        ("the ramp uses cfg.context_length (the new, longer context) instead of cfg.original_context, the one the "
         "model was pretrained at: the turns are counted in the original context", lambda: y(context="new")),
        ("the upper bound is clamped to pairs - 1: YaRN clamps it to head_dim - 1 = 2 * pairs - 1 (as Hugging "
         "Face's find_correction_range does), min(ceil(...), 2 * pairs - 1)", lambda: y(top="pairs")),
        ("the upper bound is not clamped: YaRN takes min(ceil(index(beta_slow)), head_dim - 1) with head_dim = "
         "2 * pairs", lambda: y(top="none")),
        *[(f"the theta argument is ignored: you use {t:g} where the call passes theta={theta:g}; the pair index "
           "divides by ln(theta)", lambda t=t: yarn_variant(cfg, t, pairs)) for t in (10000.0, 500000.0, 1e6)
          if t != theta],
    ]


def yarn_config(original_context: int, beta_fast: float = 32.0, beta_slow: float = 1.0, factor: float = 4.0):
    """A small YaRN LongConfig: only the fields the ramp reads matter."""
    return LongConfig(vocab_size=16, context_length=int(original_context * factor), emb_dim=8, n_heads=2, n_layers=1,
                      positions="rotary", rope_type="yarn", rope_factor=factor, original_context=original_context,
                      beta_fast=beta_fast, beta_slow=beta_slow)


@isolated_rng
def check_yarn_ramp(learner_impl) -> None:
    """Check `learner_impl(cfg, theta, pairs)`, YaRN's ramp of notebook 17.

    Returns a float tensor (pairs,): 0 for the pairs that turn more than cfg.beta_fast times in
    cfg.original_context (kept), 1 for those that turn fewer than cfg.beta_slow times (stretched fully), linear in
    the pair index between low = max(floor(index(beta_fast)), 0) and high = min(ceil(index(beta_slow)),
    2 * pairs - 1), where index(turns) = pairs * ln(original_context / (2 pi turns)) / ln(theta).
    course_lib.long_context.yarn_ramp is the reference."""
    ck = Checker("check_yarn_ramp")
    require_function(ck, learner_impl, YARN_SIGNATURE)
    cases = [(yarn_config(4096), 10000.0, 32, "original_context 4096, betas 32 and 1 (Qwen's numbers)"),
             (yarn_config(32768), 1e6, 64, "original_context 32768, theta 1e6"),
             (yarn_config(2048, beta_fast=8.0, beta_slow=2.0), 500.0, 12, "betas 8 and 2, theta 500"),
             (yarn_config(128), 10000.0, 8, "original_context 128, low clamped at 0"),
             (yarn_config(100000, beta_fast=1000.0), 100.0, 4, "high clamped at head_dim - 1")]
    for cfg, theta, pairs, kind in cases:
        situation = (f"for {kind} (original_context={cfg.original_context}, beta_fast={cfg.beta_fast:g}, "
                     f"beta_slow={cfg.beta_slow:g}, theta={theta:g}, pairs={pairs})")
        got = ck.call(f"{YARN_SIGNATURE.split('(')[0]} {situation}", learner_impl, cfg, theta, pairs,
                      bug=f"the function must take the lesson's arguments, {YARN_SIGNATURE}, and read "
                      "cfg.original_context, cfg.beta_fast and cfg.beta_slow")
        if isinstance(got, Tensor) and got.dim() == 1 and got.shape[0] == 2 * pairs:
            ck.fail(f"{situation}, your ramp has {2 * pairs} entries, expected {pairs}",
                    "the ramp is over head_dim entries instead of head_dim / 2: there is one entry per pair of "
                    "dimensions (pairs = head_dim / 2), torch.arange(pairs)")
        if isinstance(got, Tensor) and not got.is_floating_point():
            ck.fail(f"{situation}, your ramp is a {got.dtype} tensor", "the ramp holds fractions between 0 and 1: "
                    "divide as floats, (torch.arange(pairs).float() - low) / (high - low)")
        compare(ck, got, yarn_ramp(cfg, theta, pairs), yarn_variants(cfg, theta, pairs), situation, YARN_FALLBACK,
                atol=1e-6, rtol=1e-5)
    ck.done("Your ramp matches course_lib's yarn_ramp: 0 for the pairs kept, 1 for those stretched fully, linear in "
            "the pair index between the rounded bounds.")

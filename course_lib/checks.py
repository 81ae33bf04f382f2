import functools
import inspect
import math
from collections import Counter

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from course_lib.attention import CausalAttention, MultiHeadAttention
from course_lib.block import TransformerBlock
from course_lib.config import GPTConfig
from course_lib.embeddings import GPTEmbedding, SinusoidalPositionalEmbedding
from course_lib.feedforward import GELU, FeedForward
from course_lib.generation import scale_logits, top_k_filter, top_p_filter
from course_lib.model import GPTModel
from course_lib.normalization import LayerNorm
from course_lib.tokenization import count_pairs, merge_pair


class CheckFailed(AssertionError):
    """A learner's implementation differs from the course's reference; the message says how, and names the
    mistake that most likely causes it."""


class Checker:
    """Counts the checks one check_* function passes and words its failure messages."""

    def __init__(self, name: str):
        self.name = name
        self.passed = 0

    def fail(self, what: str, bug: str | None = None):
        message = f"{self.name}: {what}"
        if bug:
            message += f"\nLikely bug: {bug}"
        raise CheckFailed(message)

    def ok(self) -> None:
        self.passed += 1

    def done(self, praise: str) -> None:
        print(f"{self.name}: all {self.passed} checks passed. {praise}")

    def call(self, what: str, fn, *args, bug: str | None = None, **kwargs):
        """fn(*args, **kwargs); an exception in the learner's code becomes a CheckFailed that names the call."""
        try:
            return fn(*args, **kwargs)
        except CheckFailed:
            raise
        except Exception as error:  # the learner's code may raise anything
            self.fail(f"{what} raised {type(error).__name__}: {error}",
                      bug or "read the error above; the call and its arguments are the ones the lesson uses")


def isolated_rng(check):
    """Run a check with its own seeded random numbers and leave the caller's random state as it was."""

    @functools.wraps(check)
    def wrapper(*args, **kwargs):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1234)
            return check(*args, **kwargs)

    return wrapper


def require_class(ck: Checker, impl, example: str):
    """Raise TypeError unless impl is an nn.Module subclass (the class itself, not an instance)."""
    if inspect.isclass(impl):
        if not issubclass(impl, nn.Module):
            raise TypeError(f"{ck.name} expects a subclass of torch.nn.Module, but {impl.__name__} is not one: "
                            f"declare it as class {impl.__name__}(nn.Module) and call super().__init__()")
        return
    if isinstance(impl, nn.Module):
        raise TypeError(f"{ck.name} expects your class, not an instance of it: call {ck.name}"
                        f"({type(impl).__name__}) instead of {ck.name}({type(impl).__name__}(...)); "
                        f"the check builds its own instances, e.g. {example}")
    raise TypeError(f"{ck.name} expects your nn.Module class, e.g. {ck.name}({example.split('(')[0]}), "
                    f"got {type(impl).__name__} {impl!r}")


def require_function(ck: Checker, impl, example: str):
    """Raise TypeError unless impl is a plain callable (a function, not a class)."""
    if inspect.isclass(impl):
        raise TypeError(f"{ck.name} expects a function such as {example}, got the class {impl.__name__}: "
                        "pass the function itself")
    if isinstance(impl, nn.Module):
        raise TypeError(f"{ck.name} expects a function such as {example}, got an instance of "
                        f"{type(impl).__name__}: pass the function (or, where the check accepts a class, the "
                        "class itself, not an instance)")
    if not callable(impl):
        raise TypeError(f"{ck.name} expects a function such as {example}, got {type(impl).__name__} {impl!r}")


def build(ck: Checker, cls, *args, signature: str):
    """Instantiate the learner's class; a failing constructor becomes a message naming the lesson's signature."""
    args_text = ", ".join(repr(a) if not isinstance(a, GPTConfig) else "cfg" for a in args)
    module = ck.call(f"{cls.__name__}({args_text})", cls, *args,
                     bug=f"the constructor must accept the lesson's arguments: {signature}")
    if not isinstance(module, nn.Module):
        ck.fail(f"{cls.__name__}(...) did not build an nn.Module", "call super().__init__() first in __init__")
    return module


def describe_difference(got: Tensor, expected: Tensor) -> str:
    """One sentence on how got differs from expected: shape, NaN/inf, or the largest difference and where."""
    if tuple(got.shape) != tuple(expected.shape):
        return f"your output has shape {tuple(got.shape)} but should have shape {tuple(expected.shape)}"
    got, expected = got.detach().double(), expected.detach().double()
    if got.dim() == 0:
        return f"yours is {got.item():.4g}, expected {expected.item():.4g}"
    bad = ~torch.isfinite(got) & torch.isfinite(expected)
    if bad.any():
        index = tuple(i.item() for i in bad.nonzero()[0])
        return (f"your output holds {got[index].item()} at index {index} (and {bad.sum().item()} such entries in "
                f"all) where the reference is {expected[index].item():.4g}")
    diff = (got - expected).abs().nan_to_num(nan=math.inf)
    index = tuple(i.item() for i in (diff == diff.max()).nonzero()[0])
    return (f"your output differs from the reference by up to {diff.max().item():.4g} (yours "
            f"{got[index].item():.4g}, expected {expected[index].item():.4g} at index {index})")


def close(got, expected: Tensor, atol: float, rtol: float) -> bool:
    return (isinstance(got, Tensor) and tuple(got.shape) == tuple(expected.shape)
            and torch.allclose(got.detach().double(), expected.detach().double(), atol=atol, rtol=rtol,
                               equal_nan=True))


def compare(ck: Checker, got, expected: Tensor, variants, situation: str, fallback: str,
            atol: float = 1e-6, rtol: float = 1e-5) -> None:
    """Pass when got matches expected. Otherwise fail, naming the first known mistake (bug, make_output)
    in `variants` whose output got matches, or describing the difference and giving `fallback`."""
    if isinstance(got, tuple):
        ck.fail(f"{situation}, your code returned a tuple of {len(got)} items instead of one tensor",
                "return only the output tensor (not extra values such as the attention weights)")
    if not isinstance(got, Tensor):
        ck.fail(f"{situation}, your code returned a {type(got).__name__} instead of a torch.Tensor",
                "return the tensor itself (no .tolist(), .item() or numpy conversion)")
    if close(got, expected, atol, rtol):
        ck.ok()
        return
    for bug, make in variants:
        try:
            candidate = make()
        except Exception:  # a variant that cannot be computed for this input cannot be the explanation
            continue
        if close(got, candidate, atol, rtol):
            ck.fail(f"{situation}, {describe_difference(got, expected)}.", bug)
    ck.fail(f"{situation}, {describe_difference(got, expected)}.", fallback)


def check_unchanged(ck: Checker, before: Tensor, after: Tensor, what: str) -> None:
    if not torch.equal(before, after):
        ck.fail(f"your {what} changed the tensor it was given",
                "an in-place operation on the input (x *= ..., x.mul_(...), logits[...] = ..., "
                "masked_fill_): compute a new tensor instead, e.g. x = x * 2 or logits.masked_fill(...)")
    ck.ok()


# ----------------------------------------------------------------------------------------- 01 tokenization

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
        for bug, make in variants:
            if got == make():
                ck.fail(f"for {words} you returned {got}, expected {expected}", bug)
        ck.fail(f"for {words} you returned {got}, expected {expected}",
                "count pairs (symbols[i], symbols[i + 1]) for every i and add the word's frequency")
    ck.ok()
    got = ck.call("my_count_pairs({})", learner_impl, {})
    if dict(got) != {}:
        ck.fail(f"for no words at all you returned {got}", "an empty dict of words has no pairs")
    ck.ok()
    ck.done("Your pair counter matches course_lib's count_pairs.")


# ----------------------------------------------------------------------------------------- 02 embeddings

@isolated_rng
def check_sinusoidal_table(learner_impl) -> None:
    """Check `learner_impl(max_len, emb_dim)`, the sinusoidal position code of notebook 02.

    Must return a float tensor (max_len, emb_dim) whose row p, column j is sin(p * w_j) for even j and
    cos(p * w_j) for odd j, with w_j = 10000 ** (-2 * (j // 2) / emb_dim), for any emb_dim (odd too), like
    course_lib.embeddings.SinusoidalPositionalEmbedding(emb_dim, max_len)(max_len)."""
    ck = Checker("check_sinusoidal_table")
    require_function(ck, learner_impl, "my_sinusoidal_table(max_len, emb_dim)")

    def table(max_len, emb_dim, column_speed=lambda j, d: 10000.0 ** (-2 * (j // 2) / d), first="sin",
              start=0, layout="interleaved"):
        p = torch.arange(start, start + max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
        j = torch.arange(emb_dim, dtype=torch.float64)
        angles = p * column_speed(j, emb_dim)  # (max_len, emb_dim)
        if layout == "blocks":  # sines of every speed first, then cosines
            half = (emb_dim + 1) // 2
            speeds = 10000.0 ** (-2 * torch.arange(half, dtype=torch.float64) / emb_dim)
            return torch.cat([torch.sin(p * speeds), torch.cos(p * speeds)[:, : emb_dim - half]], dim=1)
        even = (j % 2 == 0)
        sin, cos = torch.sin(angles), torch.cos(angles)
        return torch.where(even, sin, cos) if first == "sin" else torch.where(even, cos, sin)

    for max_len, emb_dim in ((12, 8), (50, 16), (7, 9)):
        expected = SinusoidalPositionalEmbedding(emb_dim, max_len)(max_len)
        crash_bug = ("an odd emb_dim has one more sine than cosine: fill the sines into columns 0::2 and the "
                     "cosines into 1::2 using only the first emb_dim // 2 angles") if emb_dim % 2 else None
        got = ck.call(f"my_sinusoidal_table({max_len}, {emb_dim})", learner_impl, max_len, emb_dim, bug=crash_bug)
        variants = [
            ("the table is transposed: return it as (max_len, emb_dim), one row per position",
             lambda: table(max_len, emb_dim).T),
            ("sine and cosine are swapped: even columns hold the sine, odd columns the cosine",
             lambda: table(max_len, emb_dim, first="cos")),
            ("every column has its own speed: columns 2i and 2i + 1 share one speed, so the exponent uses "
             "2 * (j // 2), not j", lambda: table(max_len, emb_dim, column_speed=lambda j, d: 10000.0 ** (-j / d))),
            ("the exponent has lost its minus sign: the speeds must shrink from 1 towards 1/10000",
             lambda: table(max_len, emb_dim, column_speed=lambda j, d: 10000.0 ** (2 * (j // 2) / d))),
            ("positions start at 1: the first row is position 0 (sin 0 = 0, cos 0 = 1)",
             lambda: table(max_len, emb_dim, start=1)),
            ("the sines and cosines sit in two blocks: interleave them, sines in columns 0, 2, 4, ... and "
             "cosines in 1, 3, 5, ...", lambda: table(max_len, emb_dim, layout="blocks")),
        ]
        compare(ck, got, expected, variants, f"for max_len={max_len}, emb_dim={emb_dim}",
                "compare row 1 of your table with the formula by hand", atol=1e-5, rtol=1e-4)
    ck.done("Your table matches SinusoidalPositionalEmbedding, odd emb_dim included.")


def embedding_variants(ref: GPTEmbedding, ids: Tensor, start_pos: int = 0):
    num_tokens = ids.shape[1]
    positions = torch.arange(start_pos, start_pos + num_tokens)
    tok = ref.tok_emb(ids)
    return [
        ("the position embedding is never added: return tok_emb(token_ids) + pos_emb(positions)", lambda: tok),
        ("the token embedding is missing: add tok_emb(token_ids) to the position embedding",
         lambda: ref.pos_emb(positions).expand_as(tok)),
        ("pos_emb is looked up with the token ids; look it up with the positions "
         "torch.arange(num_tokens)", lambda: tok + ref.pos_emb(ids)),
        ("positions start at 1; the first token sits at position 0: torch.arange(num_tokens)",
         lambda: tok + ref.pos_emb(positions + 1)),
        ("start_pos is ignored: with start_pos the tokens sit at positions start_pos .. start_pos + tokens - 1",
         lambda: tok + ref.pos_emb(positions - start_pos)),
        ("the two embeddings are concatenated; add them instead, so the output keeps emb_dim features",
         lambda: torch.cat([tok, ref.pos_emb(positions).expand_as(tok)], dim=-1)),
    ]


@isolated_rng
def check_gpt_embedding(learner_impl) -> None:
    """Check `learner_impl`, GPT-2's input layer from notebook 02.

    learner_impl(cfg) takes a GPTConfig and holds `tok_emb` (nn.Embedding(vocab_size, emb_dim)), `pos_emb`
    (nn.Embedding(context_length, emb_dim)) and a dropout; forward(token_ids) maps integer ids
    (batch, tokens) to (batch, tokens, emb_dim). If forward also takes `start_pos`, that is checked too.
    Compared with course_lib.embeddings.GPTEmbedding."""
    ck = Checker("check_gpt_embedding")
    require_class(ck, learner_impl, "MyGPTEmbedding(cfg)")
    cfg = GPTConfig(vocab_size=50, context_length=8, emb_dim=6, n_heads=2, n_layers=1, drop_rate=0.0)
    mine = build(ck, learner_impl, cfg, signature="MyGPTEmbedding(cfg) with a GPTConfig")
    ref = GPTEmbedding(cfg).double().eval()
    for name, rows, role in (("tok_emb", cfg.vocab_size, "token id"), ("pos_emb", cfg.context_length, "position")):
        layer = getattr(mine, name, None)
        if not isinstance(layer, nn.Embedding):
            ck.fail(f"your module has no nn.Embedding called {name}",
                    f"name the layers as in the lesson: self.{name} = nn.Embedding(...)")
        if tuple(layer.weight.shape) != (rows, cfg.emb_dim):
            wrong = ("vocab_size" if layer.weight.shape[0] == cfg.vocab_size else
                     "context_length" if layer.weight.shape[0] == cfg.context_length else str(layer.weight.shape[0]))
            ck.fail(f"{name} has shape {tuple(layer.weight.shape)}, expected ({rows}, {cfg.emb_dim})",
                    f"{name} needs one row per {role}: nn.Embedding("
                    f"{'cfg.vocab_size' if rows == cfg.vocab_size else 'cfg.context_length'}, cfg.emb_dim), "
                    f"not {wrong} rows")
    ck.ok()
    mine = mine.double().eval()
    with torch.no_grad():
        mine.tok_emb.weight.copy_(ref.tok_emb.weight)
        mine.pos_emb.weight.copy_(ref.pos_emb.weight)
        takes_start = "start_pos" in inspect.signature(mine.forward).parameters
        for ids, what in ((torch.randint(0, cfg.context_length, (2, 5)), "token ids (2, 5)"),
                          (torch.randint(0, cfg.vocab_size, (3, cfg.context_length)),
                           f"a full context of {cfg.context_length} tokens"),
                          (torch.tensor([[7]]), "one sequence of one token")):
            got = ck.call(f"forward on {what}", mine, ids)
            compare(ck, got, ref(ids), embedding_variants(ref, ids), f"for {what}",
                    "print tok_emb(ids), pos_emb(positions) and your output for a (1, 2) input")
        if takes_start:
            ids = torch.randint(0, cfg.vocab_size, (2, 3))
            got = ck.call("forward(token_ids, start_pos=4)", mine, ids, start_pos=4)
            compare(ck, got, ref(ids, start_pos=4), embedding_variants(ref, ids, 4),
                    "for 3 tokens with start_pos=4", "positions are start_pos, start_pos + 1, ...")
        # dropout: active in training mode only
        mine_dropout = build(ck, learner_impl, GPTConfig(vocab_size=50, context_length=8, emb_dim=6, n_heads=2,
                                                         n_layers=1, drop_rate=0.5), signature="MyGPTEmbedding(cfg)")
        ids = torch.randint(0, cfg.vocab_size, (4, 8))
        mine_dropout.train()
        zeros = (ck.call("forward in training mode", mine_dropout, ids) == 0).double().mean().item()
        if zeros < 0.2:
            ck.fail(f"with drop_rate 0.5 in training mode only {zeros:.0%} of your outputs are zero",
                    "no dropout after the sum: self.drop_emb = nn.Dropout(cfg.drop_rate), applied to "
                    "tok_emb(...) + pos_emb(...)")
        mine_dropout.eval()
        if not torch.equal(mine_dropout(ids), mine_dropout(ids)):
            ck.fail("in eval mode two calls on the same ids give different outputs",
                    "dropout still runs in eval mode: use nn.Dropout (which follows .eval()), or pass "
                    "training=self.training to F.dropout")
        ck.ok()
    ck.done("Your GPTEmbedding matches course_lib's: token plus position embeddings, then dropout.")


# ----------------------------------------------------------------------------------------- 03 layernorm

def layernorm_variant(x, scale, shift, eps=1e-5, dims=(-1,), unbiased=False, eps_outside=False, center=True,
                      affine="both"):
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, keepdim=True, unbiased=unbiased)
    normed = (x - mean if center else x) / (var.sqrt() + eps if eps_outside else (var + eps).sqrt())
    return {"both": scale * normed + shift, "none": normed, "scale": scale * normed, "shift": normed + shift,
            "swapped": shift * normed + scale}[affine]


@isolated_rng
def check_layernorm(learner_impl) -> None:
    """Check `learner_impl`, the LayerNorm class of notebook 03.

    learner_impl(emb_dim) (an optional eps must default to 1e-5) holds parameters `scale` and `shift` of shape
    (emb_dim,) and normalises its input (..., emb_dim) over the last dimension. Compared with
    course_lib.normalization.LayerNorm, which equals nn.LayerNorm."""
    ck = Checker("check_layernorm")
    require_class(ck, learner_impl, "MyLayerNorm(emb_dim)")
    emb_dim = 6  # small on purpose: unbiased variance is off by sqrt(6/5), easy to see
    mine = build(ck, learner_impl, emb_dim, signature="MyLayerNorm(emb_dim, eps=1e-5)").double().eval()
    params = dict(mine.named_parameters())
    scale, shift = torch.randn(emb_dim, dtype=torch.float64), torch.randn(emb_dim, dtype=torch.float64)
    if not params:
        plain = [n for n in ("scale", "shift") if isinstance(getattr(mine, n, None), Tensor)]
        if plain:
            ck.fail(f"{' and '.join(plain)} {'is a plain tensor' if len(plain) == 1 else 'are plain tensors'}, "
                    "not parameters, so an optimiser would never train them",
                    "wrap them: self.scale = nn.Parameter(torch.ones(emb_dim)) and "
                    "self.shift = nn.Parameter(torch.zeros(emb_dim))")
        ck.fail("your LayerNorm has no parameters",
                "no learnable scale and shift: add self.scale = nn.Parameter(torch.ones(emb_dim)) and "
                "self.shift = nn.Parameter(torch.zeros(emb_dim)), and return self.scale * norm_x + self.shift")
    if set(params) != {"scale", "shift"}:
        ck.fail(f"your LayerNorm has the parameters {sorted(params)}, expected scale and shift",
                "name them as in the lesson: self.scale = nn.Parameter(torch.ones(emb_dim)), "
                "self.shift = nn.Parameter(torch.zeros(emb_dim))")
    else:
        for name in ("scale", "shift"):
            if tuple(params[name].shape) != (emb_dim,):
                ck.fail(f"{name} has shape {tuple(params[name].shape)}, expected ({emb_dim},)",
                        f"one {name} value per feature: nn.Parameter(torch.{'ones' if name == 'scale' else 'zeros'}"
                        "(emb_dim))")
        with torch.no_grad():
            mine.scale.copy_(scale)
            mine.shift.copy_(shift)
    ck.ok()
    ref = LayerNorm(emb_dim).double()
    with torch.no_grad():
        ref.scale.copy_(scale)
        ref.shift.copy_(shift)

    def variants(x):
        v = functools.partial(layernorm_variant, x, scale, shift)
        return [
            ("eps is added outside the square root, (x - mean) / (sqrt(var) + eps): put it inside, "
             "(x - mean) / torch.sqrt(var + eps)", lambda: v(eps_outside=True)),
            ("unbiased variance (divides by emb_dim - 1): use x.var(dim=-1, keepdim=True, unbiased=False)",
             lambda: v(unbiased=True)),
            ("unbiased variance (divides by emb_dim - 1) and eps outside the square root: use "
             "x.var(dim=-1, keepdim=True, unbiased=False) and torch.sqrt(var + eps)",
             lambda: v(unbiased=True, eps_outside=True)),
            ("eps is missing: divide by torch.sqrt(var + eps) with eps = 1e-5", lambda: v(eps=0.0)),
            *[(f"eps is {e:g} instead of 1e-5", lambda e=e: v(eps=e)) for e in (1e-6, 1e-8, 1e-12, 1e-3, 1e-4)],
            ("normalising over the wrong dimension (dim=0, the batch): use dim=-1", lambda: v(dims=(0,))),
            ("normalising over the wrong dimension (the tokens, dim=1 or -2): use dim=-1", lambda: v(dims=(-2,))),
            ("normalising over the last two dimensions together: use only dim=-1", lambda: v(dims=(-2, -1))),
            ("the mean is not subtracted: use (x - mean) / torch.sqrt(var + eps)", lambda: v(center=False)),
            ("scale and shift are not applied: return self.scale * norm_x + self.shift", lambda: v(affine="none")),
            ("shift is not added: return self.scale * norm_x + self.shift", lambda: v(affine="scale")),
            ("scale is not multiplied: return self.scale * norm_x + self.shift", lambda: v(affine="shift")),
            ("scale and shift are swapped: return self.scale * norm_x + self.shift", lambda: v(affine="swapped")),
        ]

    fallback = ("compute mean and biased variance over dim=-1 with keepdim=True, then "
                "scale * (x - mean) / torch.sqrt(var + eps) + shift")
    with torch.no_grad():
        inputs = [(torch.randn(2, 3, emb_dim, dtype=torch.float64) * 2 + 0.5, "on random input (2, 3, 6)"),
                  (3.0 + 1e-3 * torch.randn(2, 3, emb_dim, dtype=torch.float64),
                   "on rows whose values are almost equal (spread 0.001)"),
                  (torch.randn(4, emb_dim, dtype=torch.float64), "on a 2-D input (4, 6)")]
        for x, situation in inputs:
            before = x.clone()
            got = ck.call(f"forward {situation}", mine, x)
            check_unchanged(ck, before, x, "LayerNorm")
            compare(ck, got, ref(x), variants(x), situation, fallback)
        constant = torch.full((1, 2, emb_dim), 7.0, dtype=torch.float64)
        got = ck.call("forward on constant rows", mine, constant)
        if isinstance(got, Tensor) and torch.isnan(got).any():
            ck.fail("a row whose values are all equal gives NaN", "eps is missing: with zero variance you divide "
                    "0 by 0; divide by torch.sqrt(var + eps)")
        compare(ck, got, ref(constant), [], "on rows whose values are all equal (zero variance)",
                "a constant row normalises to 0, so the output must equal shift")
    ck.done("Your LayerNorm matches course_lib's LayerNorm (and nn.LayerNorm).")


# ----------------------------------------------------------------------------------------- 04 gelu, feedforward

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_tanh(x, c=SQRT_2_OVER_PI, cubic=0.044715, power=3, half=0.5, one=1.0):
    return half * x * (one + torch.tanh(c * (x + cubic * x**power)))


def gelu_variants(x):
    return [
        ("this is the exact GELU, x * Phi(x) with erf (nn.GELU()'s default); GPT-2 uses the tanh approximation "
         "0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))", lambda: F.gelu(x)),
        ("this is the sigmoid approximation x * sigmoid(1.702 * x); GPT-2 uses the tanh approximation",
         lambda: x * torch.sigmoid(1.702 * x)),
        ("this is ReLU: GELU is 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))", lambda: F.relu(x)),
        ("the factor 0.5 in front is missing", lambda: gelu_tanh(x, half=1.0)),
        ("the 1 + inside the bracket is missing: 0.5 * x * (1 + tanh(...))", lambda: gelu_tanh(x, one=0.0)),
        ("wrong constant: sqrt(2 / pi) written as 2 / pi", lambda: gelu_tanh(x, c=2 / math.pi)),
        ("wrong constant: sqrt(2 / pi) written as sqrt(pi / 2)", lambda: gelu_tanh(x, c=math.sqrt(math.pi / 2))),
        ("wrong constant: sqrt(2 / pi) written as sqrt(2 * pi)", lambda: gelu_tanh(x, c=math.sqrt(2 * math.pi))),
        ("wrong constant: sqrt(2 / pi) written as sqrt(2) / pi", lambda: gelu_tanh(x, c=math.sqrt(2) / math.pi)),
        ("wrong constant: 0.044715 mistyped as 0.44715", lambda: gelu_tanh(x, cubic=0.44715)),
        ("wrong constant: 0.044715 mistyped as 0.0044715", lambda: gelu_tanh(x, cubic=0.0044715)),
        ("the cubic term is missing: tanh(sqrt(2 / pi) * (x + 0.044715 * x**3))", lambda: gelu_tanh(x, cubic=0.0)),
        ("x**2 instead of x**3 in the cubic term", lambda: gelu_tanh(x, power=2)),
    ]


def as_function(ck: Checker, impl, example: str):
    """A learner's elementwise function or nn.Module class (built without arguments), as a function."""
    if inspect.isclass(impl):
        require_class(ck, impl, f"{impl.__name__}()")
        return build(ck, impl, signature=f"{impl.__name__}() without arguments").eval()
    if isinstance(impl, nn.Module):
        raise TypeError(f"{ck.name} expects your class or function, not an instance: call "
                        f"{ck.name}({type(impl).__name__})")
    require_function(ck, impl, example)
    return impl


@isolated_rng
def check_gelu(learner_impl) -> None:
    """Check a GELU from notebook 04: either a function `my_gelu(x)` or an nn.Module class `MyGELU` whose
    instances (built without arguments) map a float tensor of any shape elementwise. Compared with
    course_lib.feedforward.GELU, the tanh approximation GPT-2 uses."""
    ck = Checker("check_gelu")
    gelu = as_function(ck, learner_impl, "my_gelu(x)")
    ref = GELU()
    with torch.no_grad():
        inputs = [(torch.randn(2, 3, 4, dtype=torch.float64), "on random input (2, 3, 4)"),
                  (torch.linspace(-6, 6, 121, dtype=torch.float64), "on the points -6, -5.9, ..., 6"),
                  (torch.tensor([-50.0, -20.0, 0.0, 20.0, 50.0], dtype=torch.float64),
                   "on the large inputs -50, -20, 0, 20, 50")]
        for x, situation in inputs:
            before = x.clone()
            got = ck.call(f"GELU {situation}", gelu, x)
            check_unchanged(ck, before, x, "GELU")
            compare(ck, got, ref(x), gelu_variants(x), situation,
                    "compare your formula with 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3))) "
                    "term by term", atol=1e-7, rtol=1e-6)
    ck.done("Your GELU matches course_lib's GELU, the tanh form GPT-2 uses.")


def linear_layers(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


@isolated_rng
def check_feedforward(learner_impl) -> None:
    """Check `learner_impl`, the feed-forward network of notebook 04.

    learner_impl(cfg) takes a GPTConfig and holds two nn.Linear layers (created in this order: emb_dim ->
    4 * emb_dim, then 4 * emb_dim -> emb_dim) with GELU between them; forward(x) maps (batch, tokens, emb_dim)
    to the same shape. Compared with course_lib.feedforward.FeedForward."""
    ck = Checker("check_feedforward")
    require_class(ck, learner_impl, "MyFeedForward(cfg)")
    cfg = GPTConfig(vocab_size=50, context_length=8, emb_dim=8, n_heads=2, n_layers=1, drop_rate=0.0)
    d = cfg.emb_dim
    mine = build(ck, learner_impl, cfg, signature="MyFeedForward(cfg) with a GPTConfig")
    layers = linear_layers(mine)
    if len(layers) != 2:
        ck.fail(f"your FeedForward has {len(layers)} nn.Linear layers, expected 2",
                "use nn.Sequential(nn.Linear(emb_dim, 4 * emb_dim), GELU(), nn.Linear(4 * emb_dim, emb_dim))")
    first, second = layers
    if first.out_features == d:
        ck.fail(f"the hidden layer has emb_dim = {d} units instead of 4 * emb_dim = {4 * d}",
                "no 4x expansion: the first Linear maps emb_dim -> 4 * emb_dim, the second 4 * emb_dim -> emb_dim")
    if (first.in_features, first.out_features, second.in_features, second.out_features) != (d, 4 * d, 4 * d, d):
        ck.fail(f"your layers map {first.in_features} -> {first.out_features} and {second.in_features} -> "
                f"{second.out_features}; expected {d} -> {4 * d} and {4 * d} -> {d} (emb_dim = {d})",
                "the first Linear expands emb_dim -> 4 * emb_dim, the second projects back; create them in that order")
    if first.bias is None or second.bias is None:
        ck.fail("one of your Linear layers has no bias", "keep nn.Linear's default bias=True, as GPT-2 does")
    ck.ok()
    ref = FeedForward(cfg).double().eval()
    mine = mine.double().eval()
    lin1, lin2 = ref.layers[0], ref.layers[2]
    with torch.no_grad():
        first.load_state_dict(lin1.state_dict())
        second.load_state_dict(lin2.state_dict())
        for x, situation in ((torch.randn(2, 3, d, dtype=torch.float64), "on random input (2, 3, 8)"),
                             (3 * torch.randn(1, 1, d, dtype=torch.float64), "on one token (1, 1, 8)")):
            got = ck.call(f"forward {situation}", mine, x)
            variants = [
                ("the activation is missing between the two Linear layers: put GELU() between them",
                 lambda: lin2(lin1(x))),
                ("ReLU instead of GELU between the Linear layers", lambda: lin2(F.relu(lin1(x)))),
                ("exact GELU (nn.GELU() or F.gelu without approximate='tanh'); GPT-2 uses the tanh "
                 "approximation: course_lib.feedforward.GELU or nn.GELU(approximate='tanh')",
                 lambda: lin2(F.gelu(lin1(x)))),
                ("GELU is applied after the second Linear layer; it belongs between the two",
                 lambda: F.gelu(lin2(lin1(x)), approximate="tanh")),
                ("GELU is applied before the first Linear layer; it belongs between the two",
                 lambda: lin2(lin1(F.gelu(x, approximate="tanh")))),
                ("the feed-forward adds its input (a shortcut); the block adds the shortcut, so return only "
                 "the network's output", lambda: x + ref(x)),
            ]
            compare(ck, got, ref(x), variants, situation,
                    "forward must return layers(x) for Linear(emb_dim, 4 * emb_dim) -> GELU -> Linear(4 * emb_dim, "
                    "emb_dim)")
    ck.done("Your FeedForward matches course_lib's: emb_dim -> 4 * emb_dim -> GELU -> emb_dim.")


# ----------------------------------------------------------------------------------------- 05 attention

def attend(q, k, v, scale, mask="causal", softmax_dim=-1):
    """Attention with a deliberate choice of scale, mask and softmax dimension; q, k, v: (..., tokens, d)."""
    n = q.shape[-2]
    ones = torch.ones(n, n, dtype=torch.bool, device=q.device)
    masks = {"causal": torch.triu(ones, 1), "diagonal": torch.triu(ones, 0), "one_ahead": torch.triu(ones, 2),
             "past": torch.tril(ones, -1)}
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., tokens, tokens)
    if mask in masks:
        weights = torch.softmax(scores.masked_fill(masks[mask], float("-inf")), dim=softmax_dim)
    elif mask == "zero":
        weights = torch.softmax(scores.masked_fill(masks["causal"], 0.0), dim=softmax_dim)
    elif mask == "after_softmax":
        weights = torch.softmax(scores, dim=softmax_dim).masked_fill(masks["causal"], 0.0)
    elif mask == "after_softmax_inf":
        weights = torch.softmax(scores, dim=softmax_dim).masked_fill(masks["causal"], float("-inf"))
    else:  # "none"
        weights = torch.softmax(scores, dim=softmax_dim)
    return weights @ v


def attention_variants(core, d_k: int, others: dict[str, int]):
    """Known mistakes of scaled causal attention; core(scale=..., mask=..., softmax_dim=...) computes one."""
    found = [
        ("the mask is applied after the softmax, so the weights of the past do not sum to 1 and the future "
         "still shapes them: mask the scores with -inf, then take the softmax", lambda: core(mask="after_softmax")),
        ("the mask is applied after the softmax: mask the scores with -inf, then take the softmax",
         lambda: core(mask="after_softmax_inf")),
        ("no causal mask: every token sees the future; fill the scores above the diagonal with -inf "
         "(torch.triu(..., diagonal=1)) before the softmax", lambda: core(mask="none")),
        ("the mask is off by one: it also hides the diagonal, so a token cannot see itself (and the first row "
         "is all -inf, NaN); use torch.triu(..., diagonal=1)", lambda: core(mask="diagonal")),
        ("the mask is off by one: each token also sees the next one; use torch.triu(..., diagonal=1)",
         lambda: core(mask="one_ahead")),
        ("the mask hides the past instead of the future: use torch.triu(..., diagonal=1), not torch.tril",
         lambda: core(mask="past")),
        ("masked scores are set to 0 instead of -inf, and exp(0) = 1 still gives the future a weight: use "
         "masked_fill(mask, float('-inf'))", lambda: core(mask="zero")),
        ("the softmax runs over the wrong dimension (the queries): use torch.softmax(scores, dim=-1), so each "
         "query's weights over the keys sum to 1", lambda: core(softmax_dim=-2)),
        ("the 1/sqrt(d_k) scaling is missing: divide the scores by sqrt(d_k) (the keys' last dimension) before "
         "the softmax", lambda: core(scale=1.0)),
        ("the scores are divided by d_k instead of sqrt(d_k)", lambda: core(scale=1 / d_k)),
        ("the scores are multiplied by sqrt(d_k) instead of divided", lambda: core(scale=math.sqrt(d_k))),
    ]
    for what, size in others.items():
        found.append((f"the scores are divided by sqrt({what}) = sqrt({size}); divide by sqrt(d_k), the size of "
                      f"one key vector ({d_k})", lambda s=size: core(scale=1 / math.sqrt(s))))
    return found


@isolated_rng
def check_causal_attention(learner_impl) -> None:
    """Check causal self-attention from notebook 05, given either

    * a function `my_attention(queries, keys, values)` on float tensors (batch, tokens, d_k) that returns the
      context vectors (batch, tokens, d_k), or
    * a class like course_lib.attention.CausalAttention: MyCausalAttention(d_in, d_out, context_length, dropout,
      qkv_bias=False) with nn.Linear layers W_query, W_key, W_value, and forward(x): (batch, tokens, d_in) ->
      (batch, tokens, d_out).

    Compared with course_lib.attention.CausalAttention (scale by 1/sqrt(d_k), mask the future with -inf,
    softmax over the keys, weighted sum of the values)."""
    ck = Checker("check_causal_attention")
    fallback = ("follow the order scores = queries @ keys.transpose(-2, -1) -> divide by sqrt(d_k) -> "
                "masked_fill(future, -inf) -> softmax(dim=-1) -> @ values")
    batch, tokens, d_k = 2, 5, 4
    with torch.no_grad():
        if inspect.isclass(learner_impl):
            require_class(ck, learner_impl, "MyCausalAttention(d_in, d_out, context_length, dropout)")
            d_in, context_length = 6, 8
            mine = build(ck, learner_impl, d_in, d_k, context_length, 0.0,
                         signature="MyCausalAttention(d_in, d_out, context_length, dropout, qkv_bias=False)")
            ref = CausalAttention(d_in, d_k, context_length, 0.0).double().eval()
            for name in ("W_query", "W_key", "W_value"):
                layer = getattr(mine, name, None)
                if not isinstance(layer, nn.Linear) or tuple(layer.weight.shape) != (d_k, d_in):
                    ck.fail(f"your class has no nn.Linear {name} mapping d_in -> d_out",
                            f"name the projections as in the lesson: self.{name} = nn.Linear(d_in, d_out, "
                            "bias=qkv_bias)")
                if layer.bias is not None:
                    ck.fail(f"{name} has a bias although qkv_bias is False",
                            f"pass the flag on: self.{name} = nn.Linear(d_in, d_out, bias=qkv_bias)")
            mine = mine.double().eval()
            for name in ("W_query", "W_key", "W_value"):
                getattr(mine, name).load_state_dict(getattr(ref, name).state_dict())
            ck.ok()
            others = {"d_in": d_in, "tokens": tokens}

            def run(x):
                return ck.call(f"forward on x of shape {tuple(x.shape)}", mine, x)

            def qkv(x):
                return ref.W_query(x), ref.W_key(x), ref.W_value(x)
        else:
            require_function(ck, learner_impl, "my_attention(queries, keys, values)")
            # The reference on given queries/keys/values: a CausalAttention whose projections pick them out of
            # x = [queries | keys | values].
            d_in = 3 * d_k
            ref = CausalAttention(d_in, d_k, tokens, 0.0).double().eval()
            eye = torch.eye(d_k, dtype=torch.float64)
            for i, name in enumerate(("W_query", "W_key", "W_value")):
                weight = torch.zeros(d_k, d_in, dtype=torch.float64)
                weight[:, i * d_k:(i + 1) * d_k] = eye
                getattr(ref, name).weight.copy_(weight)
            others = {"tokens": tokens}

            def qkv(x):
                return x[..., :d_k], x[..., d_k:2 * d_k], x[..., 2 * d_k:]

            def run(x):
                q, k, v = (t.clone() for t in qkv(x))
                return ck.call(f"my_attention on queries, keys and values of shape {tuple(q.shape)}",
                               learner_impl, q, k, v)

        for x, situation in ((torch.randn(batch, tokens, d_in, dtype=torch.float64), f"on a batch of {batch} "
                              f"sequences of {tokens} tokens"),
                             (torch.randn(1, 1, d_in, dtype=torch.float64), "on one token")):
            q, k, v = qkv(x)

            def core(scale=1 / math.sqrt(d_k), mask="causal", softmax_dim=-1, q=q, k=k, v=v):
                return attend(q, k, v, scale, mask, softmax_dim)

            compare(ck, run(x), ref(x), attention_variants(core, d_k, others), situation, fallback)
        # The future must not leak: changing the last token must leave every earlier output as it was.
        x = torch.randn(1, tokens, d_in, dtype=torch.float64)
        changed = x.clone()
        changed[:, -1] += 10 * torch.randn(d_in, dtype=torch.float64)
        before, after = run(x), run(changed)
        if not torch.allclose(before[:, :-1], after[:, :-1], atol=1e-8, rtol=1e-6):
            ck.fail("changing only the last token changes the outputs of earlier tokens: the future leaks",
                    "the causal mask is missing or applied in the wrong place; mask the scores above the diagonal "
                    "with -inf before the softmax")
        ck.ok()
    ck.done("Your causal attention matches course_lib's CausalAttention: scale, mask, softmax, weighted sum.")


def mha_variant(ref: MultiHeadAttention, x: Tensor, split="heads", merge="heads", num_heads=None, scale=None,
                mask="causal", softmax_dim=-1, out_proj=True) -> Tensor:
    """Multi-head attention with ref's weights and one deliberate choice of how heads are split and merged."""
    batch, tokens, _ = x.shape
    heads = ref.num_heads if num_heads is None else num_heads
    head_dim = ref.d_out // heads

    def split_heads(t):  # (batch, tokens, d_out) -> (batch, heads, tokens, head_dim)
        if split == "no_transpose":
            return t.reshape(batch, heads, tokens, head_dim)
        if split == "interleaved":
            return t.view(batch, tokens, head_dim, heads).permute(0, 3, 1, 2)
        return t.view(batch, tokens, heads, head_dim).transpose(1, 2)

    q, k, v = (split_heads(layer(x)) for layer in (ref.W_query, ref.W_key, ref.W_value))
    context = attend(q, k, v, 1 / math.sqrt(head_dim) if scale is None else scale, mask, softmax_dim)  # (batch, heads, tokens, hd)
    if merge == "no_transpose":
        merged = context.reshape(batch, tokens, ref.d_out)
    elif merge == "interleaved":
        merged = context.permute(0, 2, 3, 1).reshape(batch, tokens, ref.d_out)
    else:
        merged = context.transpose(1, 2).reshape(batch, tokens, ref.d_out)
    return ref.out_proj(merged) if out_proj else merged


@isolated_rng
def check_multihead_attention(learner_impl) -> None:
    """Check `learner_impl`, fused causal multi-head attention from notebook 05.

    learner_impl(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False), like
    course_lib.attention.MultiHeadAttention, holds nn.Linear layers W_query, W_key, W_value (d_in -> d_out) and
    out_proj (d_out -> d_out); forward(x) maps (batch, tokens, d_in) to (batch, tokens, d_out), splitting d_out
    into num_heads heads of d_out // num_heads dimensions."""
    ck = Checker("check_multihead_attention")
    require_class(ck, learner_impl, "MyMultiHeadAttention(d_in, d_out, context_length, dropout, num_heads)")
    d_in, d_out, context_length, num_heads = 6, 8, 8, 2
    head_dim = d_out // num_heads
    mine = build(ck, learner_impl, d_in, d_out, context_length, 0.0, num_heads,
                 signature="MyMultiHeadAttention(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False)")
    ref = MultiHeadAttention(d_in, d_out, context_length, 0.0, num_heads).double().eval()
    for name, shape in (("W_query", (d_out, d_in)), ("W_key", (d_out, d_in)), ("W_value", (d_out, d_in)),
                        ("out_proj", (d_out, d_out))):
        layer = getattr(mine, name, None)
        if not isinstance(layer, nn.Linear):
            if name == "out_proj":
                ck.fail("your class has no out_proj layer",
                        "out_proj is missing: after merging the heads, mix them with self.out_proj = "
                        "nn.Linear(d_out, d_out)")
            ck.fail(f"your class has no nn.Linear called {name}",
                    f"name the layers as in the lesson: self.{name} = nn.Linear(d_in, d_out, bias=qkv_bias)")
        if tuple(layer.weight.shape) != shape:
            ck.fail(f"{name} has weight shape {tuple(layer.weight.shape)}, expected {shape}",
                    f"{name} maps {shape[1]} -> {shape[0]} features: all heads together are d_out wide, each "
                    "head gets d_out // num_heads of them")
        if (layer.bias is None) != (getattr(ref, name).bias is None):
            ck.fail(f"{name} {'has no' if layer.bias is None else 'has a'} bias",
                    "W_query, W_key and W_value take bias=qkv_bias (False by default); out_proj keeps its bias")
    ck.ok()
    mine = mine.double().eval()
    with torch.no_grad():
        for name in ("W_query", "W_key", "W_value", "out_proj"):
            getattr(mine, name).load_state_dict(getattr(ref, name).state_dict())
        split_bug = ("heads are split along the wrong axis: t.view(batch, num_heads, tokens, head_dim) without a "
                     "transpose mixes tokens into heads; use t.view(batch, tokens, num_heads, head_dim).transpose(1, 2)")
        interleave_bug = ("heads are split along the wrong axis: view(batch, tokens, head_dim, num_heads) gives head h "
                          "the features h, h + num_heads, ...; use view(batch, tokens, num_heads, head_dim)"
                          ".transpose(1, 2)")
        merge_bug = ("the heads are merged without transposing back: use context.transpose(1, 2).reshape(batch, "
                     "tokens, d_out) (or .contiguous().view(...))")
        for x, situation in ((torch.randn(2, 5, d_in, dtype=torch.float64), "on a batch of 2 sequences of 5 tokens"),
                             (torch.randn(1, 1, d_in, dtype=torch.float64), "on one token")):
            v = functools.partial(mha_variant, ref, x)
            variants = [
                ("out_proj is missing (or not applied): after merging the heads, return self.out_proj(context)",
                 lambda: v(out_proj=False)),
                (split_bug, lambda: v(split="no_transpose", merge="no_transpose")),
                (split_bug, lambda: v(split="no_transpose")),
                (interleave_bug, lambda: v(split="interleaved", merge="interleaved")),
                (interleave_bug, lambda: v(split="interleaved")),
                (merge_bug, lambda: v(merge="no_transpose")),
                ("the scores are divided by sqrt(d_out); each head's dot products have head_dim terms, so divide "
                 "by sqrt(head_dim) = sqrt(d_out // num_heads)", lambda: v(scale=1 / math.sqrt(d_out))),
                ("num_heads is ignored: the layer computes one big head; split d_out into num_heads heads of "
                 "head_dim each", lambda: v(num_heads=1)),
                *attention_variants(lambda scale=1 / math.sqrt(head_dim), mask="causal", softmax_dim=-1:
                                    v(scale=scale, mask=mask, softmax_dim=softmax_dim), head_dim,
                                    {"d_in": d_in, "tokens": x.shape[1]}),
            ]
            got = ck.call(f"forward {situation}", mine, x)
            compare(ck, got, ref(x), variants, situation,
                    "split with view(batch, tokens, num_heads, head_dim).transpose(1, 2), attend per head, merge "
                    "with transpose(1, 2).reshape(batch, tokens, d_out), then out_proj")
        x = torch.randn(1, 5, d_in, dtype=torch.float64)
        changed = x.clone()
        changed[:, -1] += 10 * torch.randn(d_in, dtype=torch.float64)
        if not torch.allclose(mine(x)[:, :-1], mine(changed)[:, :-1], atol=1e-8, rtol=1e-6):
            ck.fail("changing only the last token changes the outputs of earlier tokens: the future leaks",
                    "the causal mask is missing or misplaced; mask each head's scores above the diagonal with -inf "
                    "before the softmax")
        ck.ok()
    ck.done("Your multi-head attention matches course_lib's MultiHeadAttention: split, attend, merge, project.")


# ----------------------------------------------------------------------------------------- 06 block

def block_variant(ref: TransformerBlock, x: Tensor, layout: str) -> Tensor:
    n1, n2, att, ff = ref.norm1, ref.norm2, ref.att, ref.ff
    if layout == "post_ln":
        h = n1(x + att(x))
        return n2(h + ff(h))
    if layout == "shared_norm1":
        h = x + att(n1(x))
        return h + ff(n1(h))
    if layout == "shared_norm2":
        h = x + att(n2(x))
        return h + ff(n2(h))
    if layout == "no_second_shortcut":
        return ff(n2(x + att(n1(x))))
    if layout == "no_first_shortcut":
        h = att(n1(x))
        return h + ff(n2(h))
    if layout == "no_shortcuts":
        return ff(n2(att(n1(x))))
    if layout == "normalised_shortcut":
        h = n1(x)
        h = h + att(h)
        g = n2(h)
        return g + ff(g)
    if layout == "ff_first":
        h = x + ff(n2(x))
        return h + att(n1(h))
    if layout == "no_norms":
        h = x + att(x)
        return h + ff(h)
    raise ValueError(layout)


BLOCK_BUGS = {
    "post_ln": "post-LN instead of pre-LN: GPT-2 normalises the input of each sub-layer, "
               "x = x + drop(att(norm1(x))), not x = norm1(x + att(x))",
    "shared_norm1": "one shared LayerNorm: norm1 is used before both sub-layers; the feed-forward needs its own "
                    "norm2",
    "shared_norm2": "one shared LayerNorm: norm2 is used before both sub-layers; attention reads norm1(x)",
    "no_second_shortcut": "the second shortcut is missing: x = x + drop(ff(norm2(x)))",
    "no_first_shortcut": "the first shortcut is missing: x = x + drop(att(norm1(x)))",
    "no_shortcuts": "both shortcuts are missing: each sub-layer's output is added to its input, x = x + drop(...)",
    "normalised_shortcut": "the shortcut carries the normalised x: keep x itself on the shortcut and feed "
                           "norm1(x) only into the sub-layer, x = x + drop(att(norm1(x)))",
    "ff_first": "the sub-layers are in the wrong order: attention first, then the feed-forward network",
    "no_norms": "the LayerNorms are never applied: x = x + drop(att(norm1(x))), then x = x + drop(ff(norm2(x)))",
}


def load_reference_weights(ck: Checker, mine: nn.Module, reference: dict, rename=lambda key: key) -> None:
    """Load the reference's state_dict into the learner's module, explaining any name or shape mismatch."""
    theirs = {rename(key): key for key in mine.state_dict()}
    missing = sorted(set(reference) - set(theirs))
    unexpected = sorted(theirs[k] for k in set(theirs) - set(reference))
    if missing or unexpected:
        hint = ""
        if any(k.endswith((".weight", ".bias")) and ("norm" in k) for k in unexpected):
            hint = (" nn.LayerNorm names its parameters weight and bias; use course_lib.normalization.LayerNorm "
                    "(scale and shift).")
        ck.fail(f"your module's parameters are named differently from the reference: missing "
                f"{missing[:6]}{' ...' if len(missing) > 6 else ''}, unexpected "
                f"{unexpected[:6]}{' ...' if len(unexpected) > 6 else ''}",
                "build it from the course's parts under the lesson's names (see the docstring of this check)."
                + hint)
    state = {theirs_key: reference[rename(theirs_key)] for theirs_key in mine.state_dict()}
    ck.call("loading the reference weights into your module", mine.load_state_dict, state,
            bug="a parameter has the wrong shape: compare your layers' sizes with the lesson's")


@isolated_rng
def check_transformer_block(learner_impl) -> None:
    """Check `learner_impl`, the pre-LN transformer block of notebook 06.

    learner_impl(cfg) takes a GPTConfig and, like course_lib.block.TransformerBlock, holds norm1 and norm2
    (course_lib LayerNorm), att (course_lib MultiHeadAttention), ff (course_lib FeedForward) and
    drop_shortcut (nn.Dropout(cfg.drop_rate)); forward(x) maps (batch, tokens, emb_dim) to the same shape."""
    ck = Checker("check_transformer_block")
    require_class(ck, learner_impl, "MyBlock(cfg)")
    cfg = GPTConfig(vocab_size=50, context_length=8, emb_dim=8, n_heads=2, n_layers=1, drop_rate=0.0, qkv_bias=False)
    mine = build(ck, learner_impl, cfg, signature="MyBlock(cfg) with a GPTConfig")
    ref = TransformerBlock(cfg)
    with torch.no_grad():  # LayerNorms that are not the identity, so that using the wrong one shows
        for norm in (ref.norm1, ref.norm2):
            norm.scale.copy_(1 + 0.5 * torch.randn(cfg.emb_dim))
            norm.shift.copy_(0.5 * torch.randn(cfg.emb_dim))
    ref = ref.double().eval()
    state = ref.state_dict()
    names = set(mine.state_dict())
    if names and not any(k.startswith("norm2.") for k in names) and any(k.startswith("norm1.") for k in names):
        ck.fail("your block has no norm2", BLOCK_BUGS["shared_norm1"])
    load_reference_weights(ck, mine, state)
    mine = mine.double().eval()
    ck.ok()
    fallback = "pre-LN: x = x + drop_shortcut(att(norm1(x))), then x = x + drop_shortcut(ff(norm2(x)))"
    with torch.no_grad():
        for x, situation in ((torch.randn(2, 5, cfg.emb_dim, dtype=torch.float64), "on a batch (2, 5, 8)"),
                             (torch.randn(1, 1, cfg.emb_dim, dtype=torch.float64), "on one token (1, 1, 8)")):
            got = ck.call(f"forward {situation}", mine, x)
            variants = [(bug, functools.partial(block_variant, ref, x, layout)) for layout, bug in BLOCK_BUGS.items()]
            compare(ck, got, ref(x), variants, situation, fallback)

        # Dropout, in training mode: silence attention's own dropout and the feed-forward's output, so that the
        # block computes x + drop(att(norm1(x))). Correct: some entries equal x exactly; dropout on the sum
        # (shortcut included) zeroes entries instead.
        dropping = build(ck, learner_impl, GPTConfig(vocab_size=50, context_length=8, emb_dim=8, n_heads=2,
                                                     n_layers=1, drop_rate=0.5, qkv_bias=False),
                         signature="MyBlock(cfg)")
        load_reference_weights(ck, dropping, state)
        dropping = dropping.double().train()
        dropping.att.dropout = 0.0
        ff_out = linear_layers(dropping.ff)[-1]
        ff_out.weight.zero_()
        ff_out.bias.zero_()
        x = torch.randn(4, 8, cfg.emb_dim, dtype=torch.float64)
        out = ck.call("forward in training mode with drop_rate 0.5", dropping, x)
        if (out == 0).double().mean() > 0.2:
            ck.fail("in training mode with drop_rate 0.5, about half of your block's outputs are exactly 0: dropout "
                    "also wipes out the shortcut",
                    "shortcut added before dropout: apply drop_shortcut to the sub-layer's output only, "
                    "x = x + drop_shortcut(att(norm1(x))), not drop_shortcut(x + att(norm1(x)))")
        if (out - x == 0).double().mean() < 0.2:
            ck.fail("in training mode with drop_rate 0.5, none of the attention outputs is dropped",
                    "no dropout on the sub-layer outputs: x = x + self.drop_shortcut(self.att(self.norm1(x)))")
        dropping.eval()
        if not torch.equal(dropping(x), dropping(x)):
            ck.fail("in eval mode two calls on the same input give different outputs",
                    "dropout still runs in eval mode: use nn.Dropout (it follows .eval()) or "
                    "F.dropout(..., training=self.training)")
        ck.ok()
    ck.done("Your block matches course_lib's TransformerBlock: pre-LN, dropout on each sub-layer, two shortcuts.")


# ----------------------------------------------------------------------------------------- 07 model

def model_variant(ref: GPTModel, ids: Tensor, layout: str) -> Tensor:
    emb = ref.embedding
    tokens = emb.tok_emb(ids)
    positions = emb.pos_emb(torch.arange(ids.shape[1], device=ids.device))
    x = tokens if layout == "no_pos" else tokens + positions
    if layout == "norm_first":
        x = ref.final_norm(x)
    start = x
    for block in ref.trf_blocks:
        x = block(start if layout == "not_chained" else x)
    if layout not in ("no_final_norm", "norm_first"):
        x = ref.final_norm(x)
    logits = ref.out_head(x)
    return torch.softmax(logits, dim=-1) if layout == "softmax" else logits


MODEL_BUGS = {
    "no_pos": "no positional embedding: add pos_emb(torch.arange(tokens)) to the token embeddings",
    "no_final_norm": "the final LayerNorm is missing: logits = out_head(final_norm(x)) after the last block",
    "norm_first": "final_norm is applied before the blocks; it belongs after the last block, right before out_head",
    "not_chained": "every block reads the embeddings: each block must read the previous block's output, "
                   "for block in trf_blocks: x = block(x)",
    "softmax": "the model returns probabilities: return the raw logits (the softmax belongs to the loss and to "
               "sampling)",
}


@isolated_rng
def check_gpt_model(learner_impl) -> None:
    """Check `learner_impl`, the GPT model of notebook 07.

    learner_impl(cfg) takes a GPTConfig and, like course_lib.model.GPTModel, holds the embeddings (either
    `embedding` = course_lib GPTEmbedding, or `tok_emb` and `pos_emb` directly), `trf_blocks` (an nn.ModuleList or
    nn.Sequential of course_lib TransformerBlocks), `final_norm` (course_lib LayerNorm) and `out_head`
    (nn.Linear(emb_dim, vocab_size, bias=False)); forward(token_ids) maps (batch, tokens) to logits
    (batch, tokens, vocab_size). A head tied to tok_emb is fine."""
    ck = Checker("check_gpt_model")
    require_class(ck, learner_impl, "MyGPTModel(cfg)")
    cfg = GPTConfig(vocab_size=40, context_length=8, emb_dim=8, n_heads=2, n_layers=2, drop_rate=0.0, qkv_bias=False)
    mine = build(ck, learner_impl, cfg, signature="MyGPTModel(cfg) with a GPTConfig")
    names = set(mine.state_dict())
    flat = {k.removeprefix("embedding.") for k in names}
    if not any(k.startswith("final_norm.") for k in flat):
        ck.fail("your model has no final_norm", MODEL_BUGS["no_final_norm"] + " (self.final_norm = LayerNorm(emb_dim))")
    if not any(k.startswith("pos_emb.") for k in flat):
        ck.fail("your model has no pos_emb", MODEL_BUGS["no_pos"] + " (self.pos_emb = nn.Embedding(context_length, "
                "emb_dim))")
    if "out_head.bias" in names:
        ck.fail("your out_head has a bias", "GPT-2's output layer has none: nn.Linear(emb_dim, vocab_size, bias=False)")
    tied = any(p is getattr(getattr(mine, "out_head", None), "weight", None)
               for p in (getattr(getattr(mine, "tok_emb", None), "weight", None),
                         getattr(getattr(getattr(mine, "embedding", None), "tok_emb", None), "weight", None))
               if p is not None)
    ref = GPTModel(cfg, tie_weights=tied)
    with torch.no_grad():
        ref.final_norm.scale.copy_(1 + 0.5 * torch.randn(cfg.emb_dim))
        ref.final_norm.shift.copy_(0.5 * torch.randn(cfg.emb_dim))
    ref = ref.double().eval()
    state = ref.state_dict()

    def rename(key):
        if key in state:
            return key
        if "embedding." + key in state:
            return "embedding." + key
        return key

    load_reference_weights(ck, mine, state, rename)
    mine = mine.double().eval()
    ck.ok()
    with torch.no_grad():
        for ids, situation in ((torch.randint(0, cfg.vocab_size, (2, 5)), "on token ids (2, 5)"),
                               (torch.randint(0, cfg.vocab_size, (1, cfg.context_length)),
                                f"on a full context of {cfg.context_length} tokens"),
                               (torch.tensor([[3]]), "on one token")):
            got = ck.call(f"forward {situation}", mine, ids)
            variants = [(bug, functools.partial(model_variant, ref, ids, layout)) for layout, bug in MODEL_BUGS.items()]
            compare(ck, got, ref(ids), variants, situation,
                    "embeddings (token + position) -> every block in order -> final_norm -> out_head")
        ids = torch.randint(0, cfg.vocab_size, (1, 6))
        changed = ids.clone()
        changed[0, -1] = (ids[0, -1] + 1) % cfg.vocab_size
        if not torch.allclose(mine(ids)[:, :-1], mine(changed)[:, :-1], atol=1e-8, rtol=1e-6):
            ck.fail("changing only the last token changes the logits of earlier positions: the future leaks",
                    "the blocks must use causal attention (course_lib's MultiHeadAttention masks the future)")
        ck.ok()
    ck.done("Your GPT model matches course_lib's GPTModel: embeddings, blocks, final norm, output head.")


# ----------------------------------------------------------------------------------------- 08 generation

def check_logits_output(ck: Checker, got, logits: Tensor, situation: str) -> Tensor:
    """Fail unless got is a tensor of logits' shape that keeps some logits and sets the others to -inf."""
    if not isinstance(got, Tensor) or tuple(got.shape) != tuple(logits.shape):
        ck.fail(f"{situation}, you returned "
                f"{'shape ' + str(tuple(got.shape)) if isinstance(got, Tensor) else type(got).__name__}, expected a "
                f"tensor of the logits' shape {tuple(logits.shape)}",
                "return the filtered logits themselves (same shape), not indices, values or probabilities")
    kept = got == logits
    removed = got == float("-inf")
    if not bool((kept | removed).all()):
        other = got[~(kept | removed)]
        if bool((other == 0).all()):
            ck.fail(f"{situation}, the filtered-out logits are 0",
                    "filtered logits set to 0 instead of -inf: exp(0) still gives them probability; use "
                    "masked_fill(..., float('-inf'))")
        if bool(((got >= 0) & (got <= 1)).all()):
            ck.fail(f"{situation}, your output looks like probabilities",
                    "return logits with the removed tokens set to -inf; the softmax comes afterwards")
        ck.fail(f"{situation}, some kept logits were changed (e.g. {other[0].item():.4g})",
                "keep the surviving logits exactly as they were and set the others to -inf")
    return ~removed  # True where kept


def fail_empty_rows(ck: Checker, kept: Tensor, situation: str) -> None:
    if not bool(kept.any(dim=-1).all()):
        ck.fail(f"{situation}, a row has no token left (every logit is -inf, so the softmax gives NaN)",
                "the most likely token must always survive")


def keep_top_p(logits: Tensor, p: float, rule: str) -> Tensor:
    """Which tokens a top-p filter keeps under one (correct or mistaken) rule."""
    probs = torch.softmax(logits, dim=-1)
    if rule == "unsorted":
        sorted_probs, order = probs, torch.arange(probs.shape[-1]).expand_as(probs)
    else:
        sorted_probs, order = probs.sort(dim=-1, descending=rule != "ascending", stable=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep_sorted = {"exclude_crossing": sorted_probs.cumsum(dim=-1) <= p,
                   "one_extra": mass_before - F.pad(sorted_probs, (1, 0))[..., :-1] < p}.get(rule, mass_before < p)
    if rule == "not_scattered":
        return keep_sorted
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


@isolated_rng
def check_temperature(learner_impl) -> None:
    """Check `learner_impl(logits, temperature)`, temperature scaling from notebook 08.

    logits: a float tensor (..., vocab_size) of raw scores; temperature > 0. Must return the scaled logits
    (not probabilities) of the same shape, like course_lib.generation.scale_logits: softmax of the result is
    the distribution to sample from. Logits that differ from the reference by a constant per row are accepted."""
    ck = Checker("check_temperature")
    require_function(ck, learner_impl, "my_scale_logits(logits, temperature)")
    with torch.no_grad():
        for logits, temperature in ((torch.randn(3, 10, dtype=torch.float64) * 2, 2.0),
                                    (torch.randn(3, 10, dtype=torch.float64) * 2, 0.5),
                                    (torch.randn(10, dtype=torch.float64) * 2, 1.0),
                                    (torch.randn(2, 4, 10, dtype=torch.float64) * 2, 0.7)):
            situation = f"for logits of shape {tuple(logits.shape)} and temperature {temperature}"
            before = logits.clone()
            got = ck.call(f"my_scale_logits on logits {tuple(logits.shape)}, temperature={temperature}",
                          learner_impl, logits, temperature)
            check_unchanged(ck, before, logits, "temperature function")
            if not isinstance(got, Tensor):
                ck.fail(f"{situation}, you returned a {type(got).__name__}", "return a tensor of scaled logits")
            probs = F.softmax(logits / temperature, dim=-1)
            as_distribution = functools.partial(torch.softmax, dim=-1)
            variants = [
                ("the logits are multiplied by the temperature: divide them, logits / temperature (T > 1 must "
                 "flatten the distribution)", lambda: as_distribution(logits * temperature)),
                ("you return probabilities: return the scaled logits, logits / temperature; the softmax comes "
                 "later", lambda: as_distribution(probs)),
                ("temperature applied after softmax: you divided the probabilities by the temperature; divide the "
                 "logits before the softmax", lambda: as_distribution(F.softmax(logits, dim=-1) / temperature)),
                ("the temperature is ignored: return logits / temperature", lambda: as_distribution(logits)),
                ("the logits are divided by temperature squared: divide them once",
                 lambda: as_distribution(logits / temperature**2)),
            ]
            compare(ck, as_distribution(got) if isinstance(got, Tensor) and got.is_floating_point() else got,
                    as_distribution(scale_logits(logits, temperature)), variants, situation + " (compared after "
                    "softmax)", "return logits / temperature")
    ck.done("Your temperature scaling matches course_lib's scale_logits.")


@isolated_rng
def check_top_k(learner_impl) -> None:
    """Check `learner_impl(logits, k)`, the top-k filter of notebook 08.

    logits: a float tensor (..., vocab_size); k: an int >= 1 (larger than the vocabulary keeps everything). Must
    return a tensor of the same shape that keeps the k largest logits of each row unchanged and sets the others
    to -inf, like course_lib.generation.top_k_filter. (Inputs have no ties.)"""
    ck = Checker("check_top_k")
    require_function(ck, learner_impl, "my_top_k(logits, k)")
    cases = [(torch.randn(4, 12), 3), (torch.randn(4, 12), 1), (torch.randn(12), 5), (torch.randn(2, 3, 12), 4),
             (torch.randn(3, 12), 12), (torch.randn(3, 12), 20)]
    with torch.no_grad():
        for logits, k in cases:
            situation = f"for logits of shape {tuple(logits.shape)} and k={k}"
            before = logits.clone()
            crash = ("k larger than the vocabulary: keep every token, e.g. k = min(k, logits.shape[-1])"
                     if k > logits.shape[-1] else None)
            got = ck.call(f"my_top_k on logits {tuple(logits.shape)}, k={k}", learner_impl, logits, k, bug=crash)
            check_unchanged(ck, before, logits, "top-k filter")
            kept = check_logits_output(ck, got, logits, situation)
            expected = torch.isfinite(top_k_filter(logits, k))
            count = int(kept.sum(dim=-1).flatten()[0])
            if torch.equal(kept, expected):
                ck.ok()
                continue
            rows = logits.reshape(-1, logits.shape[-1])
            known = [
                ("keeps k - 1 tokens: the k-th largest logit must survive; drop only logits < the k-th largest "
                 "(not <=)", lambda: torch.isfinite(top_k_filter(logits, k - 1))),
                ("keeps k + 1 tokens: the threshold is the k-th largest logit, topk(...).values[..., -1] (index "
                 "k - 1, not k)", lambda: torch.isfinite(top_k_filter(logits, k + 1))),
                ("keeps the k smallest logits: use the largest, torch.topk(logits, k) (largest=True)",
                 lambda: torch.isfinite(-top_k_filter(-logits, k))),
                ("top-k over the whole batch: take the k largest of each row, along dim=-1",
                 lambda: torch.isfinite(top_k_filter(rows.flatten(), k)).reshape(logits.shape)),
                ("top-k along the wrong dimension (the batch): take the k largest along dim=-1",
                 lambda: torch.isfinite(top_k_filter(logits.transpose(0, -1), k)).transpose(0, -1)),
            ]
            for bug, make in known:
                try:
                    if torch.equal(kept, make()):
                        ck.fail(f"{situation}, you keep {count} token(s) per row where the reference keeps "
                                f"{int(expected.sum(dim=-1).flatten()[0])}, or not the same ones", bug)
                except CheckFailed:
                    raise
                except Exception:
                    continue
            fail_empty_rows(ck, kept, situation)
            ck.fail(f"{situation}, you keep other tokens than the k largest of each row",
                    "torch.topk(logits, k).values[..., -1:] is each row's k-th largest logit; keep the logits >= it")
    ck.done("Your top-k filter matches course_lib's top_k_filter.")


@isolated_rng
def check_top_p(learner_impl) -> None:
    """Check `learner_impl(logits, p)`, the top-p (nucleus) filter of notebook 08.

    logits: a float tensor (..., vocab_size); 0 < p <= 1. Must return a tensor of the same shape that keeps the
    smallest set of most likely tokens whose probabilities add up to at least p (so the token that crosses p is
    kept, and the most likely token always is) and sets the other logits to -inf, like
    course_lib.generation.top_p_filter."""
    ck = Checker("check_top_p")
    require_function(ck, learner_impl, "my_top_p(logits, p)")
    designed = torch.tensor([0.07, 0.38, 0.11, 0.26, 0.18], dtype=torch.float64).log()  # sorted: .38 .26 .18 .11 .07
    cases = [(designed, 0.6, "the probabilities [0.07, 0.38, 0.11, 0.26, 0.18]"),
             (designed, 0.3, "the probabilities [0.07, 0.38, 0.11, 0.26, 0.18]"),
             (designed, 1.0, "the probabilities [0.07, 0.38, 0.11, 0.26, 0.18]"),
             (2 * torch.randn(4, 20, dtype=torch.float64), 0.9, "random logits (4, 20)"),
             (2 * torch.randn(2, 3, 20, dtype=torch.float64), 0.5, "random logits (2, 3, 20)")]
    with torch.no_grad():
        for logits, p, what in cases:
            situation = f"for {what} and p={p}"
            before = logits.clone()
            got = ck.call(f"my_top_p on {what}, p={p}", learner_impl, logits, p)
            check_unchanged(ck, before, logits, "top-p filter")
            kept = check_logits_output(ck, got, logits, situation)
            expected = torch.isfinite(top_p_filter(logits, p))
            if torch.equal(kept, expected):
                ck.ok()
                continue
            known = [
                ("the token that crosses p is excluded: keep the smallest set whose probabilities reach p, so keep "
                 "a token while the mass before it is < p", "exclude_crossing"),
                ("the probabilities are not sorted: sort them in descending order before the cumulative sum",
                 "unsorted"),
                ("the probabilities are sorted in ascending order: sort them descending (most likely first)",
                 "ascending"),
                ("the mask is not mapped back to vocabulary order: the cumulative sum lives in sorted order, so "
                 "scatter the mask back with the sort's indices before applying it", "not_scattered"),
                ("one token too many: the token that crosses p is the last one kept", "one_extra"),
            ]
            for bug, rule in known:
                if torch.equal(kept, keep_top_p(logits, p, rule)):
                    ck.fail(f"{situation}, you keep {kept.sum(-1).flatten().tolist()} token(s) per row where "
                            f"the reference keeps {expected.sum(-1).flatten().tolist()}, or not the same ones", bug)
            fail_empty_rows(ck, kept, situation)
            ck.fail(f"{situation}, you keep other tokens than the reference",
                    "sort the probabilities descending, take the cumulative sum, keep a token while the mass before "
                    "it is < p, and map the mask back to vocabulary order")
    ck.done("Your top-p filter matches course_lib's top_p_filter.")


# ----------------------------------------------------------------------------------------- 09 training

def reference_next_token_loss(logits: Tensor, token_ids: Tensor) -> Tensor:
    """Mean cross-entropy of predicting token_ids[:, t + 1] from logits[:, t]."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), token_ids[:, 1:].flatten())


@isolated_rng
def check_next_token_loss(learner_impl) -> None:
    """Check `learner_impl(logits, token_ids)`, the language-modelling loss of notebook 09.

    token_ids: integer ids (batch, tokens); logits: the model's output for them, (batch, tokens, vocab_size).
    Position t predicts token t + 1, so the last position has no target. Must return one number as a 0-d tensor
    that backward() can use: the mean cross-entropy over all batch * (tokens - 1) predictions, i.e.
    F.cross_entropy(logits[:, :-1].flatten(0, 1), token_ids[:, 1:].flatten())."""
    ck = Checker("check_next_token_loss")
    require_function(ck, learner_impl, "my_loss(logits, token_ids)")
    batch, tokens, vocab = 3, 6, 11

    def unshifted(lo, ids):
        return F.cross_entropy(lo.flatten(0, 1), ids.flatten())

    def per_prediction(lo, ids):
        return F.cross_entropy(lo[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")  # (batch, tokens - 1)

    for logits, ids, situation in (
            (torch.randn(batch, tokens, vocab, dtype=torch.float64), torch.randint(0, vocab, (batch, tokens)),
             f"for logits ({batch}, {tokens}, {vocab})"),
            (torch.randn(1, 2, vocab, dtype=torch.float64), torch.randint(0, vocab, (1, 2)),
             "for one sequence of two tokens (one prediction)")):
        logits.requires_grad_(True)
        expected = reference_next_token_loss(logits, ids)
        got = ck.call(f"my_loss {situation}", learner_impl, logits, ids.clone())
        if isinstance(got, (float, int)):
            ck.fail(f"{situation}, you return a Python number ({got:.4g})",
                    "the loss is turned into a number with .item(), so loss.backward() cannot work: return the tensor")
        if isinstance(got, Tensor) and got.dim() > 0 and got.numel() > 1:
            ck.fail(f"{situation}, your loss has shape {tuple(got.shape)}, expected one number (a 0-d tensor)",
                    "you return one loss per sequence or per token: average them all, e.g. with .mean() or "
                    "F.cross_entropy's default reduction")
        if isinstance(got, Tensor) and got.dim() > 0:
            got = got.reshape(())
        variants = [
            ("the targets are not shifted: position t predicts token t + 1, so compare logits[:, :-1] with "
             "token_ids[:, 1:]", lambda: unshifted(logits, ids)),
            ("the shift goes the wrong way: compare logits[:, :-1] (every position but the last) with "
             "token_ids[:, 1:] (every token but the first)", lambda: unshifted(logits[:, 1:], ids[:, :-1])),
            ("the losses are summed instead of averaged: take the mean over all predictions",
             lambda: per_prediction(logits, ids).sum()),
            ("the mean is taken over the batch only (the tokens are summed): average over all batch * (tokens - 1) "
             "predictions", lambda: per_prediction(logits, ids).sum(dim=1).mean()),
            ("the mean runs over the vocabulary as well: average over predictions only, -log_softmax(logits) "
             "at the target, not over all vocab_size entries",
             lambda: per_prediction(logits, ids).mean() / vocab),
            ("softmax applied before F.cross_entropy, which applies log_softmax itself: pass the raw logits",
             lambda: F.cross_entropy(torch.softmax(logits[:, :-1], -1).flatten(0, 1), ids[:, 1:].flatten())),
            ("the log is missing: the loss is the mean of -log(probability of the target), not of "
             "-probability", lambda: -torch.softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).mean()),
            ("the sign is wrong: cross-entropy is -log(probability of the target)",
             lambda: -reference_next_token_loss(logits, ids)),
        ]
        compare(ck, got, expected, variants, situation,
                "F.cross_entropy(logits[:, :-1].flatten(0, 1), token_ids[:, 1:].flatten())")
        if got.grad_fn is None:
            ck.fail(f"{situation}, your loss is not connected to the logits (no gradient)",
                    "the loss was computed from detached values (.detach(), .item(), torch.tensor(...), numpy): "
                    "build it from the logits with torch operations")
        got.backward()
        mine_grad = logits.grad.clone()
        logits.grad = None
        expected.backward()
        if not torch.allclose(mine_grad, logits.grad, atol=1e-8, rtol=1e-6):
            ck.fail(f"{situation}, the gradient of your loss differs from the reference's",
                    "part of your loss does not come from the logits; compute it with torch operations only")
        ck.ok()
    logits = 300 * torch.randn(2, 5, vocab)  # float32 logits far apart: softmax underflows to 0 for most tokens
    ids = torch.randint(0, vocab, (2, 5))
    got = ck.call("my_loss on large float32 logits", learner_impl, logits, ids)
    if isinstance(got, Tensor) and not bool(torch.isfinite(got).all()):
        ck.fail(f"for large float32 logits (300 * randn) your loss is {got.reshape(-1)[0].item()}",
                "log(softmax(...)) underflows to log(0) = -inf: use F.log_softmax or F.cross_entropy, which "
                "subtract the maximum first")
    compare(ck, got.reshape(()) if isinstance(got, Tensor) else got, reference_next_token_loss(logits, ids), [],
            "for large float32 logits (300 * randn)", "use F.cross_entropy or F.log_softmax", atol=1e-3, rtol=1e-4)
    ck.done("Your loss matches F.cross_entropy on next-token targets.")

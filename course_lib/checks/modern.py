"""The checks of the exercises in notebooks/16_modern_llm.ipynb."""

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from course_lib.modern import RMSNorm, Rotary, rotate

from .attention import attend, attention_variants
from .core import (Checker, build, check_unchanged, compare, describe_difference, isolated_rng, require_class,
                   require_function)

# ------------------------------------------------------------------------------------------------------- RMSNorm

RMS_SIGNATURE = "MyRMSNorm(emb_dim, eps=1e-6)"
RMS_FALLBACK = ("divide x by the root of its mean square over the last dimension, in float32, then cast back and "
                "multiply by scale: x32 = x.float(); normed = x32 / torch.sqrt(x32.pow(2).mean(dim=-1, keepdim=True) "
                "+ self.eps); return self.scale * normed.to(x.dtype)")


def rms_norm_variant(x: Tensor, scale: Tensor, eps: float = 1e-6, dims=(-1,), stat: str = "mean",
                     center: bool = False, root: str = "inside", affine: str = "scale") -> Tensor:
    """RMSNorm in float64 with one deliberate choice: the statistic (mean, sum, var, var_unbiased of the squares),
    the dimensions, the mean subtracted or not, where eps and the root go, how scale enters."""
    if center:
        x = x - x.mean(dim=dims, keepdim=True)
    stats = {"mean": lambda: x.pow(2).mean(dim=dims, keepdim=True), "sum": lambda: x.pow(2).sum(dim=dims, keepdim=True),
             "var": lambda: x.var(dim=dims, keepdim=True, unbiased=False),
             "var_unbiased": lambda: x.var(dim=dims, keepdim=True, unbiased=True)}
    s = stats[stat]()
    denominator = {"inside": lambda: (s + eps).sqrt(), "outside": lambda: s.sqrt() + eps, "no_root": lambda: s + eps,
                   "multiplied": lambda: 1 / (s + eps).sqrt()}[root]()
    normed = x / denominator
    return {"scale": lambda: scale * normed, "none": lambda: normed, "added": lambda: normed + scale}[affine]()


def rms_norm_variants(x: Tensor, scale: Tensor, eps: float = 1e-6):
    """The known mistakes of RMSNorm on x (float64), as (bug, make_output) pairs."""
    v = functools.partial(rms_norm_variant, x, scale, eps)
    wrong_eps = [(f"eps is 1e{round(math.log10(e))} instead of RMSNorm's 1e-6"
                  f"{' (the default of LayerNorm)' if e == 1e-5 else ''}: "
                  "use eps=1e-6 as the default and divide by torch.sqrt(mean_square + self.eps)",
                  lambda e=e: rms_norm_variant(x, scale, e)) for e in (1e-5, 1e-8, 1e-12, 1e-4, 1e-3) if e != eps]
    l2 = ("you divide by the vector's length (the root of the sum of the squares, x.norm()), not by its root mean "
          "square: average the squares, torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)")
    return [
        ("RMSNorm does not subtract the mean: (x - mean) / sqrt(var + eps) is LayerNorm without its shift. Divide x "
         "itself by its root mean square, x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)",
         lambda: v(center=True)),
        ("RMSNorm does not subtract the mean (here with the unbiased variance, emb_dim - 1): divide x itself by "
         "torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)", lambda: v(center=True, stat="var_unbiased")),
        ("x.var() subtracts the mean before squaring: RMSNorm needs the mean of the squares of x itself, "
         "x.pow(2).mean(dim=-1, keepdim=True)", lambda: v(stat="var")),
        ("x.var() subtracts the mean before squaring (and divides by emb_dim - 1): RMSNorm needs "
         "x.pow(2).mean(dim=-1, keepdim=True)", lambda: v(stat="var_unbiased")),
        ("eps is added outside the square root, x / (sqrt(mean_square) + eps): put it inside, "
         "x / torch.sqrt(mean_square + eps) (or x * torch.rsqrt(mean_square + eps))", lambda: v(root="outside")),
        ("eps is missing: divide by torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)",
         lambda: rms_norm_variant(x, scale, 0.0)),
        *wrong_eps,
        ("the mean square is taken over the wrong dimension (dim=0, the batch): use dim=-1", lambda: v(dims=(0,))),
        ("the mean square is taken over the wrong dimension (the tokens, dim=1 or -2): use dim=-1",
         lambda: v(dims=(-2,))),
        ("the mean square is taken over the last two dimensions together: use only dim=-1", lambda: v(dims=(-2, -1))),
        ("the squares are summed instead of averaged: " + l2, lambda: v(stat="sum")),
        (l2, lambda: v(stat="sum", root="outside")),
        (l2, lambda: rms_norm_variant(x, scale, 0.0, stat="sum")),
        ("the square root is forgotten: you divide by the mean square itself; divide by its root, "
         "torch.sqrt(mean_square + eps) (or multiply by torch.rsqrt(mean_square + eps))", lambda: v(root="no_root")),
        ("x is multiplied by the root mean square instead of divided by it: x * torch.rsqrt(mean_square + eps) or "
         "x / torch.sqrt(mean_square + eps)", lambda: v(root="multiplied")),
        ("scale is not applied: return self.scale * normed", lambda: v(affine="none")),
        ("scale is added instead of multiplied: return self.scale * normed", lambda: v(affine="added")),
        ("scale multiplies x before the normalisation, which then partly undoes it: normalise first, then "
         "return self.scale * normed", lambda: rms_norm_variant(scale * x, scale, eps, affine="none")),
    ]


def rms_scale(ck: Checker, mine, emb_dim: int):
    """The learner's parameter `scale` of shape (emb_dim,), starting at ones; a failure names what is off."""
    params = dict(mine.named_parameters())
    if "scale" not in params:
        if isinstance(getattr(mine, "scale", None), Tensor):
            ck.fail("scale is a plain tensor (or a buffer), not a parameter, so an optimiser would never train it",
                    "scale is not an nn.Parameter: wrap it, self.scale = nn.Parameter(torch.ones(emb_dim))")
        if params:
            ck.fail(f"your RMSNorm has the parameters {sorted(params)}, expected one called scale",
                    "name it as in the lesson, self.scale = nn.Parameter(torch.ones(emb_dim)) (Hugging Face calls it "
                    "weight; the course's loader maps that name to scale)")
        ck.fail("your RMSNorm has no parameters",
                "scale is missing: add self.scale = nn.Parameter(torch.ones(emb_dim)) and return self.scale * normed")
    if set(params) != {"scale"}:
        ck.fail(f"your RMSNorm has the parameters {sorted(params)}, expected only scale",
                "RMSNorm has no shift (no bias): keep only self.scale = nn.Parameter(torch.ones(emb_dim)) and return "
                "self.scale * normed")
    scale = params["scale"]
    if tuple(scale.shape) != (emb_dim,):
        ck.fail(f"scale has shape {tuple(scale.shape)}, expected ({emb_dim},)",
                "one scale value per feature: nn.Parameter(torch.ones(emb_dim))")
    if not torch.equal(scale.detach(), torch.ones_like(scale)):
        ck.fail("scale does not start at ones", "a fresh RMSNorm only normalises: create the parameter with "
                "torch.ones(emb_dim), as LayerNorm's scale (training moves it later)")
    ck.ok()
    return scale


def rms_pair(ck: Checker, learner_impl, emb_dim: int, dtype: torch.dtype, scale: Tensor, *eps):
    """The learner's RMSNorm and the reference, both cast to dtype, with the same scale."""
    mine = build(ck, learner_impl, emb_dim, *eps, signature=RMS_SIGNATURE).to(dtype).eval()
    ref = RMSNorm(emb_dim, *eps).to(dtype)
    with torch.no_grad():
        rms_scale(ck, mine, emb_dim).copy_(scale)
        ref.scale.copy_(scale)
    return mine, ref


def powers_of_two(n: int) -> Tensor:
    """Random +-2**k, k in -2..2: multiplying by them is exact in any dtype, so rounding once or twice agrees."""
    return (torch.randint(0, 2, (n,)) * 2 - 1) * 2.0 ** torch.randint(-2, 3, (n,)).double()


def check_low_precision(ck: Checker, learner_impl) -> None:
    """A bfloat16 module on a bfloat16 input returns bfloat16, computed as the reference does: mean square and root
    in float32, the result cast back. scale holds powers of two, so rounding before or after multiplying by it agrees
    and correct code equals the reference bit for bit but at rare ties of rounding (1% of the numbers may move by a
    step); statistics in bfloat16 move about a quarter of them, squares in bfloat16 alone about 4%. Then a float16
    input of values about 300, whose squares overflow float16, must still normalise."""
    emb_dim = 64
    scale = powers_of_two(emb_dim)
    mine, ref = rms_pair(ck, learner_impl, emb_dim, torch.bfloat16, scale)
    x = (3 * torch.randn(4, 8, emb_dim)).bfloat16()
    situation = "on a bfloat16 input (4, 8, 64), with the module in bfloat16"
    with torch.no_grad():
        got, expected = ck.call(f"forward {situation}", mine, x), ref(x)
    if not isinstance(got, Tensor):
        ck.fail(f"{situation}, your code returned a {type(got).__name__} instead of a torch.Tensor",
                "return the normalised tensor")
    if got.dtype != torch.bfloat16:
        ck.fail(f"{situation}, your output is {got.dtype}, not the input's dtype torch.bfloat16",
                "the output dtype is not the input dtype: the statistics are computed in float32, but the result "
                "must be cast back before scale multiplies it, return self.scale * normed.to(x.dtype)")
    if tuple(got.shape) != tuple(expected.shape):
        ck.fail(f"{situation}, {describe_difference(got, expected)}", RMS_FALLBACK)
    steps = (got.float() - expected.float()).abs() / expected.float().abs()  # relative; one bfloat16 step <= 2**-7
    moved = (got != expected).double().mean().item()
    if torch.isfinite(steps).all() and steps.max() <= 2 ** -5 and moved <= 0.01:
        ck.ok()
    elif torch.isfinite(steps).all() and steps.max() <= 2 ** -5:
        ck.fail(f"{situation}, {moved:.0%} of your outputs differ from the reference by a rounding step or two",
                "the statistics are computed in the input's low precision (bfloat16): convert first, "
                "x32 = x.float(), take the mean square and the root in float32, and cast only the result back, "
                "self.scale * normed.to(x.dtype)")
    else:
        ck.fail(f"{situation}, {describe_difference(got, expected)}", RMS_FALLBACK)
    mine, ref = rms_pair(ck, learner_impl, emb_dim, torch.float16, scale)
    x = (300 * torch.randn(2, 3, emb_dim)).half()  # squares beyond float16's largest number, 65504
    situation = "on a float16 input with values about 300 (squares up to 1e6; float16 stops at 65504)"
    with torch.no_grad():
        got, expected = ck.call(f"forward {situation}", mine, x), ref(x)
    if isinstance(got, Tensor) and got.shape == expected.shape and (got == 0).float().mean() > 0.5:
        ck.fail(f"{situation}, your output is 0 nearly everywhere",
                "the statistics are computed in the input's low precision (float16): the squares overflow to inf "
                "and x / sqrt(inf) = 0; compute them in float32, x32 = x.float(), and cast the result back, "
                "self.scale * normed.to(x.dtype)")
    compare(ck, got, expected, [], situation, "compute the mean square in float32 (x.float()), then cast back",
            atol=0.0, rtol=2e-3)


@isolated_rng
def check_rms_norm(learner_impl) -> None:
    """Check `learner_impl`, the RMSNorm class of notebook 16.

    learner_impl(emb_dim, eps=1e-6) holds one parameter, `scale` of shape (emb_dim,) starting at ones, and
    normalises its input (..., emb_dim) over the last dimension: x / sqrt(mean(x**2) + eps) * scale, with the mean
    square and the root computed in float32 and the output in the input's dtype. Compared with
    course_lib.modern.RMSNorm (Llama's and Qwen3's)."""
    ck = Checker("check_rms_norm")
    require_class(ck, learner_impl, RMS_SIGNATURE)
    emb_dim = 6  # small on purpose: summing instead of averaging is off by sqrt(6)
    scale = torch.randn(emb_dim, dtype=torch.float64)
    mine, ref = rms_pair(ck, learner_impl, emb_dim, torch.float64, scale)
    with torch.no_grad():
        inputs = [(torch.randn(2, 3, emb_dim, dtype=torch.float64) * 2 + 0.5, "on random input (2, 3, 6) of mean 0.5"),
                  (1e-3 * torch.randn(2, 3, emb_dim, dtype=torch.float64),
                   "on small values (about 0.001, mean square about 1e-6, where eps counts)"),
                  (torch.randn(4, emb_dim, dtype=torch.float64) - 1, "on a 2-D input (4, 6)")]
        for x, situation in inputs:
            before = x.clone()
            got = ck.call(f"forward {situation}", mine, x)
            check_unchanged(ck, before, x, "RMSNorm")
            compare(ck, got, ref(x), rms_norm_variants(x, scale), situation, RMS_FALLBACK)
        zeros = torch.zeros(1, 2, emb_dim, dtype=torch.float64)
        zeros[0, 1] = torch.randn(emb_dim, dtype=torch.float64)
        got = ck.call("forward on a vector of zeros", mine, zeros)
        if isinstance(got, Tensor) and torch.isnan(got).any():
            ck.fail("a vector of zeros gives NaN", "eps is missing: with a zero mean square you divide 0 by 0; "
                    "divide by torch.sqrt(mean_square + self.eps)")
        compare(ck, got, ref(zeros), [], "on a vector of zeros", "a vector of zeros normalises to zeros")
        # eps = 0.01 counts where the mean square is about 0.01: a class that ignores its eps argument shows it here
        mine_eps, ref_eps = rms_pair(ck, learner_impl, emb_dim, torch.float64, scale, 0.01)
        x = 0.1 * torch.randn(2, 3, emb_dim, dtype=torch.float64)
        ignored = ("your eps argument is ignored: MyRMSNorm(6, eps=0.01) normalises with another eps; store it "
                   "(self.eps = eps) and use self.eps in forward")
        compare(ck, ck.call("forward of MyRMSNorm(6, eps=0.01)", mine_eps, x), ref_eps(x),
                [(ignored, lambda e=e: rms_norm_variant(x, scale, e)) for e in (1e-6, 1e-5, 1e-8, 0.0)],
                "with eps=0.01 on values of mean square about 0.01", "divide by torch.sqrt(mean_square + self.eps)")
    check_low_precision(ck, learner_impl)
    ck.done("Your RMSNorm matches course_lib's RMSNorm (Llama's): no mean, no shift, statistics in float32.")


# ------------------------------------------------------------------------------------------------------- rotary

ROTARY_SIGNATURE = "my_rotary_attention(q, k, v, positions, theta=10000.0)"
ROTARY_FALLBACK = ("build angles = positions[:, None] * theta ** (-torch.arange(0, head_dim, 2) / head_dim), "
                   "cos and sin of torch.cat([angles, angles], dim=-1), turn q and k (not v) into x * cos + "
                   "torch.cat([-x2, x1], dim=-1) * sin with x1, x2 = x.chunk(2, dim=-1), then causal attention "
                   "scaled by 1 / sqrt(head_dim)")


def reference_rotary_attention(q: Tensor, k: Tensor, v: Tensor, positions: Tensor, theta: float = 10000.0) -> Tensor:
    """Causal attention of q and k turned by course_lib.modern's Rotary and rotate: (batch, heads, tokens, head_dim)."""
    cos, sin = Rotary(q.shape[-1], theta).to(q.dtype)(positions)  # (tokens, head_dim) each
    return F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True)


def rotary_variant(q, k, v, positions, theta, pairing="halves", layout=None, sign=1.0, rotated="qk",
                   exponent="2i", scale=None, mask="causal", softmax_dim=-1) -> Tensor:
    """Rotary attention in float64 with one deliberate choice: which dimensions pair up (halves: i with
    i + head_dim / 2; adjacent: 2i with 2i + 1), how cos and sin are laid out, the sign of sin, which tensors turn,
    the exponent of the frequencies, and the attention's scale, mask and softmax dimension."""
    d = q.shape[-1]
    i = torch.arange(0, d, 2, dtype=torch.float64)  # 2i
    inv_freq = {"2i": theta ** (-i / d), "i": theta ** (-(i / 2) / d), "plus": theta ** (i / d)}[exponent]
    angles = positions.double()[:, None] * inv_freq  # (tokens, head_dim / 2)
    layout = layout or pairing
    angles = torch.cat([angles, angles], dim=-1) if layout == "halves" else angles.repeat_interleave(2, dim=-1)
    cos, sin = angles.cos(), sign * angles.sin()  # (tokens, head_dim)

    def turn(x):
        if pairing == "halves":
            first, second = x.chunk(2, dim=-1)
            partner = torch.cat([-second, first], dim=-1)
        else:
            partner = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
        return x * cos + partner * sin

    q, k, v = (turn(t) if name in rotated else t for name, t in (("q", q), ("k", k), ("v", v)))
    return attend(q, k, v, 1 / math.sqrt(d) if scale is None else scale, mask, softmax_dim)


def head_dim_variants(core, head_dim: int, tokens: int):
    """Notebook 05's known mistakes of the attention itself (mask, softmax, scale), in this lesson's words: the
    size of one key vector is head_dim."""
    return [(bug.replace("d_k", "head_dim"), make) for bug, make in attention_variants(core, head_dim,
                                                                                        {"tokens": tokens})]


def rotary_variants(q, k, v, positions, theta):
    """The known mistakes of rotary attention, as (bug, make_output) pairs."""
    r = functools.partial(rotary_variant, q, k, v, positions, theta)
    tokens, d = q.shape[-2], q.shape[-1]
    halves = "x1, x2 = x.chunk(2, dim=-1) and rotate_half(x) = torch.cat([-x2, x1], dim=-1)"
    return [
        ("the values are rotated too: rotary turns only the queries and the keys (so that their dot products depend "
         "on the distance between positions); leave v as it is", lambda: r(rotated="qkv")),
        ("the wrong pairing of dimensions: you turn adjacent pairs (2i, 2i + 1), as the RoFormer paper writes it, "
         "but the lesson, like Llama and Qwen3 in Hugging Face, pairs dimension i with i + head_dim / 2; " + halves,
         lambda: r(pairing="adjacent")),
        ("the wrong pairing of dimensions: cos and sin are laid out for adjacent pairs "
         "(angles.repeat_interleave(2, dim=-1)) while the rotation pairs i with i + head_dim / 2; lay the angles out "
         "as halves, torch.cat([angles, angles], dim=-1)", lambda: r(layout="adjacent")),
        ("the wrong pairing of dimensions: the angles are laid out as halves (torch.cat([angles, angles], dim=-1)) "
         "but you turn adjacent pairs (2i, 2i + 1); pair i with i + head_dim / 2: " + halves,
         lambda: r(pairing="adjacent", layout="halves")),
        ("sin has the wrong sign, so the vectors rotate backwards: (a, b) turns to (a cos - b sin, b cos + a sin), "
         "i.e. x * cos + rotate_half(x) * sin with rotate_half(x) = torch.cat([-x2, x1], dim=-1), not "
         "torch.cat([x2, -x1], dim=-1)", lambda: r(sign=-1.0)),
        ("only the queries are rotated: turn the keys too, by their own positions", lambda: r(rotated="q")),
        ("only the keys are rotated: turn the queries too, by their own positions", lambda: r(rotated="k")),
        ("neither the queries nor the keys are rotated, so the positions have no effect: turn both by cos and sin of "
         "position * frequency", lambda: r(rotated="")),
        (f"the positions argument is ignored: you turn the tokens by torch.arange({tokens}), but they sit at the "
         f"positions {positions.tolist()}; compute the angles from positions",
         lambda: rotary_variant(q, k, v, torch.arange(tokens), theta)),
        ("the frequencies are theta ** (-i / head_dim) for i = 0, 1, 2, ...: the exponent steps by 2, "
         "theta ** (-2i / head_dim), i.e. 1 / theta ** (torch.arange(0, head_dim, 2) / head_dim)",
         lambda: r(exponent="i")),
        ("the frequencies grow instead of shrink: the exponent is negative, theta ** (-2i / head_dim), i.e. "
         "1 / theta ** (torch.arange(0, head_dim, 2) / head_dim)", lambda: r(exponent="plus")),
        *[(f"the theta argument is ignored: you use {t:g} where the call passes theta={theta:g}; use theta in the "
           "frequencies", lambda t=t: rotary_variant(q, k, v, positions, t)) for t in (10000.0, 500000.0, 1e6)
          if t != theta],
        *head_dim_variants(lambda scale=1 / math.sqrt(d), mask="causal", softmax_dim=-1:
                           r(scale=scale, mask=mask, softmax_dim=softmax_dim), d, tokens),
    ]


@isolated_rng
def check_rotary_attention(learner_impl) -> None:
    """Check `learner_impl(q, k, v, positions, theta=10000.0)`, causal attention with rotary positions (notebook 16).

    q, k, v: (batch, heads, tokens, head_dim); positions: (tokens,) increasing integers, not necessarily
    consecutive. Returns the causal attention (batch, heads, tokens, head_dim) of q and k turned by their positions
    (dimension i paired with i + head_dim / 2, frequencies theta ** (-2i / head_dim)) and v as it is, scaled by
    1 / sqrt(head_dim): course_lib.modern's Rotary and rotate, then F.scaled_dot_product_attention(is_causal=True)."""
    ck = Checker("check_rotary_attention")
    require_function(ck, learner_impl, ROTARY_SIGNATURE)
    cases = [((2, 2, 6, 8), [0, 2, 3, 7, 8, 12], None), ((1, 3, 4, 6), [1, 4, 5, 9], 100.0)]
    with torch.no_grad():
        for shape, positions, theta in cases:
            q, k, v = (torch.randn(shape, dtype=torch.float64) for _ in range(3))
            positions = torch.tensor(positions)
            given = {} if theta is None else {"theta": theta}
            theta = 10000.0 if theta is None else theta
            situation = (f"for q, k, v of shape {shape} at positions {positions.tolist()}, "
                         + (f"theta={theta:g}" if given else "theta left at its default"))
            inputs = [t.clone() for t in (q, k, v, positions)]
            got = ck.call(f"{ROTARY_SIGNATURE.split('(')[0]} {situation}", learner_impl, *inputs, **given,
                          bug=f"the function must take the lesson's arguments, {ROTARY_SIGNATURE}, and rotate by "
                          "broadcasting cos and sin (tokens, head_dim) over the batch and the heads")
            for name, before, after in zip(("q", "k", "v", "positions"), (q, k, v, positions), inputs):
                check_unchanged(ck, before, after, f"function ({name})")
            compare(ck, got, reference_rotary_attention(q, k, v, positions, theta),
                    rotary_variants(q, k, v, positions, theta), situation, ROTARY_FALLBACK, atol=1e-5, rtol=1e-5)
    ck.done("Your rotary attention matches course_lib's Rotary and rotate with causal scaled_dot_product_attention.")


# ------------------------------------------------------------------------------------------- grouped-query attention

GQA_SIGNATURE = "my_grouped_query_attention(q, k, v)"
GQA_FALLBACK = ("expand the keys and values to n_heads heads, each key/value head serving group = n_heads // "
                "n_kv_heads neighbouring query heads (k.repeat_interleave(group, dim=1), the same for v), then causal "
                "attention scaled by 1 / sqrt(head_dim)")


def reference_grouped_query_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal attention where query head h reads key/value head h // (n_heads // n_kv_heads), as
    course_lib.modern.GroupedQueryAttention computes it."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def gqa_variant(q, k, v, k_order="blocks", v_order="blocks", scale=None, mask="causal", softmax_dim=-1) -> Tensor:
    """Grouped-query attention in float64 with one deliberate choice: the order in which keys and values are
    expanded (blocks: repeat_interleave, head h reads h // group; tiles: repeat, head h reads h % n_kv_heads), and the
    attention's scale, mask and softmax dimension."""
    group = q.shape[1] // k.shape[1]

    def grow(t, order):
        return t.repeat_interleave(group, dim=1) if order == "blocks" else t.repeat(1, group, 1, 1)

    return attend(q, grow(k, k_order), grow(v, v_order), 1 / math.sqrt(q.shape[-1]) if scale is None else scale, mask,
                  softmax_dim)


@isolated_rng
def check_grouped_query_attention(learner_impl) -> None:
    """Check `learner_impl(q, k, v)`, grouped-query attention from notebook 16.

    q: (batch, n_heads, tokens, head_dim); k, v: (batch, n_kv_heads, tokens, head_dim), n_kv_heads dividing
    n_heads. Returns the causal attention (batch, n_heads, tokens, head_dim) in which query head h reads key/value
    head h // (n_heads // n_kv_heads), scaled by 1 / sqrt(head_dim), like course_lib.modern.GroupedQueryAttention
    and F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)."""
    ck = Checker("check_grouped_query_attention")
    require_function(ck, learner_impl, GQA_SIGNATURE)
    wrong_order = ("GQA repeating heads in the wrong order: query head h must read key/value head h // group "
                   "(group = n_heads // n_kv_heads, neighbouring query heads share one), but yours reads "
                   "h % n_kv_heads; {what} with repeat_interleave(group, dim=1), not repeat(1, group, 1, 1) or "
                   "expand-and-reshape with the group first")
    cases = [(2, 4, 2, 5, 4, "grouped, 4 query heads on 2 key/value heads"),
             (1, 6, 2, 5, 4, "grouped, 6 query heads on 2 key/value heads"),
             (2, 4, 1, 5, 4, "multi-query, 4 query heads on 1 key/value head"),
             (1, 4, 4, 5, 4, "multi-head, 4 query heads on 4 key/value heads")]
    with torch.no_grad():
        for batch, n_heads, n_kv_heads, tokens, head_dim, kind in cases:
            q = torch.randn(batch, n_heads, tokens, head_dim, dtype=torch.float64)
            k, v = (torch.randn(batch, n_kv_heads, tokens, head_dim, dtype=torch.float64) for _ in range(2))
            situation = f"{kind} (q {tuple(q.shape)}, k and v {tuple(k.shape)})"
            inputs = [t.clone() for t in (q, k, v)]
            got = ck.call(f"{GQA_SIGNATURE.split('(')[0]} {situation}", learner_impl, *inputs,
                          bug=f"expand both the keys and the values from n_kv_heads = {n_kv_heads} to n_heads = "
                          f"{n_heads} heads before attending, by the group size n_heads // n_kv_heads = "
                          f"{n_heads // n_kv_heads}: k.repeat_interleave(group, dim=1) and the same for v (a shape "
                          "error here means one of them was not expanded, or by the wrong factor)")
            for name, before, after in zip("qkv", (q, k, v), inputs):
                check_unchanged(ck, before, after, f"function ({name})")
            g = functools.partial(gqa_variant, q, k, v)
            variants = [
                (wrong_order.format(what="expand the keys and the values"), lambda: g("tiles", "tiles")),
                (wrong_order.format(what="the keys are expanded in the wrong order: expand them"),
                 lambda: g("tiles", "blocks")),
                (wrong_order.format(what="the values are expanded in the wrong order: expand them"),
                 lambda: g("blocks", "tiles")),
                *head_dim_variants(lambda scale=1 / math.sqrt(head_dim), mask="causal", softmax_dim=-1:
                                   g(scale=scale, mask=mask, softmax_dim=softmax_dim), head_dim, tokens),
            ]
            compare(ck, got, reference_grouped_query_attention(q, k, v), variants, situation, GQA_FALLBACK)
    ck.done("Your grouped-query attention matches scaled_dot_product_attention(enable_gqa=True): query head h reads "
            "key/value head h // group.")

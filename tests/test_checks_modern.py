"""The exercise checks of notebook 16 (RMSNorm, rotary attention, grouped-query attention) name each planted bug and
pass correct code, and their references are what course_lib.modern computes.

The learner code below is written independently of course_lib, the way a learner would write it, with a `bug`
argument: None is correct; any other value plants one named mistake. make_rms_norm(bug) builds the learner's class,
my_* functions take bug=. MODERN_PLANTED and MODERN_CORRECT are shaped like tests/test_checks.py's PLANTED and
CORRECT, which counts them too."""

import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from course_lib.checks import CheckFailed, check_grouped_query_attention, check_rms_norm, check_rotary_attention
from course_lib.checks.modern import reference_grouped_query_attention, reference_rotary_attention
from course_lib.modern import GroupedQueryAttention, ModernConfig, RMSNorm

# ------------------------------------------------------------------------------------------------------- RMSNorm


def make_rms_norm(bug=None):
    """A learner's RMSNorm with one named bug planted (None: correct)."""

    class MyRMSNorm(nn.Module):
        def __init__(self, emb_dim, eps=1e-5 if bug == "layernorm_eps" else 1e-6):
            super().__init__()
            self.eps = {"no_eps": 0.0, "eps_ignored": 1e-6}.get(bug, eps)
            if bug == "scale_tensor":
                self.scale = torch.ones(emb_dim)
            elif bug == "weight_name":
                self.weight = nn.Parameter(torch.ones(emb_dim))
            elif bug == "scale_random":
                self.scale = nn.Parameter(torch.randn(emb_dim))
            elif bug != "no_scale":
                self.scale = nn.Parameter(torch.ones(emb_dim))
            if bug == "shift":
                self.shift = nn.Parameter(torch.zeros(emb_dim))

        def forward(self, x):
            h = x if bug in ("low_precision", "in_place") else x.float()
            if bug == "bfloat16_only":  # upcasts the one half-precision type it has heard of
                h = x.float() if x.dtype == torch.bfloat16 else x
            dim = 1 if bug == "wrong_axis" else -1
            if bug == "mean_subtracted":
                h = h - h.mean(dim=dim, keepdim=True)
            if bug == "var":
                mean_square = h.var(dim=dim, keepdim=True, unbiased=False)
            elif bug == "sum":
                mean_square = (h * h).sum(dim=dim, keepdim=True)
            elif bug == "squares_low":  # squares in the input's dtype, only their mean in float32
                mean_square = (x * x).mean(dim=dim, keepdim=True, dtype=torch.float32)
            else:
                mean_square = (h * h).mean(dim=dim, keepdim=True)
            if bug == "eps_outside":
                normed = h / (mean_square.sqrt() + self.eps)
            elif bug == "no_sqrt":
                normed = h / (mean_square + self.eps)
            elif bug == "norm":
                normed = h / h.norm(dim=-1, keepdim=True)
            elif bug == "multiplied":
                normed = h * torch.sqrt(mean_square + self.eps)
            elif bug == "in_place":
                normed = x.mul_(torch.rsqrt(mean_square + self.eps))
            else:
                normed = h / torch.sqrt(mean_square + self.eps)
            if bug in ("no_scale", "scale_unused", "weight_name"):
                return normed.to(x.dtype)
            if bug == "float32_out":
                return self.scale * normed
            out = self.scale * normed.to(x.dtype)
            return out + self.shift if bug == "shift" else out

    return MyRMSNorm


def make_torch_rms_norm(bug=None):
    """A learner who calls torch's own F.rms_norm (which computes half-precision inputs in float32)."""

    class TorchRMSNorm(nn.Module):
        def __init__(self, emb_dim, eps=1e-6):
            super().__init__()
            self.eps, self.scale = eps, nn.Parameter(torch.ones(emb_dim))

        def forward(self, x):
            return F.rms_norm(x, (x.shape[-1],), self.scale, self.eps)

    return TorchRMSNorm


# ------------------------------------------------------------------------------------------------------- rotary

def rotate_half(x, bug=None):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x2, -x1), dim=-1) if bug == "backwards" else torch.cat((-x2, x1), dim=-1)


def rotate_pairs(x):
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...): RoFormer's adjacent pairs."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def my_rotary_attention(q, k, v, positions, theta=10000.0, bug=None):
    tokens, head_dim = q.shape[-2], q.shape[-1]
    steps = torch.arange(head_dim // 2).float() if bug == "freq_i" else torch.arange(0, head_dim, 2).float()
    inv_freq = 1.0 / ((10000.0 if bug == "theta_ignored" else theta) ** (steps / head_dim))
    if bug == "freq_grow":
        inv_freq = theta ** (steps / head_dim)
    pos = torch.arange(tokens) if bug == "arange" else positions
    angles = pos[:, None].float() * inv_freq[None, :]  # (tokens, head_dim / 2)
    if bug in ("adjacent", "layout_mixed"):  # layout_mixed: the angles of adjacent pairs, the rotation of halves
        angles = angles.repeat_interleave(2, dim=-1)
    else:
        angles = torch.cat((angles, angles), dim=-1)  # (tokens, head_dim)
    cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)

    def turn(x):
        return x * cos + (rotate_pairs(x) if bug == "adjacent" else rotate_half(x, bug)) * sin

    if bug == "in_place":
        q = q.mul_(cos).add_(rotate_half(q) * sin)  # wrong anyway: rotate_half reads the already scaled q
    elif bug not in ("keys_only", "no_rotation"):
        q = turn(q)
    if bug not in ("queries_only", "no_rotation"):
        k = turn(k)
    if bug == "values":
        v = turn(v)
    scores = q @ k.transpose(-2, -1)  # (batch, heads, tokens, tokens)
    if bug != "no_scale":
        scores = scores / math.sqrt(head_dim)
    if bug != "no_mask":
        scores = scores.masked_fill(torch.ones(tokens, tokens, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# ------------------------------------------------------------------------------------------- grouped-query attention

def my_grouped_query_attention(q, k, v, bug=None):
    batch, n_heads, tokens, head_dim = q.shape
    n_kv_heads = k.shape[1]
    group = n_heads // n_kv_heads
    if bug == "tile":
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    elif bug == "expand_reshape":  # the group in front: head g * n_kv_heads + j reads key/value head j
        k, v = (t[:, None].expand(batch, group, n_kv_heads, tokens, head_dim).reshape(batch, n_heads, tokens, head_dim)
                for t in (k, v))
    elif bug == "tile_values":
        k, v = k.repeat_interleave(group, dim=1), v.repeat(1, group, 1, 1)
    elif bug == "keys_only":
        k = k.repeat_interleave(group, dim=1)
    elif bug == "group_from_kv":
        k, v = k.repeat_interleave(n_kv_heads, dim=1), v.repeat_interleave(n_kv_heads, dim=1)
    else:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1)
    if bug != "no_scale":
        scores = scores / head_dim ** 0.5
    if bug != "no_mask":
        scores = scores.masked_fill(torch.triu(torch.ones(tokens, tokens, dtype=torch.bool), diagonal=1), -torch.inf)
    return scores.softmax(dim=-1) @ v


def my_grouped_query_einsum(q, k, v):
    """Correct without copying keys and values: the query heads are viewed as (n_kv_heads, group)."""
    batch, n_heads, tokens, head_dim = q.shape
    n_kv_heads = k.shape[1]
    q = q.view(batch, n_kv_heads, n_heads // n_kv_heads, tokens, head_dim)
    scores = torch.einsum("bkgqd,bksd->bkgqs", q, k) / math.sqrt(head_dim)
    future = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)
    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return torch.einsum("bkgqs,bksd->bkgqd", weights, v).reshape(batch, n_heads, tokens, head_dim)


# ------------------------------------------------------------------------------------------------ the tables

# (check, learner code, planted bug, what the check's message must match)
MODERN_PLANTED = [
    (check_rms_norm, make_rms_norm, "mean_subtracted", "RMSNorm does not subtract the mean: .* LayerNorm without"),
    (check_rms_norm, make_rms_norm, "var", r"x\.var\(\) subtracts the mean"),
    (check_rms_norm, make_rms_norm, "eps_outside", "eps is added outside the square root"),
    (check_rms_norm, make_rms_norm, "no_eps", "eps is missing"),
    (check_rms_norm, make_rms_norm, "eps_ignored", "your eps argument is ignored"),
    (check_rms_norm, make_rms_norm, "layernorm_eps", r"eps is 1e-5 instead of RMSNorm's 1e-6 \(the default of "
                                                     r"LayerNorm\)"),
    (check_rms_norm, make_rms_norm, "wrong_axis", r"wrong dimension \(the tokens"),
    (check_rms_norm, make_rms_norm, "sum", "summed instead of averaged"),
    (check_rms_norm, make_rms_norm, "norm", r"vector's length \(the root of the sum of the squares"),
    (check_rms_norm, make_rms_norm, "no_sqrt", "the square root is forgotten"),
    (check_rms_norm, make_rms_norm, "multiplied", "multiplied by the root mean square instead of divided"),
    (check_rms_norm, make_rms_norm, "no_scale", "scale is missing"),
    (check_rms_norm, make_rms_norm, "scale_tensor", "scale is not an nn.Parameter"),
    (check_rms_norm, make_rms_norm, "scale_unused", "scale is not applied"),
    (check_rms_norm, make_rms_norm, "scale_random", "scale does not start at ones"),
    (check_rms_norm, make_rms_norm, "weight_name", "expected one called scale"),
    (check_rms_norm, make_rms_norm, "shift", r"RMSNorm has no shift \(no bias\)"),
    (check_rms_norm, make_rms_norm, "in_place", "changed the tensor it was given"),
    (check_rms_norm, make_rms_norm, "low_precision", r"(?s)bfloat16 input.*computed in the input's low precision "
                                                     r"\(bfloat16\)"),
    (check_rms_norm, make_rms_norm, "squares_low", r"(?s)bfloat16 input.*computed in the input's low precision "
                                                   r"\(bfloat16\)"),
    (check_rms_norm, make_rms_norm, "bfloat16_only", r"(?s)float16 input.*computed in the input's low precision "
                                                     r"\(float16\): the squares overflow"),
    (check_rms_norm, make_rms_norm, "float32_out", "output is torch.float32.*\nLikely bug: the output dtype is not "
                                                   "the input dtype"),
    (check_rotary_attention, my_rotary_attention, "values", "the values are rotated too"),
    (check_rotary_attention, my_rotary_attention, "adjacent", r"the wrong pairing of dimensions: you turn adjacent "
                                                              r"pairs \(2i, 2i \+ 1\)"),
    (check_rotary_attention, my_rotary_attention, "backwards", "sin has the wrong sign, so the vectors rotate "
                                                               "backwards"),
    (check_rotary_attention, my_rotary_attention, "queries_only", "only the queries are rotated"),
    (check_rotary_attention, my_rotary_attention, "keys_only", "only the keys are rotated"),
    (check_rotary_attention, my_rotary_attention, "arange", r"the positions argument is ignored: you turn the "
                                                            r"tokens by torch.arange\(6\)"),
    (check_rotary_attention, my_rotary_attention, "freq_i", r"the frequencies are theta \*\* \(-i / head_dim\)"),
    (check_rotary_attention, my_rotary_attention, "layout_mixed", r"the wrong pairing of dimensions: cos and sin "
                                                                  r"are laid out for adjacent pairs"),
    (check_rotary_attention, my_rotary_attention, "freq_grow", "the frequencies grow instead of shrink"),
    (check_rotary_attention, my_rotary_attention, "no_rotation", "neither the queries nor the keys are rotated"),
    (check_rotary_attention, my_rotary_attention, "theta_ignored", "theta=100.*\nLikely bug: the theta argument is "
                                                                   "ignored: you use 10000"),
    (check_rotary_attention, my_rotary_attention, "no_mask", "no causal mask"),
    (check_rotary_attention, my_rotary_attention, "no_scale", r"the 1/sqrt\(head_dim\) scaling is missing"),
    (check_rotary_attention, my_rotary_attention, "in_place", r"changed the tensor it was given"),
    (check_grouped_query_attention, my_grouped_query_attention, "tile", "GQA repeating heads in the wrong order: .*"
                                                                         "expand the keys and the values with "
                                                                         r"repeat_interleave"),
    (check_grouped_query_attention, my_grouped_query_attention, "expand_reshape", "GQA repeating heads in the wrong "
                                                                                   "order"),
    (check_grouped_query_attention, my_grouped_query_attention, "tile_values", "GQA repeating heads in the wrong "
                                                                               "order: .*the values are expanded in "
                                                                               "the wrong order"),
    (check_grouped_query_attention, my_grouped_query_attention, "keys_only", "raised RuntimeError.*\nLikely bug: "
                                                                             "expand both the keys and the values"),
    (check_grouped_query_attention, my_grouped_query_attention, "group_from_kv",
     r"6 query heads on 2.*raised.*\nLikely bug: .*by the group size n_heads // n_kv_heads = 3"),
    (check_grouped_query_attention, my_grouped_query_attention, "no_mask", "no causal mask"),
    (check_grouped_query_attention, my_grouped_query_attention, "no_scale", r"the 1/sqrt\(head_dim\) scaling is "
                                                                            "missing"),
]

MODERN_CORRECT = [  # (check, correct code, what the one line must praise)
    (check_rms_norm, RMSNorm, "statistics in float32"),
    (check_rms_norm, make_rms_norm, "statistics in float32"),
    (check_rms_norm, make_torch_rms_norm, "statistics in float32"),
    (check_rotary_attention, reference_rotary_attention, "Rotary and rotate"),
    (check_rotary_attention, my_rotary_attention, "Rotary and rotate"),
    (check_grouped_query_attention, reference_grouped_query_attention, "h // group"),
    (check_grouped_query_attention, my_grouped_query_attention, "h // group"),
    (check_grouped_query_attention, my_grouped_query_einsum, "h // group"),
]


def learner(code, bug=None):
    if code.__name__.startswith("make_"):
        return code(bug)
    return code if bug is None else lambda *args, **kwargs: code(*args, bug=bug, **kwargs)


@pytest.mark.parametrize(("check", "code", "bug", "match"), MODERN_PLANTED,
                         ids=[f"{row[0].__name__}-{row[2]}" for row in MODERN_PLANTED])
def test_each_planted_bug_is_caught_and_named(check, code, bug, match):
    with pytest.raises(CheckFailed, match=match) as info:
        check(learner(code, bug))
    assert str(info.value).startswith(f"{check.__name__}: ") and "\nLikely bug: " in str(info.value)


@pytest.mark.parametrize(("check", "code", "praise"), MODERN_CORRECT,
                         ids=[f"{row[0].__name__}-{row[1].__name__}" for row in MODERN_CORRECT])
def test_each_check_passes_correct_code(check, code, praise, capsys):
    check(learner(code))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{check.__name__}: all ") and "checks passed" in lines[0] and praise in lines[0]


def test_the_checks_reject_what_is_not_the_learner_class_or_function():
    with pytest.raises(TypeError, match=r"expects your class, not an instance of it: call check_rms_norm\(RMSNorm\)"):
        check_rms_norm(RMSNorm(4))
    with pytest.raises(TypeError, match="expects a function such as my_rotary_attention.*got the class"):
        check_rotary_attention(RMSNorm)
    with pytest.raises(TypeError, match="expects a function such as my_grouped_query_attention"):
        check_grouped_query_attention(3)


def test_the_references_are_what_grouped_query_attention_computes():
    """The checks' two references, chained, give GroupedQueryAttention's output (out_proj set to the identity): rotary
    on q and k at the given positions, then query head h reading key/value head h // group."""
    cfg = ModernConfig(vocab_size=10, context_length=16, emb_dim=16, n_heads=4, n_kv_heads=2, drop_rate=0.0,
                       positions="rotary", rope_theta=500.0)
    torch.manual_seed(0)
    att = GroupedQueryAttention(cfg).double().eval()
    with torch.no_grad():
        att.out_proj.weight.copy_(torch.eye(16, dtype=torch.float64))
        att.out_proj.bias.zero_()
        x = torch.randn(2, 6, 16, dtype=torch.float64)
        positions = torch.tensor([0, 2, 3, 7, 8, 12])
        q, k, v = (rearrange(layer(x), "b t (h d) -> b h t d", d=4) for layer in (att.W_query, att.W_key, att.W_value))
        expected = rearrange(att(x, positions), "b t (h d) -> b h t d", d=4)
        both = reference_rotary_attention(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), positions,
                                          theta=500.0)
        assert torch.allclose(both, expected, atol=1e-6)
        att.rotary = None  # no rotation: the grouped-query reference alone
        assert torch.allclose(reference_grouped_query_attention(q, k, v),
                              rearrange(att(x, positions), "b t (h d) -> b h t d", d=4), atol=1e-12)

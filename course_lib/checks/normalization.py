"""The checks of the exercises in notebooks/03_layernorm.ipynb."""

import functools

import torch
from torch import Tensor

from course_lib.normalization import LayerNorm

from .core import Checker, build, check_unchanged, compare, isolated_rng, require_class


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
        # eps = 0.01 matters where the variance is small: a class that ignores its eps argument shows it here
        mine_eps = build(ck, learner_impl, emb_dim, 0.01, signature="MyLayerNorm(emb_dim, eps=1e-5)").double()
        ref_eps = LayerNorm(emb_dim, eps=0.01).double()
        x = 3.0 + 0.05 * torch.randn(2, 3, emb_dim, dtype=torch.float64)  # variance about 0.0025
        got = ck.call("forward of MyLayerNorm(6, eps=0.01)", mine_eps, x)
        compare(ck, got, ref_eps(x), [("your eps argument is ignored: MyLayerNorm(6, eps=0.01) normalises with "
                                       "eps 1e-5; store it (self.eps = eps) and use self.eps in forward",
                                       lambda: LayerNorm(emb_dim).double()(x))],
                "with eps=0.01 on rows of small variance", "divide by torch.sqrt(var + self.eps)")
    ck.done("Your LayerNorm matches course_lib's LayerNorm (and nn.LayerNorm).")

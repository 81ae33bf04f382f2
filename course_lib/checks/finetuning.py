"""The checks of the exercises in notebooks/14_finetuning.ipynb."""

import copy

import torch
from torch import Tensor, nn

from .core import Checker, build, compare, isolated_rng, require_class

SIGNATURE = "MyLoRALinear(linear, r, alpha)"


def adapter_parameters(ck: Checker, mine: nn.Module, r: int, d_in: int, d_out: int) -> tuple[Tensor, Tensor]:
    """The learner's lora_A (r, in) and lora_B (out, r), or a failure that names a missing or transposed one."""
    A, B = getattr(mine, "lora_A", None), getattr(mine, "lora_B", None)
    if not isinstance(A, nn.Parameter) or not isinstance(B, nn.Parameter):
        ck.fail("your layer has no nn.Parameter attributes lora_A and lora_B",
                "store the adapters as self.lora_A = nn.Parameter(...) and self.lora_B = nn.Parameter(...)")
    for name, p, shape, wrong, text in (("lora_A", A, (r, d_in), (d_in, r), "(r, in_features)"),
                                        ("lora_B", B, (d_out, r), (r, d_out), "(out_features, r)")):
        if tuple(p.shape) != shape:
            bug = f"{name} is transposed: it has shape {text}" if tuple(p.shape) == wrong else f"{name} is {text}"
            ck.fail(f"for nn.Linear({d_in}, {d_out}) and r = {r}, {name} has shape {tuple(p.shape)}, expected "
                    f"{shape}", bug + ", like nn.Linear's (out_features, in_features) layout")
    ck.ok()
    return A, B


def frozen_weight(ck: Checker, mine: nn.Module, d_in: int, d_out: int) -> Tensor:
    """The one frozen parameter of shape (out, in): the wrapped layer's weight."""
    found = [p for p in mine.parameters() if tuple(p.shape) == (d_out, d_in) and not p.requires_grad]
    if len(found) != 1:
        ck.fail(f"your layer holds {len(found)} frozen parameters of the wrapped weight's shape {(d_out, d_in)}, "
                "expected exactly 1", "keep the nn.Linear you are given as a submodule (self.linear = linear), so its "
                "weight stays part of your layer, and freeze it rather than copying it")
    return found[0]


def check_frozen(ck: Checker, mine: nn.Module) -> None:
    trainable = sorted(name for name, p in mine.named_parameters() if p.requires_grad)
    if {"lora_A", "lora_B"} - set(trainable):
        ck.fail(f"only {trainable} of your parameters are trainable",
                "lora_A and lora_B are what LoRA trains: leave requires_grad=True on them (nn.Parameter's default)")
    if len(trainable) > 2:
        ck.fail(f"the wrapped layer's parameters {[n for n in trainable if not n.startswith('lora_')]} are still "
                "trainable", "the base weight is not frozen: call linear.requires_grad_(False) (weight and bias), so "
                "only lora_A and lora_B train")
    ck.ok()


def check_start(ck: Checker, mine: nn.Module, A: Tensor, B: Tensor, base: nn.Linear, x: Tensor) -> None:
    """B zero and A not, so the layer starts as the one it wraps and B gets a gradient at the first step."""
    if bool((B != 0).any()):
        ck.fail("lora_B is not zero at the start, so your layer does not start as the pretrained layer it wraps",
                "B not zero at the start: create lora_B with torch.zeros (and lora_A at random, not the other way "
                "round), so that B A = 0 before training")
    if not bool((A != 0).any()):
        ck.fail("lora_A and lora_B are both zero at the start: their gradients are zero too, so neither ever moves",
                "initialise lora_A at random (e.g. uniform in +-1 / sqrt(in_features)); only B starts at zero")
    ck.ok()
    compare(ck, ck.call("forward at the start", mine, x), base(x), [], "at the start (B = 0)",
            "with B = 0 your layer must return exactly linear(x), the output of the layer it wraps")


def scale_variants(base: nn.Linear, x: Tensor, A: Tensor, B: Tensor, r: int, alpha: float):
    path = x @ A.T @ B.T  # (..., out)
    return [
        ("the scale alpha / r is forgotten: multiply the low-rank path x A^T B^T by alpha / r", lambda: base(x) + path),
        ("the scale is upside down: r / alpha instead of alpha / r", lambda: base(x) + (r / alpha) * path),
        ("the scale is alpha, not alpha / r", lambda: base(x) + alpha * path),
        ("the scale is 1 / r, not alpha / r", lambda: base(x) + path / r),
        ("the scale is alpha * r, not alpha / r", lambda: base(x) + alpha * r * path),
        ("the low-rank path is subtracted: add (alpha / r) x A^T B^T to the frozen layer's output",
         lambda: base(x) - (alpha / r) * path),
        ("the frozen layer's output is missing: return linear(x) + (alpha / r) x A^T B^T",
         lambda: (alpha / r) * path),
    ]


def merge_variants(W: Tensor, A: Tensor, B: Tensor, scale: float):
    update = B @ A  # (out, in)
    return [
        ("merge with the wrong sign: merge() must add (alpha / r) B A to the weight, not subtract it",
         lambda: W - scale * update),
        ("merge with the transpose: B @ A already has the weight's shape (out_features, in_features), add it "
         "without .T", lambda: W + scale * update.T),
        ("the scale is forgotten in merge(): add (alpha / r) B A, not B A", lambda: W + update),
        ("merge() did not change the weight: add into it in place, under torch.no_grad() "
         "(self.linear.weight += ...)", lambda: W),
    ]


def set_adapters(mine: nn.Module, A: Tensor, B: Tensor, like: Tensor) -> tuple[Tensor, Tensor]:
    """Give the learner's adapters random values (training would), so the low-rank path is not zero."""
    with torch.no_grad():
        A.copy_(torch.randn(A.shape, dtype=like.dtype))
        B.copy_(torch.randn(B.shape, dtype=like.dtype))
    return A.detach().clone(), B.detach().clone()


def check_gradients(ck: Checker, mine: nn.Module, A: Tensor, B: Tensor, x: Tensor) -> None:
    mine.zero_grad()
    out = ck.call("forward", mine, x)
    if not out.requires_grad:
        ck.fail("your output does not depend on lora_A and lora_B for autograd, so lora_A gets no gradient",
                "compute the low-rank path from the parameters themselves, not under torch.no_grad() or from "
                ".detach()ed copies")
    ck.call("backward through your layer", lambda: out.square().sum().backward())
    for name, p in (("lora_A", A), ("lora_B", B)):
        if p.grad is None or not bool((p.grad != 0).any()):
            ck.fail(f"{name} gets no gradient", "compute the low-rank path from the parameters themselves, not under "
                    "torch.no_grad() or from .detach()ed copies")
    ck.ok()
    mine.zero_grad()


def check_merge(ck: Checker, mine: nn.Module, base: nn.Linear, x: Tensor, r: int, alpha: float, shape: str) -> None:
    """merge() adds (alpha / r) B A to the frozen weight and forward stops adding the path; unmerge() undoes it."""
    d_out, d_in = base.weight.shape
    A, B = adapter_parameters(ck, mine, r, d_in, d_out)
    A0, B0 = set_adapters(mine, A, B, base.weight)
    weight = frozen_weight(ck, mine, d_in, d_out)
    W = weight.detach().clone()
    expected = base(x) + (alpha / r) * (x @ A0.T @ B0.T)
    for method in ("merge", "unmerge"):
        if not callable(getattr(mine, method, None)):
            ck.fail(f"your layer has no {method}() method", f"add def {method}(self) to your class")
    ck.call(f"merge() on a {shape} layer", mine.merge,
            bug="merge with the transpose: B @ A already has the weight's shape (out_features, in_features)")
    compare(ck, weight.detach(), W + (alpha / r) * (B0 @ A0), merge_variants(W, A0, B0, alpha / r),
            f"after merge() on a {shape} layer, the weight", "merge() must set W <- W + (alpha / r) B A")
    twice = [("after merge() your forward still adds the low-rank path, so the update counts twice: skip it once "
              "merged (keep a flag such as self.merged)", lambda: expected + (alpha / r) * (x @ A0.T @ B0.T))]
    compare(ck, ck.call("forward after merge()", mine, x), expected, twice,
            f"after merge() on a {shape} layer, the output", "a merged layer must compute what the unmerged one did")
    ck.call("unmerge()", mine.unmerge)
    compare(ck, weight.detach(), W, [("unmerge() adds the update again: it must subtract (alpha / r) B A",
                                      lambda: W + 2 * (alpha / r) * (B0 @ A0))],
            f"after merge() and unmerge() on a {shape} layer, the weight", "unmerge() must restore the original weight")
    compare(ck, ck.call("forward after unmerge()", mine, x), expected,
            [("after unmerge() your forward no longer adds the low-rank path: reset the merged flag in unmerge()",
              lambda: base(x))],
            f"after unmerge() on a {shape} layer, the output", "an unmerged layer adds the low-rank path again")


@isolated_rng
def check_lora_linear(learner_impl) -> None:
    """Check `learner_impl`, the LoRA layer of notebook 14.

    learner_impl(linear, r, alpha) wraps an existing nn.Linear: it freezes it, holds nn.Parameters lora_A of shape
    (r, in_features) (random) and lora_B of shape (out_features, r) (zeros), and forward(x) returns
    linear(x) + (alpha / r) * x A^T B^T. merge() adds (alpha / r) B A into the wrapped weight (forward then skips the
    path) and unmerge() takes it out. Compared with course_lib.finetuning.LoRALinear's formulas, in float64."""
    ck = Checker("check_lora_linear")
    require_class(ck, learner_impl, SIGNATURE)
    r, alpha, d_in, d_out = 2, 6, 6, 5  # scale 3: distinct from 1, r / alpha, alpha, 1 / r and alpha * r
    for shape, (n_in, n_out) in (("6 -> 5", (d_in, d_out)), ("square 5 -> 5", (d_out, d_out))):
        linear = nn.Linear(n_in, n_out)
        base = copy.deepcopy(linear).double().requires_grad_(False)  # the reference, never given to the learner
        mine = build(ck, learner_impl, linear, r, alpha, signature=SIGNATURE).double()
        x = torch.randn(2, 3, n_in, dtype=torch.float64)  # (batch, tokens, in_features)
        A, B = adapter_parameters(ck, mine, r, n_in, n_out)
        check_frozen(ck, mine)
        check_start(ck, mine, A, B, base, x)
        A0, B0 = set_adapters(mine, A, B, base.weight)
        with torch.no_grad():
            compare(ck, ck.call("forward", mine, x), base(x) + (alpha / r) * (x @ A0.T @ B0.T),
                    scale_variants(base, x, A0, B0, r, alpha), f"on a {shape} layer with nonzero A and B",
                    "forward must return linear(x) + (alpha / r) * x @ A.T @ B.T")
        check_gradients(ck, mine, A, B, x)
        check_merge(ck, mine, base, x, r, alpha, shape)
    ck.done("Your LoRA layer starts as the layer it wraps, trains only A and B, and merges exactly.")

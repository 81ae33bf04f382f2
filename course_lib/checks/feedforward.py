"""The checks of the exercises in notebooks/04_gelu_feedforward.ipynb."""

import inspect
import math

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.config import GPTConfig
from course_lib.feedforward import GELU, FeedForward

from .core import (Checker, build, check_unchanged, compare, isolated_rng, linear_layers, require_class,
                   require_function)


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
    lin1, lin2 = ref.fc, ref.proj
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

"""What the exercise checks share: failure messages, seeded random numbers, building the learner's module, and
comparing its output with the reference while naming the known mistake that explains a difference."""

import functools
import inspect
import math

import torch
from torch import Tensor, nn

from course_lib.config import GPTConfig


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


def first_matching_bug(got, variants, matches):
    """The first known mistake in `variants`, pairs (bug, make_output), whose output explains `got`, as
    matches(got, make_output()) decides; None when none does. Every check names a likely bug this way."""
    for bug, make in variants:
        try:
            candidate = make()
        except Exception:  # a variant that cannot be computed for this input cannot be the explanation
            continue
        if matches(got, candidate):
            return bug
    return None


def table_variants(bugs: dict, variant):
    """The (bug, make_output) pairs of a table {layout: bug}, where make_output() is variant(layout)."""
    return [(bug, functools.partial(variant, layout)) for layout, bug in bugs.items()]


def compare(ck: Checker, got, expected: Tensor, variants, situation: str, fallback: str,
            atol: float = 1e-6, rtol: float = 1e-5) -> None:
    """Pass when got matches expected. Otherwise fail, naming the first known mistake (bug, make_output)
    in `variants` whose output got matches (first_matching_bug), or describing the difference and giving
    `fallback`."""
    if isinstance(got, tuple):
        ck.fail(f"{situation}, your code returned a tuple of {len(got)} items instead of one tensor",
                "return only the output tensor (not extra values such as the attention weights)")
    if not isinstance(got, Tensor):
        ck.fail(f"{situation}, your code returned a {type(got).__name__} instead of a torch.Tensor",
                "return the tensor itself (no .tolist(), .item() or numpy conversion)")
    if close(got, expected, atol, rtol):
        ck.ok()
        return
    bug = first_matching_bug(got, variants, lambda mine, candidate: close(mine, candidate, atol, rtol))
    ck.fail(f"{situation}, {describe_difference(got, expected)}.", fallback if bug is None else bug)


def check_unchanged(ck: Checker, before: Tensor, after: Tensor, what: str) -> None:
    if not torch.equal(before, after):
        ck.fail(f"your {what} changed the tensor it was given",
                "an in-place operation on the input (x *= ..., x.mul_(...), logits[...] = ..., "
                "masked_fill_): compute a new tensor instead, e.g. x = x * 2 or logits.masked_fill(...)")
    ck.ok()


def linear_layers(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


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


def random_model(drop_rate: float = 0.3, context_length: int = 8, vocab_size: int = 20):
    """A small GPTModel in float64 with large random weights (std 0.5), so that its next-token choices vary and
    no two logits come close: greedy decoding and beam search on it have one right answer. In training mode."""
    from course_lib.model import GPTModel  # here, not at the top: the lesson modules import guards, not checks

    cfg = GPTConfig(vocab_size=vocab_size, context_length=context_length, emb_dim=8, n_heads=2, n_layers=1,
                    drop_rate=drop_rate, qkv_bias=False)
    model = GPTModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.5)
    return model.double().train()


def decode_deterministically(ck: Checker, model: nn.Module, run, what: str):
    """run() twice from different random states, the model in training mode as a freshly built one is. Two
    different answers are dropout left on (the answers agree once the model is in eval mode) or sampling."""
    model.train()
    answers = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        answers.append(run())
    same = lambda a, b: isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and torch.equal(a, b)  # noqa: E731
    if same(*answers):
        return answers[0]
    model.eval()
    again = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        again.append(run())
    model.train()
    if same(*again):
        ck.fail(f"{what} gives different tokens on two calls while the model is in training mode",
                "the model is left in training mode, so dropout changes the logits at every call: decode under "
                "model.eval() (and torch.no_grad()), as generate does with eval_mode(model)")
    ck.fail(f"{what} gives different tokens on two calls, even in eval mode",
            "the next token is sampled (torch.multinomial): greedy decoding and beam search take the most likely "
            "token, logits.argmax(dim=-1) or topk")


def check_decoded(ck: Checker, got: Tensor, expected: Tensor, token_ids: Tensor, max_new_tokens: int, variants,
                  situation: str, fallback: str) -> None:
    """Compare decoded ids (batch, prompt + new) with the reference, naming a wrong shape, a changed prompt or the
    first known mistake in variants (bug, make_ids)."""
    prompt = token_ids.shape[1]
    if got.dim() != 2 or got.shape[0] != expected.shape[0]:
        ck.fail(f"{situation}, you returned shape {tuple(got.shape)}, expected {tuple(expected.shape)}",
                "return the ids as (batch, prompt + new), one row per prompt")
    if got.shape[1] == max_new_tokens and got.shape[1] != expected.shape[1]:
        ck.fail(f"{situation}, you returned {got.shape[1]} ids per row, the new ones only",
                "return the prompt followed by the new ids, torch.cat([token_ids, next_ids], dim=1), as generate does")
    if got.shape[1] != expected.shape[1]:
        ck.fail(f"{situation}, you returned {got.shape[1]} ids per row, expected {expected.shape[1]} "
                f"(a prompt of {prompt} and {max_new_tokens} new)",
                "off by one in the number of steps: add exactly max_new_tokens ids, for _ in range(max_new_tokens)")
    if not torch.equal(got[:, :prompt].long().cpu(), token_ids.long().cpu()):
        ck.fail(f"{situation}, your rows do not start with the prompt",
                "keep the prompt as it is at the start of each row and append the new ids after it")
    compare(ck, got.long(), expected.long(), variants, situation, fallback, atol=0, rtol=0)


ANSWER_SIZE = "COURSE_ANSWER_SIZE"  # "small" under the tests (conftest.py sets it), unset for a learner


def answer_size(full, small):
    """The size a worked answer runs at: `full` when a learner runs it, `small` under the tests.

    An answer whose full run takes more than a few seconds reads its size (steps, runs, a length) from this one
    call. conftest.py sets COURSE_ANSWER_SIZE=small for the test session and for tools/refresh_notebooks.py, so
    nbval runs the answer's code at the small size and compares the form of its output; the full-size figures the
    answer quotes come from `python tools/answer_figures.py`, which runs it at `full` and stores what it printed in
    docs/answer_figures.json, where tests/test_answers.py compares them with the answer's text."""
    import os

    setting = os.environ.get(ANSWER_SIZE, "full")
    if setting not in ("full", "small"):
        raise ValueError(f"{ANSWER_SIZE}={setting!r}: set it to 'full' (the answer's own size) or 'small' (the "
                         f"tests' size), or unset it")
    return small if setting == "small" else full

"""The checks of the exercises in notebooks/15_alignment.ipynb."""

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from course_lib.alignment import dpo_loss, group_advantages, grpo_loss

from .core import Checker, check_unchanged, close, compare, first_matching_bug, isolated_rng, require_function


def one_number(ck: Checker, got, situation: str, many: str):
    """The learner's loss as a 0-d tensor. A tuple, a Python number or several losses fail with their cause (`many`
    says what several losses mean); a 1-element tensor is accepted as the number it holds."""
    if isinstance(got, tuple):
        ck.fail(f"{situation}, your code returned a tuple of {len(got)} items instead of the loss",
                "return the loss alone, one 0-d tensor (no extra values such as rewards or statistics)")
    if isinstance(got, (float, int)):
        ck.fail(f"{situation}, you return a Python number ({got:.4g})",
                "the loss is turned into a number with .item() or float(...), so loss.backward() cannot work: "
                "return the tensor")
    if isinstance(got, Tensor) and got.numel() > 1:
        ck.fail(f"{situation}, your loss has shape {tuple(got.shape)}, expected one number (a 0-d tensor)", many)
    if isinstance(got, Tensor) and got.dim() > 0 and got.numel() == 1:
        got = got.reshape(())
    return got


def gradients(loss: Tensor, leaves: list[Tensor]) -> list[Tensor]:
    """d loss / d leaf for each leaf, zeros where the loss does not reach it."""
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return [torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, grads)]


def check_gradients(ck: Checker, got: Tensor, expected: Tensor, leaves: dict, situation: str, detached: str,
                    variants=(), atol: float = 1e-9, rtol: float = 1e-6) -> None:
    """The gradient of the learner's loss with respect to each of `leaves` ({name: tensor that requires grad})
    equals the reference's. No gradient at all fails with `detached`; a wrong one names the first known mistake of
    `variants`, (bug, make_loss) pairs whose loss is built from the same leaves."""
    names, tensors = list(leaves), list(leaves.values())
    if not got.requires_grad:
        ck.fail(f"{situation}, your loss has the right value but no gradient: backward() cannot reach "
                f"{' or '.join(names)}", detached)
    mine, theirs = gradients(got, tensors), gradients(expected, tensors)
    for name, g, ref in zip(names, mine, theirs):
        if not bool((g != 0).any()) and bool((ref != 0).any()):
            ck.fail(f"{situation}, no gradient reaches {name}",
                    f"{name} is detached on its way to the loss (.detach(), .item(), torch.tensor(...), "
                    "torch.no_grad()): compute the loss from it with torch operations")
    same = lambda a, b: all(close(x, y, atol, rtol) for x, y in zip(a, b))  # noqa: E731
    if not same(mine, theirs):
        bug = first_matching_bug(mine, [(b, lambda make=make: gradients(make(), tensors)) for b, make in variants],
                                 same)
        ck.fail(f"{situation}, your loss has the right value but its gradient with respect to {' and '.join(names)} "
                "differs from the reference's", bug or "part of the loss is computed from detached values "
                "(.detach(), .item(), torch.no_grad()) or from a copy of the inputs: build every term from them "
                "with torch operations")
    ck.ok()


# ------------------------------------------------------------------------------------------------------- DPO

DPO_SIGNATURE = "my_dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)"
DPO_FALLBACK = ("margin = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)); "
                "return -F.logsigmoid(margin).mean()")
DPO_OVERFLOW = ("log(sigmoid(.)) in two steps overflows for large margins: use F.logsigmoid. In float32 "
                "torch.sigmoid(-200.) rounds to 0 and log(0) is -inf (log(1 + exp(-x)) overflows the same way, "
                "exp(200.) is inf); -F.logsigmoid(margin) (or F.softplus(-margin)) is computed in one stable step")


def reference_dpo_loss(policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor,
                       beta: float) -> Tensor:
    """The DPO loss alone, without the implicit rewards course_lib.alignment.dpo_loss also returns."""
    return dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)[0]


def dpo_inputs(pairs: int, dtype: torch.dtype, beta: float, margins=None) -> list[Tensor]:
    """policy_chosen, policy_rejected, ref_chosen, ref_rejected: (pairs,) sequence log-probs, each a sum over a
    reply's tokens and so tens of nats below 0. The policy sits a few nats from the reference; with `margins`
    given, beta * (chosen log-ratio - rejected log-ratio) is those numbers instead."""
    base = -600.0 if margins else -40.0  # margins of hundreds of nats need replies hundreds of nats long
    ref_chosen = base + 10 * torch.rand(pairs, dtype=torch.float64)
    ref_rejected = ref_chosen - 5 * torch.rand(pairs, dtype=torch.float64)
    policy_rejected = ref_rejected + 5 * torch.randn(pairs, dtype=torch.float64)
    if margins:
        policy_chosen = ref_chosen + (policy_rejected - ref_rejected) + torch.tensor(margins) / beta
    else:
        policy_chosen = ref_chosen + 5 * torch.randn(pairs, dtype=torch.float64)
    return [t.to(dtype) for t in (policy_chosen, policy_rejected, ref_chosen, ref_rejected)]


def dpo_variants(pc: Tensor, pr: Tensor, rc: Tensor, rr: Tensor, beta: float):
    """The known mistakes of the DPO loss, as (bug, make_output) pairs."""
    logratios = (pc - rc) - (pr - rr)  # (pairs,): chosen log-ratio minus rejected log-ratio

    def loss(margin, reduce=torch.mean):
        return reduce(-F.logsigmoid(margin))

    return [
        ("the reference log-probs are left out: the margin compares log-ratios to the reference, beta * "
         "((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)), not beta * (policy_chosen - "
         "policy_rejected)", lambda: loss(beta * (pc - pr))),
        ("the reference log-probs are added instead of subtracted: each reply's log-ratio is log(pi / ref) = "
         "policy - ref", lambda: loss(beta * ((pc + rc) - (pr + rr)))),
        ("chosen and rejected are swapped, so the sign of the margin is flipped (swapping policy and reference "
         "does the same): the loss must fall as the chosen reply's log-ratio rises, margin = beta * "
         "((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))", lambda: loss(-beta * logratios)),
        ("beta is applied outside the log-sigmoid, -beta * logsigmoid(...): it scales the log-ratios inside it, "
         "-F.logsigmoid(beta * (chosen_logratio - rejected_logratio))", lambda: beta * loss(logratios)),
        ("beta is missing: multiply the difference of the log-ratios by beta inside the log-sigmoid",
         lambda: loss(logratios)),
        *[(f"the beta argument is ignored: you use {b:g} where the call passes beta={beta:g}",
           lambda b=b: loss(b * logratios)) for b in (0.1, 0.5, 0.05, 0.2) if b != beta],
        ("the losses are summed over the pairs instead of averaged: take .mean() over the pairs",
         lambda: loss(beta * logratios, torch.sum)),
        ("the minus sign is missing: the loss is -log sigmoid(margin), positive, and it falls as the margin grows",
         lambda: -loss(beta * logratios)),
        ("the log is missing: the loss is -log sigmoid(margin), -F.logsigmoid(margin), not -sigmoid(margin)",
         lambda: (-torch.sigmoid(beta * logratios)).mean()),
        ("only the chosen reply's log-ratio enters the margin: subtract the rejected reply's, "
         "(policy_rejected - ref_rejected)", lambda: loss(beta * (pc - rc))),
    ]


@isolated_rng
def check_dpo_loss(learner_impl) -> None:
    """Check `learner_impl(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)`, the DPO loss of
    notebook 15.

    The four arguments are (pairs,) sequence log-probs of the chosen and the rejected replies under the policy and
    the frozen reference; beta > 0. Must return one number, a 0-d tensor that backward() can use: the mean over the
    pairs of -logsigmoid(beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))), finite for any
    margin, with the gradient of course_lib.alignment.dpo_loss with respect to the policy's log-probs."""
    ck = Checker("check_dpo_loss")
    require_function(ck, learner_impl, DPO_SIGNATURE)
    big = [-200.0, -120.0, 2.0, 90.0, -0.5, 250.0]
    cases = [(6, 0.1, torch.float64, None, "for 6 pairs and beta=0.1"),
             (4, 0.5, torch.float64, None, "for 4 pairs and beta=0.5"),
             (6, 0.5, torch.float32, big, f"for float32 log-probs of 6 pairs whose margins beta * (...) are {big}")]
    for pairs, beta, dtype, margins, situation in cases:
        pc, pr, rc, rr = dpo_inputs(pairs, dtype, beta, margins)
        before = [t.clone() for t in (pc, pr, rc, rr)]
        given = [pc.clone().requires_grad_(True), pr.clone().requires_grad_(True), rc.clone(), rr.clone()]
        got = ck.call(f"{DPO_SIGNATURE.split('(')[0]} {situation}", learner_impl, *given, beta,
                      bug=f"the function must take the lesson's arguments, {DPO_SIGNATURE}: four (pairs,) tensors "
                      "and a number")
        for name, old, new in zip(("policy_chosen", "policy_rejected", "ref_chosen", "ref_rejected"), before, given):
            check_unchanged(ck, old, new.detach(), f"function ({name})")
        got = one_number(ck, got, situation, "you return one loss per pair: average them over the pairs, "
                         "-F.logsigmoid(margin).mean()")
        if margins and isinstance(got, Tensor) and not bool(torch.isfinite(got).all()):
            ck.fail(f"{situation}, your loss is {got.item()}", DPO_OVERFLOW)
        expected = reference_dpo_loss(*given, beta)
        with torch.no_grad():
            variants = dpo_variants(pc, pr, rc, rr, beta)
        tolerance = {"atol": 1e-3, "rtol": 1e-4} if dtype == torch.float32 else {}
        compare(ck, got, expected, variants, situation, DPO_FALLBACK, **tolerance)
        check_gradients(ck, got, expected, {"policy_chosen": given[0], "policy_rejected": given[1]}, situation,
                        "the policy's log-probs are detached (.detach(), .item(), torch.tensor(...) or "
                        "torch.no_grad()), so the loss cannot train the policy: compute it from policy_chosen and "
                        "policy_rejected with torch operations",
                        **({"atol": 1e-6, "rtol": 1e-4} if dtype == torch.float32 else {}))
    ck.done("Your DPO loss matches course_lib's dpo_loss: -logsigmoid(beta * margin), averaged over the pairs, "
            "finite for any margin.")


# ------------------------------------------------------------------------------------------------ group advantages

ADV_SIGNATURE = "my_group_advantages(rewards, group_size)"
ADV_FALLBACK = ("groups = rewards.view(-1, group_size); return ((groups - groups.mean(dim=1, keepdim=True)) / "
                "(groups.std(dim=1, keepdim=True) + 1e-4)).flatten()")


def advantage_variant(rewards: Tensor, group_size: int, layout: str = "rows", center: str = "group",
                      spread: str = "sample", eps: float = 1e-4, root: bool = False, sign: float = 1.0) -> Tensor:
    """Group advantages with one deliberate choice: which rewards form a group (rows: consecutive ones; strided:
    rewards.view(group_size, -1).T, every prompts-th one, the result flattened in that order; strided_back: the same
    put back in place; columns: statistics over dim=0 of rewards.view(-1, group_size)), whose mean is subtracted
    (the group's or the batch's), which spread divides (sample, population, the batch's, none), eps and whether it
    goes inside the square root, and the sign."""
    if layout == "rows":
        groups = rewards.view(-1, group_size)  # (prompts, group_size)
    elif layout in ("strided", "strided_back"):
        groups = rewards.view(group_size, -1).T  # (prompts, group_size), group p = rewards[p::prompts]
    else:
        groups = rewards.view(-1, group_size).T  # (group_size, prompts): one "group" per position
    mean = groups.mean(dim=1, keepdim=True) if center == "group" else rewards.mean()
    var = {"sample": lambda: groups.var(dim=1, keepdim=True),
           "population": lambda: groups.var(dim=1, keepdim=True, unbiased=False),
           "batch": lambda: rewards.var(), "none": lambda: None}[spread]()
    if var is None:
        out = groups - mean
    elif root:
        out = (groups - mean) / (var + eps).sqrt()
    else:
        out = (groups - mean) / (var.sqrt() + eps)
    out = sign * out
    return out.flatten() if layout in ("rows", "strided") else out.T.flatten()


def advantage_variants(rewards: Tensor, group_size: int):
    """The known mistakes of group advantages, as (bug, make_output) pairs."""
    v = functools.partial(advantage_variant, rewards, group_size)
    strided = ("the groups are read as strided: rewards.view(group_size, -1).T puts every prompts-th reward in one "
               "group, but the group_size completions of one prompt are consecutive; use rewards.view(-1, "
               "group_size), one row per prompt")
    return [
        ("the batch-wide mean instead of the group's mean: each reward is compared with the other completions of "
         "its own prompt, groups.mean(dim=1, keepdim=True)", lambda: v(center="batch")),
        ("the whole batch's mean and std instead of the group's: normalise each group by its own statistics, "
         "groups.mean(dim=1, keepdim=True) and groups.std(dim=1, keepdim=True)",
         lambda: v(center="batch", spread="batch")),
        ("the std of the whole batch instead of the group's: divide by groups.std(dim=1, keepdim=True) + eps",
         lambda: v(spread="batch")),
        ("the advantages are not divided by the std: return (r - group mean) / (group std + 1e-4)",
         lambda: v(spread="none")),
        ("the population std (unbiased=False, divided by group_size) instead of the sample std: use torch.std's "
         "default, groups.std(dim=1, keepdim=True), divided by group_size - 1 as TRL does",
         lambda: v(spread="population")),
        ("eps inside the square root, sqrt(var + eps): add it to the std, outside the root, (std + 1e-4)",
         lambda: v(root=True)),
        ("the population std (unbiased=False) with eps inside the square root, LayerNorm's way: use the sample "
         "std, groups.std(dim=1, keepdim=True), plus 1e-4 outside the root", lambda: v(spread="population", root=True)),
        ("eps is missing: a group whose rewards are all equal has std 0, and 0 / 0 is NaN; divide by "
         "(std + 1e-4)", lambda: v(eps=0.0)),
        *[(f"eps is {e:g} instead of 1e-4: divide by (std + 1e-4)", lambda e=e: v(eps=e))
          for e in (1e-8, 1e-6, 1e-5, 1e-3)],
        (strided, lambda: v(layout="strided")),
        (strided, lambda: v(layout="strided_back")),
        ("the mean and std are taken over dim=0 of rewards.view(-1, group_size), across the prompts: a group is "
         "one row, so reduce over dim=1", lambda: v(layout="columns")),
        ("the sign is flipped: the advantage is reward minus the group's mean, so the better completions get the "
         "positive advantages", lambda: v(sign=-1.0)),
        *[(f"the group_size argument is ignored: you group the rewards by {g} where the call passes "
           f"group_size={group_size}", lambda g=g: advantage_variant(rewards, g))
          for g in (2, 4, 8) if g != group_size and rewards.numel() % g == 0],
    ]


@isolated_rng
def check_group_advantages(learner_impl) -> None:
    """Check `learner_impl(rewards, group_size)`, the group-relative advantages of notebook 15.

    rewards: (completions,) floats, the group_size completions of each prompt consecutive. Must return
    (completions,): each reward minus the mean of its group, divided by the group's sample standard deviation
    (torch.std's default) plus 1e-4, so that a group of equal rewards gets exactly 0, like
    course_lib.alignment.group_advantages."""
    ck = Checker("check_group_advantages")
    require_function(ck, learner_impl, ADV_SIGNATURE)
    zero_one = torch.tensor([1, 0, 0, 1, 1, 0, 0, 0, *[1] * 8, 0, 0, 0, 0, 0, 0, 0, 1], dtype=torch.float64)
    offsets = torch.tensor([[-2.0], [0.5], [3.0]], dtype=torch.float64)
    cases = [(zero_one, 8, "for 0/1 rewards of 3 prompts x 8 completions, the second prompt's rewards all "
                           "1 (its advantages must be 0)"),
             ((torch.randn(3, 4, dtype=torch.float64) + offsets).flatten(), 4,
              "for rewards of 3 prompts x 4 completions whose groups have means about -2, 0.5 and 3"),
             ((0.01 * torch.randn(4, 2, dtype=torch.float64) + torch.tensor([[0.2], [0.4], [0.6], [0.9]],
                                                                             dtype=torch.float64)).flatten(), 2,
              "for 4 prompts x 2 completions whose rewards differ by about 0.01 (where eps counts)")]
    with torch.no_grad():
        for rewards, group_size, situation in cases:
            given = rewards.clone()
            got = ck.call(f"{ADV_SIGNATURE.split('(')[0]} {situation}", learner_impl, given, group_size,
                          bug=f"the function must take the lesson's arguments, {ADV_SIGNATURE}, and group the "
                          "rewards by group_size: rewards.view(-1, group_size)")
            check_unchanged(ck, rewards, given, "function")
            expected = group_advantages(rewards, group_size)
            if isinstance(got, Tensor) and got.dim() == 2 and got.numel() == rewards.numel():
                ck.fail(f"{situation}, your advantages have shape {tuple(got.shape)}, expected "
                        f"({rewards.numel()},), one per completion",
                        "you return (prompts, group_size) instead of flat: flatten the groups back to "
                        "(completions,), ((groups - mean) / (std + 1e-4)).flatten()")
            groups = rewards.view(-1, group_size)
            equal = (groups == groups[:, :1]).all(dim=1, keepdim=True).expand_as(groups).flatten()
            if isinstance(got, Tensor) and got.shape == expected.shape and bool(got[equal].isnan().any()):
                ck.fail(f"{situation}, your advantages are NaN for the group whose rewards are all equal",
                        "eps is missing: that group's std is 0, and (r - mean) / std is 0 / 0; divide by "
                        "(std + 1e-4), eps outside the square root, so that the group gets exactly 0")
            compare(ck, got, expected, advantage_variants(rewards, group_size), situation, ADV_FALLBACK)
    ck.done("Your advantages match course_lib's group_advantages: each group's own mean and sample std, 1e-4 "
            "added outside the root.")


# ------------------------------------------------------------------------------------------------------- GRPO

GRPO_SIGNATURE = "my_grpo_loss(logps, old_logps, ref_logps, advantages, mask, beta, epsilon)"
GRPO_FALLBACK = ("ratio = torch.exp(logps - old_logps); A = advantages[:, None]; per_token = -torch.min(ratio * A, "
                 "ratio.clamp(1 - epsilon, 1 + epsilon) * A) + beta * (torch.exp(ref_logps - logps) - (ref_logps - "
                 "logps) - 1); return ((per_token * mask).sum(dim=1) / mask.sum(dim=1)).mean()")


def reference_grpo_loss(logps: Tensor, old_logps: Tensor, ref_logps: Tensor, advantages: Tensor, mask: Tensor,
                        beta: float, epsilon: float) -> Tensor:
    """The GRPO paper's loss: course_lib.alignment.grpo_loss with each completion's token mean and the k3 penalty
    not weighted by the ratio."""
    return grpo_loss(logps, old_logps, ref_logps, advantages, mask, beta, epsilon, "grpo", kl_correction=False)


def grpo_inputs(lengths: list[int], starts: list[int], tokens: int, signs: list[float]) -> list[Tensor]:
    """logps, old_logps, ref_logps (batch, tokens), advantages (batch,) and the int64 mask (batch, tokens) of
    completions of the given lengths, starting after a prompt. In every row the ratio pi / pi_old is exp(0.4) and
    exp(-0.45) at the first two completion tokens, outside [0.7, 1.3], so that clipping acts on both sides for the
    positive and the negative advantages; elsewhere it is near 1. Outside the mask the numbers are as random as
    inside: a loss must ignore them."""
    batch = len(lengths)
    mask = torch.zeros(batch, tokens, dtype=torch.int64)
    log_ratio = 0.1 * torch.randn(batch, tokens, dtype=torch.float64)
    for row, (start, length) in enumerate(zip(starts, lengths)):
        mask[row, start:start + length] = 1
        log_ratio[row, start:start + 2] = torch.tensor([0.4, -0.45] if row % 2 else [-0.45, 0.4])
    old_logps = -0.05 - 3 * torch.rand(batch, tokens, dtype=torch.float64)
    logps = old_logps + log_ratio
    ref_logps = logps + 2 * torch.rand(batch, tokens, dtype=torch.float64) - 1
    advantages = (0.5 + torch.rand(batch, dtype=torch.float64)) * torch.tensor(signs, dtype=torch.float64)
    return [logps, old_logps, ref_logps, advantages, mask]


def grpo_variant(logps, old_logps, ref_logps, advantages, mask, beta, epsilon, pick="min", ratio_form="exp",
                 kl="k3", kl_sign=1.0, negate=True, reduce="grpo", detach="") -> Tensor:
    """The GRPO loss with one deliberate choice: how the ratio is formed, which of the unclipped and clipped terms
    is kept, the KL estimator and its sign, whether the surrogate is negated, how the tokens are averaged, and which
    part is computed from logps.detach()."""
    ratio_logps = logps.detach() if detach == "ratio" else logps
    kl_logps = logps.detach() if detach == "kl" else logps
    log_ratio = ratio_logps - old_logps
    ratio = {"exp": lambda: log_ratio.exp(), "reversed": lambda: (-log_ratio).exp(), "log": lambda: log_ratio}[
        ratio_form]()
    adv = advantages[:, None]
    unclipped, clipped = ratio * adv, ratio.clamp(1 - epsilon, 1 + epsilon) * adv
    surrogate = {"min": lambda: torch.min(unclipped, clipped), "max": lambda: torch.max(unclipped, clipped),
                 "unclipped": lambda: unclipped, "clipped": lambda: clipped}[pick]()
    d = ref_logps - kl_logps  # log(ref / pi)
    penalty = {"k3": lambda: d.exp() - d - 1, "k1": lambda: -d, "k1_reversed": lambda: d,
               "k3_reversed": lambda: (-d).exp() + d - 1, "k3_ratio": lambda: (d.exp() - d - 1) * ratio,
               "k2": lambda: 0.5 * d ** 2, "none": lambda: 0 * d}[kl]()
    per_token = (-surrogate if negate else surrogate) + kl_sign * beta * penalty
    m = mask.to(per_token.dtype)
    masked = per_token * m
    return {"grpo": lambda: (masked.sum(dim=1) / m.sum(dim=1)).mean(),
            "token": lambda: masked.sum() / m.sum(),
            "no_mask": lambda: per_token.mean(),
            "padded": lambda: (masked.sum(dim=1) / mask.shape[1]).mean(),
            "sum_per_completion": lambda: masked.sum(dim=1).mean(),
            "sum": lambda: masked.sum()}[reduce]()


def grpo_variants(logps, old_logps, ref_logps, advantages, mask, beta, epsilon):
    """The known mistakes of the GRPO loss, as (bug, make_output) pairs."""
    g = functools.partial(grpo_variant, logps, old_logps, ref_logps, advantages, mask, beta, epsilon)
    k3 = "k3 = exp(ref_logps - logps) - (ref_logps - logps) - 1"
    return [
        ("max instead of min: GRPO keeps the pessimistic of the two terms, -torch.min(ratio * A, "
         "ratio.clamp(1 - epsilon, 1 + epsilon) * A)", lambda: g(pick="max")),
        ("no clipping: the ratio must also enter clamped to [1 - epsilon, 1 + epsilon], and the smaller of "
         "ratio * A and clamp(ratio) * A is kept", lambda: g(pick="unclipped")),
        ("only the clipped term is kept: take the smaller of ratio * A and ratio.clamp(1 - epsilon, 1 + epsilon) * "
         "A, torch.min of both", lambda: g(pick="clipped")),
        ("the ratio is upside down: ratio = pi / pi_old = torch.exp(logps - old_logps)",
         lambda: g(ratio_form="reversed")),
        ("the ratio is the difference of the log-probs: exponentiate it, torch.exp(logps - old_logps)",
         lambda: g(ratio_form="log")),
        (f"k1 (logps - ref_logps) instead of k3 as the KL penalty: use {k3}, which is never negative",
         lambda: g(kl="k1")),
        (f"the KL penalty is ref_logps - logps (k1 with the wrong sign): use {k3}", lambda: g(kl="k1_reversed")),
        (f"k3 with the ratio reversed, exp(logps - ref) - (logps - ref) - 1: GRPO's k3 has r = ref / pi, {k3}",
         lambda: g(kl="k3_reversed")),
        ("k3 is weighted by the ratio: that is TRL's kl_correction; the GRPO paper's penalty, the one asked for "
         f"here, is beta * k3 alone, {k3}", lambda: g(kl="k3_ratio")),
        (f"k2, (log r) ** 2 / 2, instead of k3 as the KL penalty: use {k3}", lambda: g(kl="k2")),
        (f"the KL penalty is missing: add beta * k3 to every token's loss, {k3}", lambda: g(kl="none")),
        ("the KL penalty is subtracted instead of added: the loss is -min(...) + beta * k3, so moving away from "
         "the reference costs", lambda: g(kl_sign=-1.0)),
        ("the loss is the objective with its sign: GRPO maximises min(...) - beta * k3, so the loss to minimise "
         "is -min(...) + beta * k3", lambda: -g()),
        ("the clipped surrogate is not negated: the loss per token is -min(ratio * A, clamp(ratio) * A) + "
         "beta * k3", lambda: g(negate=False)),
        ("the tokens are averaged over the whole batch (one mean over every completion token: that is TRL's bnpo "
         "or dapo, not grpo): GRPO averages each completion's tokens first, (per_token * mask).sum(dim=1) / "
         "mask.sum(dim=1), then takes the mean over the completions", lambda: g(reduce="token")),
        ("the mask is ignored, so prompt and padding tokens are counted: multiply the per-token losses by mask "
         "and divide each completion's sum by its own length, mask.sum(dim=1)", lambda: g(reduce="no_mask")),
        ("each completion's sum is divided by the padded length (mask.shape[1]): divide by its own number of "
         "tokens, mask.sum(dim=1)", lambda: g(reduce="padded")),
        ("each completion's token losses are summed, not averaged: divide by its number of tokens, "
         "mask.sum(dim=1), then take the mean over the completions", lambda: g(reduce="sum_per_completion")),
        ("the token losses are summed over the whole batch: average each completion's tokens, then the "
         "completions", lambda: g(reduce="sum")),
        *[(f"the beta argument is ignored: you use {b:g} where the call passes beta={beta:g}",
           lambda b=b: grpo_variant(logps, old_logps, ref_logps, advantages, mask, b, epsilon))
          for b in (0.04, 0.1, 0.0) if b != beta],
        *[(f"the epsilon argument is ignored: you clip with {e:g} where the call passes epsilon={epsilon:g}",
           lambda e=e: grpo_variant(logps, old_logps, ref_logps, advantages, mask, beta, e))
          for e in (0.2, 0.1, 0.28) if e != epsilon],
    ]


@isolated_rng
def check_grpo_loss(learner_impl) -> None:
    """Check `learner_impl(logps, old_logps, ref_logps, advantages, mask, beta, epsilon)`, the GRPO loss of
    notebook 15.

    logps, old_logps, ref_logps: (batch, tokens) log-probs of the sampled tokens under the policy being trained,
    the policy that sampled them and the reference; advantages: (batch,); mask: (batch, tokens) int64, 1 on the
    completions' tokens. Must return one number, a 0-d tensor: per token -min(ratio * A, clamp(ratio, 1 - epsilon,
    1 + epsilon) * A) + beta * k3, with ratio = exp(logps - old_logps) and k3 = exp(ref_logps - logps) -
    (ref_logps - logps) - 1, averaged over each completion's own tokens, then over the completions: the GRPO
    paper's form, course_lib.alignment.grpo_loss(..., loss_type="grpo", kl_correction=False), with its gradient
    with respect to logps."""
    ck = Checker("check_grpo_loss")
    require_function(ck, learner_impl, GRPO_SIGNATURE)
    cases = [(([5, 2, 4, 3], [1, 1, 2, 1], 6, [1, -1, -1, 1]), 0.04, 0.2, "beta=0.04, epsilon=0.2"),
             (([5, 2, 4, 3], [1, 1, 2, 1], 6, [-1, 1, 1, -1]), 0.0, 0.2, "beta=0 (no KL penalty), epsilon=0.2"),
             (([3, 6, 2, 4, 5], [1, 1, 3, 2, 1], 7, [1, -1, 1, -1, -1]), 0.1, 0.3, "beta=0.1, epsilon=0.3")]
    for (lengths, starts, tokens, signs), beta, epsilon, settings in cases:
        logps, old_logps, ref_logps, advantages, mask = grpo_inputs(lengths, starts, tokens, signs)
        situation = (f"for {len(lengths)} completions of {lengths} tokens (padded to {tokens}), advantages of both "
                     f"signs, ratios outside [1 - epsilon, 1 + epsilon] on both sides, {settings}")
        leaf = logps.clone().requires_grad_(True)
        others = [t.clone() for t in (old_logps, ref_logps, advantages, mask)]
        got = ck.call(f"{GRPO_SIGNATURE.split('(')[0]} {situation}", learner_impl, leaf, *others, beta, epsilon,
                      bug=f"the function must take the lesson's arguments, {GRPO_SIGNATURE}; advantages is (batch,): "
                      "give it a token dimension, advantages[:, None], before multiplying it by the (batch, tokens) "
                      "ratio")
        check_unchanged(ck, logps, leaf.detach(), "function (logps)")
        for name, before, after in zip(("old_logps", "ref_logps", "advantages", "mask"),
                                       (old_logps, ref_logps, advantages, mask), others):
            check_unchanged(ck, before, after, f"function ({name})")
        got = one_number(ck, got, situation, "you return one loss per completion (or per token): average each "
                         "completion's token losses over its mask, then take the mean over the completions")
        expected = reference_grpo_loss(leaf, old_logps, ref_logps, advantages, mask, beta, epsilon)
        with torch.no_grad():
            variants = grpo_variants(logps, old_logps, ref_logps, advantages, mask, beta, epsilon)
        compare(ck, got, expected, variants, situation, GRPO_FALLBACK)
        g = functools.partial(grpo_variant, leaf, old_logps, ref_logps, advantages, mask, beta, epsilon)
        check_gradients(ck, got, expected, {"logps": leaf}, situation,
                        "logps is detached (.detach(), .item(), torch.tensor(...) or torch.no_grad()), so the loss "
                        "cannot train the policy: only old_logps and ref_logps are constants",
                        [("the KL penalty gets no gradient: it is computed from logps.detach(); only ref_logps is a "
                          "constant, the penalty must pull logps towards it", lambda: g(detach="kl")),
                         ("the ratio gets no gradient: it is computed from logps.detach(); only old_logps is a "
                          "constant, ratio = torch.exp(logps - old_logps.detach())", lambda: g(detach="ratio"))])
    ck.done("Your GRPO loss matches course_lib's grpo_loss (loss_type=\"grpo\", kl_correction=False): the clipped "
            "ratio, the k3 penalty, each completion's token mean.")

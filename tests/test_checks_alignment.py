"""The exercise checks of notebook 15 (the DPO loss, group advantages, the GRPO loss) name each planted bug and pass
correct code.

The learner code below is written independently of course_lib, the way a learner would write it, with a `bug`
argument: None is correct; any other value plants one named mistake. ALIGNMENT_PLANTED and ALIGNMENT_CORRECT are
shaped like tests/test_checks.py's PLANTED and CORRECT, which counts them too."""

import pytest
import torch
import torch.nn.functional as F

from course_lib.alignment import group_advantages
from course_lib.checks import CheckFailed, check_dpo_loss, check_group_advantages, check_grpo_loss
from course_lib.checks.alignment import reference_dpo_loss, reference_grpo_loss

# ------------------------------------------------------------------------------------------------------- DPO


def my_dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta, bug=None):
    if bug == "detached":
        policy_chosen, policy_rejected = policy_chosen.detach(), policy_rejected.detach()
    if bug == "rejected_detached":
        policy_rejected = policy_rejected.detach()
    chosen, rejected = policy_chosen - ref_chosen, policy_rejected - ref_rejected  # log pi / ref of each reply
    if bug == "no_ref":
        chosen, rejected = policy_chosen, policy_rejected
    elif bug == "ref_added":
        chosen, rejected = policy_chosen + ref_chosen, policy_rejected + ref_rejected
    elif bug == "swapped":
        chosen, rejected = rejected, chosen
    diff = chosen - rejected
    if bug == "beta_outside":
        losses = -beta * F.logsigmoid(diff)
    elif bug == "beta_ignored":
        losses = -F.logsigmoid(0.1 * diff)
    elif bug == "log_sigmoid":
        losses = -torch.log(torch.sigmoid(beta * diff))
    elif bug == "log_one_plus_exp":
        losses = torch.log(1 + torch.exp(-beta * diff))
    elif bug == "no_minus":
        losses = F.logsigmoid(beta * diff)
    else:
        losses = -F.logsigmoid(beta * diff)
    if bug == "per_pair":
        return losses
    loss = losses.sum() if bug == "sum" else losses.mean()
    if bug == "item":
        return loss.item()
    if bug == "tuple":
        return loss, beta * chosen.detach(), beta * rejected.detach()
    return loss


def my_dpo_loss_softplus(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    """Correct another way: -log sigmoid(x) = softplus(-x), stable too."""
    margin = beta * ((policy_chosen - policy_rejected) - (ref_chosen - ref_rejected))
    return F.softplus(-margin).mean()


# ------------------------------------------------------------------------------------------------ group advantages

def my_group_advantages(rewards, group_size, bug=None):
    groups = rewards.view(group_size, -1).T if bug == "strided" else rewards.view(-1, group_size)
    dim = 0 if bug == "columns" else 1
    if bug == "in_place":  # the view shares the rewards' memory
        groups -= groups.mean(dim=1, keepdim=True)
    mean = rewards.mean() if bug == "batch_mean" else groups.mean(dim=dim, keepdim=True)
    std = groups.std(dim=dim, keepdim=True, unbiased=bug != "population")
    if bug == "batch_std":
        std = rewards.std()
    eps = {"no_eps": 0.0, "eps_small": 1e-8}.get(bug, 1e-4)
    if bug == "eps_inside":
        scaled = (groups - mean) / torch.sqrt(groups.var(dim=dim, keepdim=True) + eps)
    elif bug == "no_std":
        scaled = groups - mean
    else:
        scaled = (groups - mean) / (std + eps)
    if bug == "sign":
        scaled = -scaled
    return scaled if bug == "not_flat" else scaled.flatten()


def my_group_advantages_loop(rewards, group_size):
    """Correct another way: one group at a time."""
    return torch.cat([(g - g.mean()) / (g.std() + 1e-4) for g in rewards.split(group_size)])


# ------------------------------------------------------------------------------------------------------- GRPO

def my_grpo_loss(logps, old_logps, ref_logps, advantages, mask, beta, epsilon, bug=None):
    if bug == "detached":
        logps = logps.detach()
    beta = 0.04 if bug == "beta_ignored" else beta
    epsilon = 0.2 if bug == "epsilon_ignored" else epsilon
    log_ratio = logps - old_logps.detach()
    ratio = torch.exp(-log_ratio) if bug == "ratio_reversed" else torch.exp(log_ratio)
    adv = advantages.unsqueeze(1)  # (batch, 1)
    unclipped, clipped = ratio * adv, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * adv
    if bug == "no_clip":
        surrogate = unclipped
    elif bug == "max":
        surrogate = torch.max(unclipped, clipped)
    else:
        surrogate = torch.min(unclipped, clipped)
    kl_logps = logps.detach() if bug == "kl_detached" else logps
    diff = ref_logps - kl_logps
    if bug == "k1":
        kl = kl_logps - ref_logps
    elif bug == "k3_reversed":
        kl = torch.exp(-diff) + diff - 1
    else:
        kl = torch.exp(diff) - diff - 1
    if bug == "k3_ratio":
        kl = kl * ratio
    if bug == "kl_subtracted":
        per_token = -surrogate - beta * kl
    elif bug == "objective":
        per_token = surrogate - beta * kl
    else:
        per_token = -surrogate + beta * kl
    if bug == "mask_ignored":
        return per_token.mean()
    m = mask.to(per_token.dtype)
    masked = per_token * m
    if bug == "token_mean":
        return masked.sum() / m.sum()
    lengths = torch.full_like(m[:, 0], mask.shape[1]) if bug == "padded_length" else m.sum(dim=1)
    per_completion = masked.sum(dim=1) / lengths
    return per_completion if bug == "per_completion" else per_completion.mean()


# ------------------------------------------------------------------------------------------------ the tables

# (check, learner code, planted bug, what the check's message must match)
ALIGNMENT_PLANTED = [
    (check_dpo_loss, my_dpo_loss, "no_ref", "the reference log-probs are left out"),
    (check_dpo_loss, my_dpo_loss, "ref_added", "the reference log-probs are added instead of subtracted"),
    (check_dpo_loss, my_dpo_loss, "swapped", "chosen and rejected are swapped, so the sign of the margin is flipped"),
    (check_dpo_loss, my_dpo_loss, "beta_outside", "beta is applied outside the log-sigmoid"),
    (check_dpo_loss, my_dpo_loss, "beta_ignored", "beta=0.5.*\nLikely bug: the beta argument is ignored: you use 0.1"),
    (check_dpo_loss, my_dpo_loss, "sum", "summed over the pairs instead of averaged"),
    (check_dpo_loss, my_dpo_loss, "no_minus", "the minus sign is missing"),
    (check_dpo_loss, my_dpo_loss, "log_sigmoid", r"float32.*your loss is inf\nLikely bug: log\(sigmoid\(\.\)\) in "
                                                 r"two steps overflows for large margins: use F\.logsigmoid"),
    (check_dpo_loss, my_dpo_loss, "log_one_plus_exp", r"log\(sigmoid\(\.\)\) in two steps overflows for large "
                                                      r"margins"),
    (check_dpo_loss, my_dpo_loss, "detached", r"no gradient.*\nLikely bug: the policy's log-probs are detached"),
    (check_dpo_loss, my_dpo_loss, "rejected_detached", "no gradient reaches policy_rejected"),
    (check_dpo_loss, my_dpo_loss, "per_pair", r"shape \(6,\), expected one number.*\nLikely bug: you return one "
                                              "loss per pair"),
    (check_dpo_loss, my_dpo_loss, "item", "Python number"),
    (check_dpo_loss, my_dpo_loss, "tuple", "returned a tuple of 3 items"),
    (check_group_advantages, my_group_advantages, "batch_mean", "the batch-wide mean instead of the group's mean"),
    (check_group_advantages, my_group_advantages, "batch_std", "the std of the whole batch instead of the group's"),
    (check_group_advantages, my_group_advantages, "no_std", "not divided by the std"),
    (check_group_advantages, my_group_advantages, "population", r"the population std \(unbiased=False"),
    (check_group_advantages, my_group_advantages, "eps_inside", "eps inside the square root"),
    (check_group_advantages, my_group_advantages, "no_eps", r"NaN for the group whose rewards are all equal"
                                                            r"\nLikely bug: eps is missing"),
    (check_group_advantages, my_group_advantages, "eps_small", "eps is 1e-08 instead of 1e-4"),
    (check_group_advantages, my_group_advantages, "strided", r"the groups are read as strided: "
                                                             r"rewards\.view\(group_size, -1\)\.T"),
    (check_group_advantages, my_group_advantages, "columns", "taken over dim=0"),
    (check_group_advantages, my_group_advantages, "not_flat", r"shape \(3, 8\).*\nLikely bug: you return "
                                                              r"\(prompts, group_size\) instead of flat"),
    (check_group_advantages, my_group_advantages, "sign", "the sign is flipped"),
    (check_group_advantages, my_group_advantages, "in_place", "changed the tensor it was given"),
    (check_grpo_loss, my_grpo_loss, "max", "max instead of min"),
    (check_grpo_loss, my_grpo_loss, "no_clip", "no clipping"),
    (check_grpo_loss, my_grpo_loss, "k1", r"k1 \(logps - ref_logps\) instead of k3"),
    (check_grpo_loss, my_grpo_loss, "k3_reversed", "k3 with the ratio reversed"),
    (check_grpo_loss, my_grpo_loss, "k3_ratio", "k3 is weighted by the ratio: that is TRL's kl_correction"),
    (check_grpo_loss, my_grpo_loss, "kl_subtracted", "the KL penalty is subtracted instead of added"),
    (check_grpo_loss, my_grpo_loss, "objective", "the loss is the objective with its sign"),
    (check_grpo_loss, my_grpo_loss, "ratio_reversed", "the ratio is upside down"),
    (check_grpo_loss, my_grpo_loss, "token_mean", r"averaged over the whole batch .*TRL's bnpo or dapo, not grpo"),
    (check_grpo_loss, my_grpo_loss, "mask_ignored", "the mask is ignored, so prompt and padding tokens are counted"),
    (check_grpo_loss, my_grpo_loss, "padded_length", "divided by the padded length"),
    (check_grpo_loss, my_grpo_loss, "beta_ignored", "beta=0 .*\nLikely bug: the beta argument is ignored: you use "
                                                    "0.04"),
    (check_grpo_loss, my_grpo_loss, "epsilon_ignored", "epsilon=0.3.*\nLikely bug: the epsilon argument is "
                                                       "ignored: you clip with 0.2"),
    (check_grpo_loss, my_grpo_loss, "kl_detached", "right value but its gradient.*\nLikely bug: the KL penalty "
                                                   r"gets no gradient: it is computed from logps\.detach\(\)"),
    (check_grpo_loss, my_grpo_loss, "detached", r"no gradient.*\nLikely bug: logps is detached"),
    (check_grpo_loss, my_grpo_loss, "per_completion", r"shape \(4,\), expected one number.*\nLikely bug: you "
                                                      "return one loss per completion"),
]

ALIGNMENT_CORRECT = [  # (check, correct code, what the one line must praise)
    (check_dpo_loss, reference_dpo_loss, "finite for any margin"),
    (check_dpo_loss, my_dpo_loss, "finite for any margin"),
    (check_dpo_loss, my_dpo_loss_softplus, "finite for any margin"),
    (check_group_advantages, group_advantages, "sample std"),
    (check_group_advantages, my_group_advantages, "sample std"),
    (check_group_advantages, my_group_advantages_loop, "sample std"),
    (check_grpo_loss, reference_grpo_loss, "k3 penalty"),
    (check_grpo_loss, my_grpo_loss, "k3 penalty"),
]


def learner(code, bug=None):
    return code if bug is None else lambda *args, **kwargs: code(*args, bug=bug, **kwargs)


@pytest.mark.parametrize(("check", "code", "bug", "match"), ALIGNMENT_PLANTED,
                         ids=[f"{row[0].__name__}-{row[2]}" for row in ALIGNMENT_PLANTED])
def test_each_planted_bug_is_caught_and_named(check, code, bug, match):
    with pytest.raises(CheckFailed, match=match) as info:
        check(learner(code, bug))
    assert str(info.value).startswith(f"{check.__name__}: ") and "\nLikely bug: " in str(info.value)


@pytest.mark.parametrize(("check", "code", "praise"), ALIGNMENT_CORRECT,
                         ids=[f"{row[0].__name__}-{row[1].__name__}" for row in ALIGNMENT_CORRECT])
def test_each_check_passes_correct_code(check, code, praise, capsys):
    check(learner(code))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{check.__name__}: all ") and "checks passed" in lines[0] and praise in lines[0]


def test_the_checks_reject_what_is_not_a_function():
    with pytest.raises(TypeError, match="expects a function such as my_dpo_loss"):
        check_dpo_loss(3)
    with pytest.raises(TypeError, match="expects a function such as my_group_advantages.*got the class"):
        check_group_advantages(torch.nn.Linear)
    with pytest.raises(TypeError, match="expects a function such as my_grpo_loss"):
        check_grpo_loss("grpo")

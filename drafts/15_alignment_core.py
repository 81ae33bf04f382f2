"""Draft of the core of notebook 15 (issue 33): the quantities DPO and GRPO are built on, written from their papers.

Not yet a lesson module: these functions move into exported cells of notebooks/15_alignment.ipynb, and from there into
course_lib/alignment.py. tests/test_alignment_trl.py proves each one equal to TRL 1.16 (see drafts/NOTES_issue33.md).

Conventions shared by every function below:
- A batch of exchanges is `input_ids` (batch, tokens), right-padded, and `response_mask` (batch, tokens) of the same
  shape, 1 on the tokens the model wrote (the response and its <|end|>), 0 on the prompt and the padding. This is
  TRL's `completion_mask`.
- Per-token log-probabilities are aligned with the *targets*: column t scores token t + 1 given tokens 0 .. t, so they
  are (batch, tokens - 1), and the mask that goes with them is response_mask[:, 1:].
"""


import torch
import torch.nn.functional as F
from torch import Tensor, nn

from course_lib.finetuning import ChatTokenizer, format_chat
from course_lib.guards import check_bool, check_int, check_number, check_type

GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")  # TRL's names for how the per-token losses are averaged


# ---------------------------------------------------------------------------------------------- the batch
def response_batch(tokenizer: ChatTokenizer, examples, context_length: int) -> tuple[Tensor, Tensor]:
    """(instruction, response) pairs as whole exchanges in the chat format: input_ids (batch, tokens), right-padded
    with <|end|>, and response_mask (batch, tokens), 1 on the response and its closing <|end|>. An exchange may be
    context_length + 1 tokens long: the model never reads the last token, it only scores it."""
    check_type("tokenizer", tokenizer, ChatTokenizer, "wrap the model's tokenizer: ChatTokenizer(char_tokenizer)")
    if not isinstance(examples, (list, tuple)) or not examples:
        raise TypeError(f"examples must be a non-empty list of (instruction, response) pairs, got {examples!r}")
    check_int("context_length", context_length, minimum=1)
    rows = []
    for i, pair in enumerate(examples):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise TypeError(f"examples[{i}] must be an (instruction, response) pair of str, got {pair!r}")
        n_prompt = len(tokenizer.encode(format_chat(pair[0])))  # <|user|> ... <|assistant|>
        full = tokenizer.encode(format_chat(*pair))  # the prompt, the response, <|end|>
        if len(full) - 1 > context_length:
            raise ValueError(f"examples[{i}] is {len(full)} tokens long, more than context_length + 1 = "
                             f"{context_length + 1}: shorten its instruction or response")
        rows.append((full, [0] * n_prompt + [1] * (len(full) - n_prompt)))
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.tensor([ids + [tokenizer.end_id] * (width - len(ids)) for ids, _ in rows])  # (batch, width)
    response_mask = torch.tensor([m + [0] * (width - len(m)) for _, m in rows])  # (batch, width)
    return input_ids, response_mask


# ---------------------------------------------------------------------------------------------- log-probabilities
def _check_ids_and_mask(input_ids, response_mask) -> None:
    check_type("input_ids", input_ids, Tensor, "build input_ids and response_mask with response_batch(...)")
    check_type("response_mask", response_mask, Tensor, "build input_ids and response_mask with response_batch(...)")
    if input_ids.dim() != 2 or input_ids.shape[1] < 2:
        raise ValueError(f"input_ids must be (batch, tokens) with at least 2 tokens (a prompt token and a response "
                         f"token), got shape {tuple(input_ids.shape)}")
    if response_mask.shape != input_ids.shape or response_mask.dtype.is_floating_point:
        raise ValueError(f"response_mask must be a 0/1 or bool tensor of input_ids' shape {tuple(input_ids.shape)}, "
                         f"got {response_mask.dtype} {tuple(response_mask.shape)}: build both with response_batch")
    if response_mask.device.type == "cpu" and not torch.compiler.is_compiling():  # reading values is free here
        if not bool(((response_mask == 0) | (response_mask == 1)).all()):
            raise ValueError("response_mask must hold only 1 (a response token) and 0 (prompt or padding)")
        if bool(response_mask[:, 0].any()):
            raise ValueError("response_mask[:, 0] is 1, but the first token has nothing before it to be predicted "
                             "from: a response must follow a prompt of at least one token")
        if not bool(response_mask.any(dim=1).all()):
            row = int((~response_mask.bool().any(dim=1)).nonzero()[0])
            raise ValueError(f"row {row} of response_mask has no response token: its log-probability would be an "
                             "empty sum")


def token_logprobs(model: nn.Module, input_ids: Tensor, response_mask: Tensor) -> Tensor:
    """log p(token t + 1 | tokens 0 .. t) for every response token, 0 elsewhere: (batch, tokens - 1), float32.
    The model reads input_ids[:, :-1] (the last token is only scored, never read)."""
    check_type("model", model, nn.Module, "pass the policy or the reference model, e.g. a GPTModel")
    _check_ids_and_mask(input_ids, response_mask)
    logits = model(input_ids[:, :-1])  # (batch, tokens - 1, vocab_size): position t predicts token t + 1
    targets = input_ids[:, 1:]  # (batch, tokens - 1)
    logps = logits.float().log_softmax(dim=-1)  # (batch, tokens - 1, vocab_size), normalised in float32
    picked = logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (batch, tokens - 1)
    return picked * response_mask[:, 1:]  # prompt and padding positions -> 0


def sequence_logprobs(model: nn.Module, input_ids: Tensor, response_mask: Tensor) -> Tensor:
    """log pi(response | prompt) = the sum of the response tokens' log-probabilities: (batch,)."""
    return token_logprobs(model, input_ids, response_mask).sum(dim=-1)  # (batch,)


# ---------------------------------------------------------------------------------------------- DPO
def _check_same_shape(names_and_tensors: dict, shape_hint: str) -> None:
    first_name, first = next(iter(names_and_tensors.items()))
    for name, value in names_and_tensors.items():
        check_type(name, value, Tensor, f"pass a tensor of {shape_hint}")
        if not value.dtype.is_floating_point:
            raise TypeError(f"{name} must hold log-probabilities (a float tensor), got dtype {value.dtype}")
        if value.shape != first.shape:
            raise ValueError(f"{name} has shape {tuple(value.shape)} but {first_name} has {tuple(first.shape)}: all "
                             f"must be {shape_hint}")


def dpo_loss(policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor,
             beta: float) -> tuple[Tensor, Tensor, Tensor]:
    """The DPO loss of Rafailov et al. (2023), averaged over the pairs, from four (pairs,) tensors of sequence
    log-probabilities: -log sigmoid(beta * [(log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))]).
    Also returns the implicit rewards beta * log(pi / ref) of the chosen and the rejected responses, (pairs,) each,
    detached: they are for watching training, not for the gradient."""
    _check_same_shape({"policy_chosen": policy_chosen, "policy_rejected": policy_rejected,
                       "ref_chosen": ref_chosen, "ref_rejected": ref_rejected}, "(pairs,) sequence log-probs")
    if policy_chosen.dim() != 1 or policy_chosen.numel() == 0:
        raise ValueError(f"the log-probs must be 1-D (pairs,) and non-empty, got shape {tuple(policy_chosen.shape)}: "
                         "pass sequence_logprobs(...), one number per response")
    check_number("beta", beta, 0, low_open=True, why="beta scales the log-ratios; larger beta keeps the policy "
                 "closer to the reference (TRL's default is 0.1)")
    chosen_logratio = policy_chosen - ref_chosen  # (pairs,): log pi(y_w | x) / ref(y_w | x)
    rejected_logratio = policy_rejected - ref_rejected  # (pairs,)
    margin = beta * (chosen_logratio - rejected_logratio)  # (pairs,): the difference of implicit rewards
    loss = -F.logsigmoid(margin).mean()  # log sigmoid, never log(sigmoid(.)): stable for large margins
    return loss, beta * chosen_logratio.detach(), beta * rejected_logratio.detach()


# ---------------------------------------------------------------------------------------------- GRPO
def group_advantages(rewards: Tensor, group_size: int, eps: float = 1e-4) -> Tensor:
    """Each reward minus the mean of its group, divided by the group's standard deviation plus eps: (completions,).
    The completions of one prompt are consecutive, group_size of them. The standard deviation is the sample one
    (divided by group_size - 1, torch.std's default and TRL's), and eps is added to it, outside the square root:
    a group whose rewards are all equal gets advantages of exactly 0, it teaches nothing."""
    check_type("rewards", rewards, Tensor, "pass the checker's rewards as a tensor, e.g. torch.tensor([1., 0., ...])")
    check_int("group_size", group_size, minimum=2)
    check_number("eps", eps, 0, low_open=True, why="it keeps the division finite when a group's rewards are equal")
    if rewards.dim() != 1 or not rewards.dtype.is_floating_point:
        raise ValueError(f"rewards must be a 1-D float tensor (completions,), got {rewards.dtype} of shape "
                         f"{tuple(rewards.shape)}")
    if rewards.numel() == 0 or rewards.numel() % group_size:
        raise ValueError(f"rewards holds {rewards.numel()} completions, not a whole number of groups of "
                         f"group_size={group_size}: sample group_size completions for every prompt")
    groups = rewards.view(-1, group_size)  # (prompts, group_size)
    mean = groups.mean(dim=1, keepdim=True)  # (prompts, 1)
    std = groups.std(dim=1, keepdim=True)  # (prompts, 1), with Bessel's correction
    return ((groups - mean) / (std + eps)).flatten()  # (completions,)


def k3_kl(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """Per-token estimate of KL(policy || reference) from the sampled token alone, the "k3" estimator of Schulman's
    note "Approximating KL divergence" (2020): with r = ref(token) / policy(token), r - log r - 1. It is never
    negative, and its expectation over tokens sampled from the policy is the exact KL. Same shape as logps."""
    log_r = ref_logps - logps  # log r, (batch, tokens)
    return torch.exp(log_r) - log_r - 1


def grpo_loss(logps: Tensor, old_logps: Tensor, ref_logps: Tensor | None, advantages: Tensor, completion_mask: Tensor,
              beta: float, epsilon: float, loss_type: str = "grpo", *, kl_correction: bool = True,
              max_completion_length: int | None = None) -> Tensor:
    """The clipped-ratio objective of GRPO (Shao et al., 2024) with a k3 KL penalty to the reference, as a loss.
    logps, old_logps, ref_logps: (batch, tokens) log-probs of the sampled completion tokens under the policy being
    trained, the policy that sampled them, and the frozen reference (None when beta is 0); advantages: (batch,), one
    per completion; completion_mask: (batch, tokens), 1 on the completion's tokens.

    Per token: -min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon) * A) + beta * k3_kl, ratio = pi / pi_old.
    With kl_correction (TRL 1.16's default, use_bias_correction_kl=True, after DeepSeek-V3.2) the k3 term is also
    multiplied by the ratio, unclipped: the KL's gradient is then unbiased for samples drawn from pi_old. Its value at
    the first step on a fresh sample is the same (the ratio is 1), its gradient is not (the ratio's gradient is not 0).
    loss_type says how the per-token losses become one number (TRL's names, one process, no accumulation):
      "grpo"     mean over each completion's tokens, then mean over completions (the GRPO paper)
      "bnpo"     sum over all tokens / number of completion tokens in the batch
      "dapo"     the same as bnpo here (TRL counts the tokens of the whole generation batch, across processes)
      "dr_grpo"  sum over all tokens / (batch * max_completion_length), a constant (Dr. GRPO, Liu et al., 2025)"""
    check_type("logps", logps, Tensor, "pass the policy's per-token log-probs, (batch, tokens)")
    _check_same_shape({"logps": logps, "old_logps": old_logps, **({} if ref_logps is None else
                       {"ref_logps": ref_logps})}, "(batch, tokens) per-token log-probs")
    if logps.dim() != 2:
        raise ValueError(f"logps must be (batch, tokens), got shape {tuple(logps.shape)}")
    check_type("advantages", advantages, Tensor, "pass group_advantages(rewards, group_size)")
    if advantages.shape != logps.shape[:1]:
        raise ValueError(f"advantages must be (batch,) = ({logps.shape[0]},), one per completion, got shape "
                         f"{tuple(advantages.shape)}")
    check_type("completion_mask", completion_mask, Tensor, "pass the 0/1 mask of the completion tokens")
    if completion_mask.shape != logps.shape:
        raise ValueError(f"completion_mask must have logps' shape {tuple(logps.shape)}, got "
                         f"{tuple(completion_mask.shape)}")
    check_number("beta", beta, 0, why="the weight of the KL penalty (0 switches it off)")
    check_number("epsilon", epsilon, 0, 1, low_open=True, high_open=True, why="the ratio is clipped to "
                 "[1 - epsilon, 1 + epsilon] (TRL's default is 0.2)")
    if loss_type not in GRPO_LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {GRPO_LOSS_TYPES}, got {loss_type!r}")
    if beta != 0 and ref_logps is None:
        raise ValueError(f"beta is {beta} but ref_logps is None: pass the reference's per-token log-probs, or "
                         "beta=0 to train without the KL penalty")
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("loss_type='dr_grpo' divides by batch * max_completion_length, a constant: pass "
                             "max_completion_length, the longest completion the sampler may write")
        check_int("max_completion_length", max_completion_length, minimum=logps.shape[1])
    check_bool("kl_correction", kl_correction)

    mask = completion_mask.to(logps.dtype)  # (batch, tokens)
    old_logps = old_logps.detach()  # the sampler and the reference are constants: no gradient flows into them
    ref_logps = None if ref_logps is None else ref_logps.detach()
    ratio = torch.exp(logps - old_logps)  # (batch, tokens): pi / pi_old, 1 at the first step on a fresh sample
    adv = advantages.unsqueeze(1)  # (batch, 1): one advantage for every token of a completion
    unclipped = ratio * adv  # (batch, tokens)
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon) * adv  # (batch, tokens)
    per_token = -torch.min(unclipped, clipped)  # (batch, tokens): the pessimistic of the two, as a loss
    if beta != 0:
        kl = k3_kl(logps, ref_logps)  # (batch, tokens)
        per_token = per_token + beta * (kl * ratio if kl_correction else kl)  # (batch, tokens)
    masked = per_token * mask  # (batch, tokens): prompt padding and text after <|end|> count 0
    if loss_type == "grpo":
        return (masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()
    if loss_type in ("bnpo", "dapo"):
        return masked.sum() / mask.sum().clamp(min=1)
    return masked.sum() / (logps.shape[0] * max_completion_length)  # dr_grpo

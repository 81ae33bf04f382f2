"""Not a lesson: the doors of notebook 15 (course_lib/alignment.py): the sampled groups and the response batches,
the log-probability tensors that DPO and GRPO read, their settings, and the arguments of the training loops, each
refused with the argument's name before anything is sampled, computed or trained. Values are read only where that
is free (on the CPU, outside torch.compile)."""

import math

import torch
from torch import Tensor, nn

from ..finetuning import CHAT_TOKENS, INSTRUCTION_TASKS, ChatTokenizer, format_chat
from ..guards import require_bool, require_int, require_number, require_type, values_readable
from ..model import GPTModel


def response_tensors(input_ids: Tensor, response_mask: Tensor) -> None:
    """input_ids (batch, tokens) of int64 and response_mask of the same shape, 1 on the response's tokens and 0
    on the prompt and the padding, with a prompt before every response and at least one response token per row."""
    require_type("input_ids", input_ids, Tensor, "build input_ids and response_mask with response_batch(...)")
    require_type("response_mask", response_mask, Tensor, "build input_ids and response_mask with response_batch(...)")
    if input_ids.dim() != 2 or input_ids.shape[1] < 2 or input_ids.dtype != torch.int64:
        raise ValueError(f"input_ids must be int64 (batch, tokens) with at least 2 tokens (a prompt token and a "
                         f"response token), got {input_ids.dtype} of shape {tuple(input_ids.shape)}")
    if response_mask.shape != input_ids.shape or response_mask.dtype.is_floating_point:
        raise ValueError(f"response_mask must be a 0/1 or bool tensor of input_ids' shape {tuple(input_ids.shape)}, "
                         f"got {response_mask.dtype} {tuple(response_mask.shape)}: build both with response_batch")
    if response_mask.device != input_ids.device:
        raise ValueError(f"response_mask is on {response_mask.device} and input_ids on {input_ids.device}: move "
                         "both to the model's device with .to(...)")
    if values_readable(response_mask):
        if not bool(((response_mask == 0) | (response_mask == 1)).all()):
            raise ValueError("response_mask must hold only 1 (a response token) and 0 (prompt or padding)")
        if bool(response_mask[:, 0].any()):
            raise ValueError("response_mask[:, 0] is 1, but the first token has nothing before it to be predicted "
                             "from: a response must follow a prompt of at least one token")
        if not bool(response_mask.bool().any(dim=1).all()):
            row = int((~response_mask.bool().any(dim=1)).nonzero()[0])
            raise ValueError(f"row {row} of response_mask has no response token: its log-probability would be an "
                             "empty sum")


def token_logprobs(model, input_ids: Tensor, response_mask: Tensor) -> None:
    """token_logprobs and sequence_logprobs: a model, a response batch, and (for a GPTModel, where reading is free)
    token ids inside its vocabulary: the last token is only scored, so the model's own door never sees it."""
    require_type("model", model, nn.Module, "pass the policy or the reference model, e.g. a GPTModel")
    response_tensors(input_ids, response_mask)
    if isinstance(model, GPTModel) and values_readable(input_ids):
        low, high = input_ids.min().item(), input_ids.max().item()
        if low < 0 or high >= model.cfg.vocab_size:
            raise ValueError(f"input_ids holds token id {high if high >= model.cfg.vocab_size else low}, outside the "
                             f"model's vocabulary 0 .. {model.cfg.vocab_size - 1}: encode with the model's tokenizer")


def reply_finished(input_ids: Tensor, response_mask: Tensor, end_id: int) -> None:
    """A sampled batch (sample_group's input_ids and response_mask) and the id of <|end|>."""
    response_tensors(input_ids, response_mask)
    require_int("end_id", end_id, minimum=0)


def stack_rows(rows, pad_id: int) -> None:
    """A non-empty list of (input_ids, response_mask) pairs, each two 2-D tensors of one shape, all of one dtype and
    device, and a padding id."""
    if not isinstance(rows, (list, tuple)) or not rows:
        raise ValueError("rows is empty: there is nothing to stack; sample or build at least one batch first")
    require_int("pad_id", pad_id, minimum=0)
    for i, row in enumerate(rows):
        if not (isinstance(row, (list, tuple)) and len(row) == 2 and all(isinstance(t, Tensor) for t in row)
                and row[0].dim() == 2 and row[0].shape == row[1].shape):
            raise TypeError(f"rows[{i}] must be an (input_ids, response_mask) pair of (n, tokens) tensors of one "
                            "shape, as sample_group returns its first two")
        if (row[0].dtype, row[0].device, row[1].device) != (rows[0][0].dtype, rows[0][0].device, rows[0][0].device):
            raise ValueError(f"rows[{i}] has input_ids of {row[0].dtype} on {row[0].device} and rows[0] of "
                             f"{rows[0][0].dtype} on {rows[0][0].device}: stack batches of one kind, on one device")


def _prompt_fits(model: GPTModel, tokenizer: ChatTokenizer, instruction) -> None:
    prompt = tokenizer.encode(format_chat(instruction))
    if model.cfg.context_length - len(prompt) < 1:
        raise ValueError(f"instruction takes {len(prompt)} tokens with the chat tokens and the context holds "
                         f"{model.cfg.context_length}: shorten it to leave room for a reply")


def _generator(generator, device: torch.device) -> None:
    if generator is None:
        return
    require_type("generator", generator, torch.Generator, "make one with torch.Generator(device=...)"
                 ".manual_seed(seed), or pass None")
    if generator.device != device:
        raise ValueError(f"generator is on {generator.device} and the model on {device}: make it where the model "
                         f"is, torch.Generator(device={str(device)!r}).manual_seed(...)")


def sample_group(model, tokenizer, instruction, group_size, generator, max_new_tokens) -> None:
    """A GPTModel and its ChatTokenizer, a group of at least one, a generator where the model is, and an instruction
    that leaves room in the context for at least one reply token."""
    require_type("model", model, GPTModel, "pass the policy, e.g. load_shakespeare_chat()[0]")
    require_type("tokenizer", tokenizer, ChatTokenizer, "pass the model's ChatTokenizer")
    require_int("group_size", group_size, minimum=1)
    require_int("max_new_tokens", max_new_tokens, minimum=1)
    _generator(generator, model.out_head.weight.device)
    _prompt_fits(model, tokenizer, instruction)


def instructions(examples, judged: bool = True) -> None:
    """A non-empty list of instruction dicts, as make_instructions returns: each with its "instruction" text and,
    where the checker judges the replies (`judged`), its "task" and its "response"."""
    if not isinstance(examples, list) or not examples:
        raise TypeError("examples must be a non-empty list of instruction dicts, as make_instructions returns")
    for i, example in enumerate(examples):
        if not (isinstance(example, dict) and isinstance(example.get("instruction"), str) and (not judged or (
                example.get("task") in INSTRUCTION_TASKS and isinstance(example.get("response"), str)))):
            keys = "'instruction'" + (", a 'task' among " + str(list(INSTRUCTION_TASKS)) + " and a 'response'"
                                      if judged else "")
            raise TypeError(f"examples[{i}] must be a dict with {keys}, as make_instructions returns, got "
                            f"{example!r:.80}")


def preference_pairs(examples, samples: int) -> None:
    """At least two samples per instruction (a pair needs a right and a wrong reply), of instructions to judge."""
    require_int("samples", samples, minimum=2)
    instructions(examples)


def pair_logprobs(tokenizer, pairs, context_length) -> None:
    """A non-empty list of preference pairs: dicts with the texts 'instruction', 'chosen' and 'rejected', none
    holding a chat token, each exchange (instruction and reply) at most context_length + 1 tokens long."""
    if not isinstance(pairs, list) or not pairs:
        raise TypeError("pairs must be a non-empty list of dicts with 'instruction', 'chosen' and 'rejected', as "
                        "preference_pairs returns")
    require_type("tokenizer", tokenizer, ChatTokenizer, "pass the model's ChatTokenizer")
    require_int("context_length", context_length, minimum=1)
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, dict) and all(isinstance(pair.get(k), str) for k in ("instruction", "chosen",
                                                                                        "rejected"))):
            raise TypeError(f"pairs[{i}] must be a dict with the texts 'instruction', 'chosen' and 'rejected', as "
                            f"preference_pairs returns, got {pair!r:.80}")
        for key in ("instruction", "chosen", "rejected"):
            found = [token for token in CHAT_TOKENS if token in pair[key]]
            if found:
                raise ValueError(f"pairs[{i}][{key!r}] holds the chat token {found[0]!r}: a turn's text may not "
                                 "hold one; format_chat adds them itself")
        for key in ("chosen", "rejected"):
            length = len(tokenizer.encode(format_chat(pair["instruction"], pair[key])))
            if length > context_length + 1:
                raise ValueError(f"pairs[{i}] with its {key} reply is {length} tokens long, more than context_length "
                                 f"+ 1 = {context_length + 1}: shorten its instruction or reply, or leave it out")


def logprob_tensors(tensors: dict, shape_hint: str) -> None:
    """Every value a float tensor of the first one's shape; the error names the argument and the shape wanted."""
    first_name, first = next(iter(tensors.items()))
    for name, value in tensors.items():
        require_type(name, value, Tensor, f"pass a tensor of {shape_hint}")
        if not value.dtype.is_floating_point:
            raise TypeError(f"{name} must hold log-probabilities (a float tensor), got dtype {value.dtype}")
        if value.shape != first.shape:
            raise ValueError(f"{name} has shape {tuple(value.shape)} but {first_name} has {tuple(first.shape)}: all "
                             f"must be {shape_hint}")


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta) -> None:
    """Four (pairs,) tensors of sequence log-probs, none positive (where reading is free), and beta > 0. A positive
    one is a negated log-probability (a negative log-likelihood, a loss): with it DPO would train toward the
    rejected replies without a word."""
    tensors = {"policy_chosen": policy_chosen, "policy_rejected": policy_rejected, "ref_chosen": ref_chosen,
               "ref_rejected": ref_rejected}
    logprob_tensors(tensors, "(pairs,) sequence log-probs")
    if policy_chosen.dim() != 1 or policy_chosen.numel() == 0:
        raise ValueError(f"the log-probs must be 1-D (pairs,) and non-empty, got shape {tuple(policy_chosen.shape)}: "
                         "pass sequence_logprobs(...), one number per reply")
    require_number("beta", beta, 0, math.inf, low_open=True, high_open=True, why="beta scales the log-ratios; a "
                   "larger beta keeps the policy closer to the reference (TRL's default is 0.1)")
    for name, value in tensors.items():
        if values_readable(value) and not bool((value <= 0).all()):  # NaN fails `<= 0` too
            i = int((~(value <= 0)).nonzero()[0])
            raise ValueError(f"{name}[{i}] is {value[i].item():g}, but a log-probability is never positive (nor NaN): "
                             f"pass sequence_logprobs(...) itself, not its negation (a negative log-likelihood)")


def frozen_copy(model) -> None:
    require_type("model", model, nn.Module, "pass the model training starts from")


def policy_copy(model) -> None:
    """A model with LoRA matrices (apply_lora's lora_A and lora_B), the only parameters that will train."""
    frozen_copy(model)
    if not any(".lora_" in name for name, _ in model.named_parameters()):
        raise ValueError("model has no LoRA matrices to train: give it adapters with apply_lora first")


def k3_kl(logps, ref_logps) -> None:
    logprob_tensors({"logps": logps, "ref_logps": ref_logps}, "per-token log-probs of one shape")


def kl_to_reference(policy, reference, examples, samples: int) -> None:
    """Instructions to sample from (no judging), at least one sample each, the policy that samples and a reference
    model to compare with (the tokenizer and the generator meet sample_group's door)."""
    instructions(examples, judged=False)
    require_int("samples", samples, minimum=1)
    require_type("policy", policy, GPTModel, "pass the model being trained, e.g. policy_copy(model)")
    require_type("reference", reference, nn.Module, "pass frozen_copy(model) made before training")


def train_dpo(policy, reference, tokenizer, pairs, beta, lr, epochs, batch_size, seed, watch, watch_every) -> None:
    """Everything train_dpo needs, checked before the reference's first forward pass: a policy with a trainable
    parameter, a reference, the pairs, beta and lr > 0, whole epochs and batches, and a watch with its period."""
    require_int("epochs", epochs, minimum=1)
    require_int("batch_size", batch_size, minimum=1)
    require_number("lr", lr, 0, math.inf, low_open=True, high_open=True, why="AdamW's learning rate")
    require_number("beta", beta, 0, math.inf, low_open=True, high_open=True, why="DPO's beta (TRL's default is 0.1)")
    if watch is not None and not (callable(watch) and type(watch_every) is int and watch_every >= 1):
        raise TypeError(f"watch must be a function returning a dict of numbers to record, with watch_every >= 1, "
                        f"or None; got {watch!r} with watch_every={watch_every}")
    require_int("seed", seed)
    require_type("policy", policy, GPTModel, "pass policy_copy(model), the model whose LoRA matrices train")
    require_type("reference", reference, nn.Module, "pass frozen_copy(model) made before training")
    pair_logprobs(tokenizer, pairs, policy.cfg.context_length)
    if not any(p.requires_grad for p in policy.parameters()):
        raise ValueError("the policy has no trainable parameter: give it LoRA adapters (apply_lora) or unfreeze it")


def load_aligned(stage) -> None:
    from ..alignment import ALIGNED_DIRS  # this lesson's own table: imported when called, so no import cycle
    if not isinstance(stage, str) or stage not in ALIGNED_DIRS:
        raise ValueError(f"stage must be one of {sorted(ALIGNED_DIRS)}, got {stage!r}")


def group_advantages(rewards, group_size, eps) -> None:
    """A 1-D float tensor of finite rewards, a whole number of groups of at least two, eps > 0. One NaN reward
    would make its group's mean, and so every advantage of the group and every gradient of the batch, NaN."""
    require_type("rewards", rewards, Tensor, "pass the checker's rewards as a tensor, e.g. torch.tensor([1., 0., ...])")
    require_int("group_size", group_size, minimum=2)
    require_number("eps", eps, 0, low_open=True, why="it keeps the division finite when a group's rewards are equal")
    if rewards.dim() != 1 or not rewards.dtype.is_floating_point:
        raise ValueError(f"rewards must be a 1-D float tensor (completions,), got {rewards.dtype} of shape "
                         f"{tuple(rewards.shape)}")
    if rewards.numel() == 0 or rewards.numel() % group_size:
        raise ValueError(f"rewards holds {rewards.numel()} completions, not a whole number of groups of "
                         f"group_size={group_size}: sample group_size completions for every prompt")
    if values_readable(rewards) and not bool(torch.isfinite(rewards).all()):
        i = int((~torch.isfinite(rewards)).nonzero()[0])
        raise ValueError(f"rewards[{i}] is {rewards[i].item()}: every reward must be a finite number, or the "
                         f"advantages of its whole group turn NaN; give a reply the checker cannot score reward 0")


def grpo_settings(beta, epsilon, loss_type, kl_correction: bool = True) -> None:
    """beta >= 0, epsilon in (0, 1), a loss_type of GRPO_LOSS_TYPES, kl_correction True or False: each error names
    the argument."""
    from ..alignment import GRPO_LOSS_TYPES  # this lesson's own table: imported when called, so no import cycle
    require_number("beta", beta, 0, math.inf, high_open=True, why="the weight of the KL penalty (0 switches it off)")
    require_number("epsilon", epsilon, 0, 1, low_open=True, high_open=True, why="the ratio is clipped to "
                   "[1 - epsilon, 1 + epsilon] (TRL's default is 0.2)")
    if loss_type not in GRPO_LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {GRPO_LOSS_TYPES}, got {loss_type!r}")
    require_bool("kl_correction", kl_correction)  # "no" would be truthy: the correction on, silently


def grpo_loss(logps, old_logps, ref_logps, advantages, completion_mask, beta, epsilon, loss_type,
              max_completion_length=None, kl_correction=True) -> None:
    """The doors of grpo_loss: shapes that fit together, beta >= 0 with a reference when it is not 0, epsilon in
    (0, 1), a known loss_type, kl_correction a bool, and dr_grpo's constant."""
    logprob_tensors({"logps": logps, "old_logps": old_logps, **({} if ref_logps is None else
                    {"ref_logps": ref_logps})}, "(batch, tokens) per-token log-probs")
    if logps.dim() != 2:
        raise ValueError(f"logps must be (batch, tokens), got shape {tuple(logps.shape)}")
    require_type("advantages", advantages, Tensor, "pass group_advantages(rewards, group_size)")
    if advantages.shape != logps.shape[:1]:
        raise ValueError(f"advantages must be (batch,) = ({logps.shape[0]},), one per completion, got shape "
                         f"{tuple(advantages.shape)}")
    if not advantages.dtype.is_floating_point:
        raise TypeError(f"advantages must be a float tensor, got dtype {advantages.dtype}: pass "
                        "group_advantages(rewards, group_size)")
    require_type("completion_mask", completion_mask, Tensor, "pass the 0/1 mask of the completion tokens")
    if completion_mask.shape != logps.shape:
        raise ValueError(f"completion_mask must have logps' shape {tuple(logps.shape)}, got "
                         f"{tuple(completion_mask.shape)}")
    grpo_settings(beta, epsilon, loss_type, kl_correction)
    if beta != 0 and ref_logps is None:
        raise ValueError(f"beta is {beta} but ref_logps is None: pass the reference's per-token log-probs, or "
                         "beta=0 to train without the KL penalty")
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("loss_type='dr_grpo' divides by batch * max_completion_length, a constant: pass "
                             "max_completion_length, the longest completion the sampler may write")
        require_int("max_completion_length", max_completion_length, minimum=int(completion_mask.sum(dim=1).max()))


def rollout(policy, examples) -> None:
    """Instructions the checker can judge, and a policy to sample from (the rest meets sample_group's door)."""
    instructions(examples)
    require_type("policy", policy, GPTModel, "pass the model being trained, e.g. policy_copy(model)")


def grpo_step(policy, reference, tokenizer, examples, optimizer, group_size, beta, epsilon, iterations, loss_type,
              generator, max_new_tokens, kl_correction) -> None:
    """Everything grpo_step needs, checked before it samples anything or moves the policy: the settings, a
    reference when beta is not 0, an optimizer that holds the policy's trainable parameters, and instructions that
    leave room in the context for a reply."""
    require_int("iterations", iterations, minimum=1)
    require_int("group_size", group_size, minimum=2)  # a group of one has no mean to compare with
    grpo_settings(beta, epsilon, loss_type, kl_correction)
    if beta != 0 and not isinstance(reference, nn.Module):
        raise TypeError(f"beta is {beta}, so the KL penalty needs the reference model: pass frozen_copy(policy) "
                        "made before training, or beta=0")
    require_type("policy", policy, GPTModel, "pass policy_copy(model), the model whose LoRA matrices train")
    instructions(examples)
    sample_group(policy, tokenizer, examples[0]["instruction"], group_size, generator, max_new_tokens)
    for example in examples[1:]:
        _prompt_fits(policy, tokenizer, example["instruction"])
    require_type("optimizer", optimizer, torch.optim.Optimizer, "build one on the policy's trainable parameters, "
                 "torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=...)")
    trained = {id(p) for p in policy.parameters() if p.requires_grad}
    if not any(id(p) in trained for group in optimizer.param_groups for p in group["params"]):
        raise ValueError("optimizer holds none of the policy's trainable parameters, so no step would move the "
                         "policy: build it on [p for p in policy.parameters() if p.requires_grad]")


def score_policy(examples, samples: int) -> None:
    require_int("samples", samples, minimum=1)
    instructions(examples)

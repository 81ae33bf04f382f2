"""Not a lesson: the doors of notebook 11 (course_lib/decoding.py): the histories and settings of the penalties and
filters, the streaming loop's settings, beam search's, padded batches' masks, and speculative decoding's two models.

Values inside tensors are read only where that is free (a CPU tensor, outside torch.compile), as in notebook 08's
doors, which these reach through `generation_door`."""

import inspect
import math

import torch
from torch import Tensor

from . import generation as generation_door
from .model import left_padding  # the padding mask's door, GPTModel.forward's (doors/model.py)
from ..config import GPTConfig
from ..guards import (as_device, require_attention_mask, require_int, require_number, require_token_tensor,
                      require_type)

SCORE_RANGE = 1e30  # beam scores (float32) are divided by length ** length_penalty: it stays within 1e-30 .. 1e30


def ngrams(ids, n) -> None:
    """ngrams: n >= 1, and ids a list of ints or a 1-D integer tensor (a batch is measured one row at a time)."""
    require_int("n", n, minimum=1)
    if isinstance(ids, Tensor):
        fine = ids.dim() == 1 and not (ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool)
    else:
        fine = isinstance(ids, (list, tuple)) and all(isinstance(i, int) for i in ids)
    if not fine:
        given = f"shape {tuple(ids.shape)} {ids.dtype}" if isinstance(ids, Tensor) else type(ids).__name__
        raise TypeError(f"ids must be a list of token ids (ints) or a 1-D integer tensor, got {given}: measure a "
                        "batch (batch, tokens) one row at a time, ids[row]")


def history(token_ids, logits) -> None:
    """logits (batch, vocab_size) float, and token_ids (batch, tokens) the integer ids their rows continue, each in
    [0, vocab_size) (read on the CPU): the history of another batch, or a pad of -1, would silently penalise the
    wrong tokens. An empty history (batch, 0) is fine."""
    generation_door.logits_tensor(logits, dims=2)
    if not (isinstance(token_ids, Tensor) and token_ids.numel() == 0 and not token_ids.is_floating_point()):
        require_token_tensor("token_ids", token_ids, dims=2, vocab_size=logits.shape[-1])
    if token_ids.dim() != 2 or token_ids.shape[0] != logits.shape[0]:
        raise ValueError(f"token_ids must be (batch, tokens) with the batch of logits {tuple(logits.shape)}, got "
                         f"shape {tuple(token_ids.shape)}: pass the sequences the logits continue")


def penalize_repetition(logits, token_ids, penalty) -> None:
    history(token_ids, logits)
    require_number("penalty", penalty, 0, math.inf, low_open=True, high_open=True,
                   why="1 changes nothing, above 1 discourages tokens already used (1.2 is common), below 1 "
                   "favours them")


def ban_repeated_ngrams(logits, token_ids, n) -> None:
    history(token_ids, logits)
    require_int("n", n, minimum=1)


def penalize_frequency(logits, token_ids, frequency, presence) -> None:
    history(token_ids, logits)
    for name, value in (("frequency", frequency), ("presence", presence)):
        require_number(name, value, -2, 2, why="the OpenAI API allows -2 to 2; 0 turns the penalty off")


def min_p_filter(logits, min_p) -> None:
    require_number("min_p", min_p, 0, 1, why="0.05-0.1 is common: keep tokens at least that fraction as likely as "
                   "the best one; 0 keeps every token")
    generation_door.logits_tensor(logits)


def decoding_args(min_p, repetition_penalty, no_repeat_ngram_size, frequency_penalty, presence_penalty) -> None:
    """A min-p, penalties and an n-gram size that stream_tokens can use."""
    if min_p is not None:
        require_number("min_p", min_p, 0, 1, why="0.05-0.1 is common; None turns the filter off")
    require_number("repetition_penalty", repetition_penalty, 0, math.inf, low_open=True, high_open=True,
                   why="1 changes nothing, above 1 discourages tokens already used (1.2 is common)")
    require_int("no_repeat_ngram_size", no_repeat_ngram_size, minimum=0)
    for name, value in (("frequency_penalty", frequency_penalty), ("presence_penalty", presence_penalty)):
        require_number(name, value, -2, 2, why="the OpenAI API allows -2 to 2; 0 turns the penalty off")


def penalize(token_ids, prompt_len) -> None:
    """penalize: how many of the history's first tokens are the prompt (the penalties check the rest)."""
    require_int("prompt_len", prompt_len, minimum=0)
    if isinstance(token_ids, Tensor) and prompt_len > token_ids.shape[-1]:
        raise ValueError(f"prompt_len {prompt_len} is more than the {token_ids.shape[-1]} tokens of token_ids: pass "
                         "how many of its first tokens are the prompt")


def stream_tokens(model, token_ids, max_new_tokens, context_length, temperature, top_k, top_p, min_p,
                  repetition_penalty, no_repeat_ngram_size, frequency_penalty, presence_penalty, eos_id, generator,
                  attention_mask) -> int:
    """stream_tokens: every setting, the prompt and its
    padding mask, checked before the first token; returns the context_length the loop uses. A GPU mask's values are
    read here once, on a CPU copy: the forward reads them only on the CPU."""
    if attention_mask is not None and context_length is not None:
        raise ValueError("attention_mask cannot be combined with a sliding window: leave context_length=None and "
                         "keep the longest prompt plus max_new_tokens within the model's context")
    context_length = generation_door.generation_args(model, token_ids, max_new_tokens, context_length, eos_id)
    generation_door.sampling(temperature, top_k, top_p)
    decoding_args(min_p, repetition_penalty, no_repeat_ngram_size, frequency_penalty, presence_penalty)
    if temperature != 0:
        generation_door.temperature_range(temperature, torch.float32)  # the loop divides float32 logits
    if attention_mask is not None:
        mask = attention_mask.cpu() if isinstance(attention_mask, Tensor) else attention_mask
        require_attention_mask(mask, tuple(token_ids.shape), torch.device("cpu"))
        left_padding(mask)
    return context_length


def settings(function: str, given: dict) -> None:
    """The **settings of generate_tokens or stream_text: keywords of stream_tokens, refused here by name (a
    misspelled one would otherwise fail inside the call of the generator, or inside torch.no_grad's wrapper)."""
    from ..decoding import stream_tokens  # this lesson's own function: imported when called, so no import cycle
    known = list(inspect.signature(stream_tokens).parameters)[3:]  # after model, token_ids, max_new_tokens
    unknown = [name for name in given if name not in known]
    if unknown:
        raise TypeError(f"{function} got an unknown setting {unknown[0]!r}: the settings are stream_tokens' "
                        f"keywords, {', '.join(known)}")


def generate_tokens(given: dict) -> None:
    settings("generate_tokens", given)


def stream_text(tokenizer, prompt, given: dict) -> None:
    require_type("prompt", prompt, str, "pass the prompt as text; stream_tokens takes token ids")
    if not (callable(getattr(tokenizer, "encode", None)) and callable(getattr(tokenizer, "decode", None))):
        raise TypeError(f"tokenizer must encode and decode text (the model's CharTokenizer, or gpt2_tokenizer()), "
                        f"got {type(tokenizer).__name__}")
    if not prompt:
        raise ValueError("prompt is empty: give at least one character (GPT-2 can start from '<|endoftext|>')")
    settings("stream_text", given)


def length_penalty_range(length_penalty, max_new_tokens: int) -> None:
    """A finite length penalty whose divisor length ** length_penalty, for every length up to max_new_tokens, stays
    within 1e-30 .. 1e30: the float32 scores divided by it then stay finite and distinct. (length_penalty=inf made
    every score -0.0, and a huge one the same or -inf: the choice among hypotheses was arbitrary.)"""
    require_number("length_penalty", length_penalty, -math.inf, math.inf, low_open=True, high_open=True,
                   why="1 divides by the length, 0 ignores it, > 1 favours longer hypotheses, < 0 shorter ones")
    digits = math.log10(SCORE_RANGE)  # 30
    exponent = abs(length_penalty) * math.log10(max_new_tokens)
    if exponent > digits:
        largest = digits / math.log10(max_new_tokens)
        raise ValueError(f"length_penalty {length_penalty:g} is too large for max_new_tokens {max_new_tokens}: the "
                         f"scores are divided by length ** length_penalty, up to {max_new_tokens} ** "
                         f"{length_penalty:g} = 1e{'-' if length_penalty < 0 else '+'}{exponent:.0f}, outside "
                         "1e-30 .. 1e30, where the float32 scores round to 0 or to -inf and the choice among them is "
                         f"arbitrary; keep |length_penalty| <= {largest:.3g} (-2 to 2 is usual; 1 divides by the "
                         "length)")


def early_stopping_rule(early_stopping) -> None:
    if not (isinstance(early_stopping, bool) or early_stopping == "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")


def beam_search(model, token_ids, num_beams, max_new_tokens, length_penalty, early_stopping, eos_id) -> None:
    """beam_search: one prompt, and every setting the search can use."""
    generation_door.generation_args(model, token_ids, max_new_tokens, None, eos_id)
    if token_ids.shape[0] != 1:
        raise ValueError(f"beam_search takes one prompt, shaped (1, tokens), got {token_ids.shape[0]} rows: "
                         "call it once per prompt")
    require_int("num_beams", num_beams, minimum=1)
    require_int("max_new_tokens", max_new_tokens, minimum=1)
    length_penalty_range(length_penalty, max_new_tokens)
    early_stopping_rule(early_stopping)


def best_extensions(scores, logits, k) -> None:
    generation_door.logits_tensor(logits, dims=2)
    if not isinstance(scores, Tensor) or scores.shape != logits.shape[:1]:
        raise ValueError(f"scores must be one summed log-probability per beam, shape ({logits.shape[0]},) like the "
                         f"rows of logits, got {tuple(getattr(scores, 'shape', ())) or type(scores).__name__}")
    require_int("k", k, minimum=1)


def search_is_over(max_new_tokens, length_penalty, early_stopping) -> None:
    early_stopping_rule(early_stopping)
    require_int("max_new_tokens", max_new_tokens, minimum=1)
    length_penalty_range(length_penalty, max_new_tokens)


def left_pad(prompts, pad_id, device) -> torch.device | None:
    """left_pad: a non-empty list of non-empty lists of ids, a pad id, and a device; returns the device as a
    torch.device (or None)."""
    if not isinstance(prompts, (list, tuple)) or not prompts or not all(
            isinstance(p, (list, tuple)) and p and all(isinstance(i, int) for i in p) for p in prompts):
        raise TypeError("prompts must be a non-empty list of non-empty lists of token ids, e.g. "
                        "[tokenizer.encode(text) for text in texts]")
    require_int("pad_id", pad_id, minimum=0)
    return None if device is None else as_device(device)


def next_token_probs(logits, temperature, top_k, top_p) -> None:
    generation_door.logits_tensor(logits)
    generation_door.sampling(temperature, top_k, top_p)


def draw(probs) -> None:
    require_type("probs", probs, Tensor, "pass probabilities (vocab_size,), e.g. torch.softmax(logits, dim=-1)")


def accept_drafts(proposal, q, p) -> None:
    require_type("p", p, Tensor, "pass the target's probabilities (drafts + 1, vocab_size)")
    if len(q) != len(proposal) or p.shape[0] != len(proposal) + 1:
        raise ValueError(f"q must hold one distribution per draft token ({len(proposal)}), got {len(q)}, and p one "
                         f"row more ({len(proposal) + 1}), got {p.shape[0]}")


def speculative_args(target, draft, token_ids, max_new_tokens, num_draft) -> None:
    """A prompt, length, draft and num_draft speculative_generate can use."""
    generation_door.generation_args(target, token_ids, max_new_tokens, None)
    if token_ids.shape[0] != 1:
        raise ValueError(f"speculative_generate takes one prompt, shaped (1, tokens), got {token_ids.shape[0]} rows")
    require_int("num_draft", num_draft, minimum=1)
    require_type("draft.cfg", getattr(draft, "cfg", None), GPTConfig, "pass a smaller GPTModel as the draft")
    where = next(draft.parameters()).device
    if draft.cfg.vocab_size != target.cfg.vocab_size or where != token_ids.device:
        raise ValueError(f"draft must share the target's vocabulary ({target.cfg.vocab_size} ids) and device "
                         f"({token_ids.device}), got {draft.cfg.vocab_size} ids on {where}: pair models trained "
                         "with the same tokenizer, and move both with .to(device)")


def speculative_generate(target, draft, token_ids, max_new_tokens, num_draft, temperature, top_k, top_p) -> None:
    speculative_args(target, draft, token_ids, max_new_tokens, num_draft)
    generation_door.sampling(temperature, top_k, top_p)
    if temperature != 0:
        generation_door.temperature_range(temperature, torch.float32)  # next_token_probs divides float32 logits

import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from course_lib.config import GPTConfig
from course_lib.model import GPTModel

EOS_ID = 50256  # GPT-2's <|endoftext|>: it separates documents in the training data


def check_logits(logits: Tensor, dims: int | None = None) -> None:
    """Raise a clear error unless logits is a float tensor (..., vocab_size), with `dims` dimensions if given."""
    if not isinstance(logits, Tensor):
        raise TypeError(f"logits must be a torch.Tensor (..., vocab_size), got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a float tensor, got dtype {logits.dtype}: logits are the model's "
                        "raw scores, e.g. model(idx)[:, -1, :]")
    if dims is not None and logits.dim() != dims:
        raise ValueError(f"logits must be {dims}-D (batch, vocab_size), got shape {tuple(logits.shape)}: "
                         "take the last position with logits[:, -1, :]")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have at least one entry in the last (vocabulary) dimension, got "
                         f"shape {tuple(logits.shape)}")


def check_sampling_args(temperature=0.0, top_k=None, top_p=None) -> None:
    """Raise a clear error for a temperature, top_k or top_p no sampler can use."""
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
        raise TypeError(f"temperature must be a number, got {temperature!r} ({type(temperature).__name__})")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}: 0 means greedy "
                         "(argmax), 1 samples the model's own distribution, above 1 flattens it")
    if top_k is not None:
        if not isinstance(top_k, int) or isinstance(top_k, bool):
            raise TypeError(f"top_k must be None or an int, got {top_k!r} ({type(top_k).__name__})")
        if top_k < 1:
            raise ValueError(f"top_k must be None (no limit) or an int >= 1, got {top_k}: top_k=k keeps "
                             "the k most likely tokens, top_k=1 is greedy")
    if top_p is not None:
        if not isinstance(top_p, (int, float)) or isinstance(top_p, bool):
            raise TypeError(f"top_p must be None or a number, got {top_p!r} ({type(top_p).__name__})")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be None (off) or in (0, 1], got {top_p}: top_p=0.9 keeps the most "
                             "likely tokens until their probabilities add up to 0.9, top_p=1 keeps them all")


def scale_logits(logits: Tensor, temperature: float) -> Tensor:
    """Divide the logits by a temperature > 0: below 1 sharpens the distribution, above 1 flattens it."""
    check_logits(logits)
    check_sampling_args(temperature=temperature)
    if temperature == 0:
        raise ValueError("temperature 0 cannot scale logits (it would divide by zero): it stands for greedy "
                         "decoding, so take logits.argmax(dim=-1) instead")
    return logits / temperature


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits of each row and set the others to -inf (probability 0 after softmax).

    Exactly k survive, even when logits tie; k larger than the vocabulary keeps everything."""
    check_logits(logits)
    check_sampling_args(top_k=k)
    k = min(k, logits.shape[-1])
    top = logits.topk(k, dim=-1)  # values and indices, (..., k)
    return torch.full_like(logits, float("-inf")).scatter(-1, top.indices, top.values)


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filter: keep the smallest set of most likely tokens whose probabilities add up to at least p,
    and set the other logits to -inf. The most likely token always survives; p = 1 keeps every token."""
    check_logits(logits)
    check_sampling_args(top_p=p)
    if p == 1:
        return logits
    probs = torch.softmax(logits, dim=-1)  # (..., vocab_size)
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)  # most likely first
    mass_before = F.pad(sorted_probs.cumsum(dim=-1)[..., :-1], (1, 0))  # probability of the tokens ahead
    drop_sorted = mass_before >= p  # the tokens ahead already reach p: this one is not needed
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def check_generator(generator, device: torch.device) -> None:
    """Raise a clear error unless generator is None or a torch.Generator on the device of the tensors."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be None or a torch.Generator, got {type(generator).__name__}: "
                        "create one with torch.Generator(device=...).manual_seed(123)")
    if generator.device.type != device.type:
        raise ValueError(f"generator is on {generator.device} but the tokens are on {device}: create it "
                         f"with torch.Generator(device='{device.type}')")


def sample_next_token(logits: Tensor, temperature: float = 0.0, top_k: int | None = None,
                      top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """Pick one token id per row of next-token logits (batch, vocab_size) -> (batch, 1).

    temperature 0 is greedy (argmax; top_k, top_p and generator change nothing). Otherwise the logits are
    divided by the temperature, filtered by top-k, then by top-p, and one token is drawn from the softmax
    with `generator` (the same seed gives the same tokens)."""
    check_logits(logits, dims=2)
    check_sampling_args(temperature, top_k, top_p)
    check_generator(generator, logits.device)
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # (batch, 1)
    logits = scale_logits(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    probs = torch.softmax(logits, dim=-1)  # (batch, vocab_size), zeros where filtered
    return torch.multinomial(probs, num_samples=1, generator=generator)  # (batch, 1)


def check_generation_args(model: nn.Module, idx: Tensor, max_new_tokens: int, context_size: int | None) -> int:
    """Raise a clear error for a model, prompt, length or window generation cannot use; return the window:
    context_size, or the model's context_length when context_size is None (no cropping)."""
    cfg = getattr(model, "cfg", None)
    if not isinstance(model, nn.Module) or not isinstance(cfg, GPTConfig):
        raise TypeError(f"model must be a GPTModel (an nn.Module with a GPTConfig in model.cfg), got "
                        f"{type(model).__name__}")
    if not isinstance(idx, Tensor):
        raise TypeError(f"idx must be a torch.Tensor of token ids (batch, tokens), got {type(idx).__name__}: "
                        "wrap a list of ids with torch.tensor([ids])")
    if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
        raise TypeError(f"idx must hold integer token ids, got dtype {idx.dtype}: convert with idx.long()")
    if idx.dim() != 2:
        raise ValueError(f"idx must be 2-D (batch, tokens), got shape {tuple(idx.shape)}: for one prompt "
                         "add a batch dimension with idx.unsqueeze(0)")
    if idx.shape[0] == 0 or idx.shape[1] == 0:
        raise ValueError(f"idx is empty, shape {tuple(idx.shape)}: pass at least one prompt of at least "
                         f"one token (to start from nothing, use <|endoftext|>, id {EOS_ID})")
    weight = next(model.parameters(), None)
    if weight is not None and idx.device != weight.device:
        raise ValueError(f"idx is on {idx.device} but the model is on {weight.device}: move the prompt "
                         "with idx.to(...)")
    low, high = idx.min().item(), idx.max().item()
    if high >= cfg.vocab_size:
        raise ValueError(f"idx holds token id {high} >= vocab_size {cfg.vocab_size}: encode the prompt "
                         "with the tokenizer the model was built for")
    if low < 0:
        raise ValueError(f"idx holds token id {low} < 0: token ids run from 0 to {cfg.vocab_size - 1}")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool):
        raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r} "
                        f"({type(max_new_tokens).__name__})")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if context_size is None:
        total = idx.shape[1] + max_new_tokens
        if total > cfg.context_length:
            raise ValueError(f"a prompt of {idx.shape[1]} tokens + max_new_tokens {max_new_tokens} = {total} "
                             f"tokens, more than context_length {cfg.context_length}, and cropping is off: "
                             f"shorten the prompt or max_new_tokens, or pass context_size="
                             f"{cfg.context_length} to keep only the last {cfg.context_length} tokens")
        return cfg.context_length
    if not isinstance(context_size, int) or isinstance(context_size, bool):
        raise TypeError(f"context_size must be None or an int, got {context_size!r} "
                        f"({type(context_size).__name__})")
    if not 1 <= context_size <= cfg.context_length:
        raise ValueError(f"context_size must be in [1, context_length {cfg.context_length}], got "
                         f"{context_size}: it is how many of the last tokens the model reads")
    return context_size


@contextmanager
def eval_mode(model: nn.Module):
    """Switch every submodule to eval mode (dropout off) inside the with-block, then restore each one's mode."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training


def generate_text_simple(model: GPTModel, idx: Tensor, max_new_tokens: int, context_size: int | None) -> Tensor:
    """Greedy decoding the plain way: every step runs the model on the whole sequence (cropped to its last
    context_size tokens) and appends the most likely next token. (batch, tokens) -> (batch, tokens + new)."""
    window = check_generation_args(model, idx, max_new_tokens, context_size)
    with torch.no_grad(), eval_mode(model):
        for _ in range(max_new_tokens):
            logits = model(idx[:, -window:])  # (batch, tokens, vocab_size): every position, every step
            next_id = logits[:, -1, :].argmax(dim=-1, keepdim=True)  # (batch, 1): the most likely token
            idx = torch.cat([idx, next_id], dim=1)  # (batch, tokens + 1)
    return idx


def generate(model: GPTModel, idx: Tensor, max_new_tokens: int, context_size: int | None = None,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             eos_id: int | None = None, use_cache: bool = True,
             generator: torch.Generator | None = None) -> Tensor:
    """Extend each prompt in idx (batch, tokens) by up to max_new_tokens tokens -> (batch, tokens + new).

    context_size=None: no cropping, and the prompt plus max_new_tokens must fit in the context; otherwise the
    model reads only the last context_size tokens. temperature/top_k/top_p/generator: see sample_next_token.
    eos_id: a sequence that produced it is finished, the rest of its row is filled with eos_id, and the loop
    stops early once every sequence is finished. use_cache: feed only the newest token and keep the keys and
    values of the earlier ones (same tokens as use_cache=False, fewer computations). Runs without gradients
    and in eval mode; the model's modes are restored afterwards."""
    window = check_generation_args(model, idx, max_new_tokens, context_size)
    check_sampling_args(temperature, top_k, top_p)
    check_generator(generator, idx.device)
    if eos_id is not None and (not isinstance(eos_id, int) or isinstance(eos_id, bool)
                               or not 0 <= eos_id < model.cfg.vocab_size):
        raise ValueError(f"eos_id must be None or a token id in [0, {model.cfg.vocab_size - 1}], got "
                         f"{eos_id!r}: for GPT-2's <|endoftext|> pass {EOS_ID}")
    if not isinstance(use_cache, bool):
        raise TypeError(f"use_cache must be True or False, got {use_cache!r}")
    finished = torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)  # (batch,)
    caches = None
    with torch.no_grad(), eval_mode(model):
        for _ in range(max_new_tokens):
            if not use_cache:
                logits = model(idx[:, -window:], last_only=True)  # the whole window, every step
            elif caches is None or len(caches[0]) == window:  # first step, or the window is full: rebuild
                caches = model.new_kv_caches()
                logits = model(idx[:, -window:], kv_caches=caches, last_only=True)
            else:
                logits = model(idx[:, -1:], kv_caches=caches, last_only=True)  # only the newest token
            next_id = sample_next_token(logits[:, -1, :], temperature, top_k, top_p, generator)  # (batch, 1)
            if eos_id is not None:
                next_id = next_id.masked_fill(finished.unsqueeze(1), eos_id)  # finished rows stay finished
                finished = finished | (next_id[:, 0] == eos_id)
            idx = torch.cat([idx, next_id], dim=1)  # (batch, tokens + 1)
            if eos_id is not None and bool(finished.all()):
                break
    return idx

"""Not a lesson: the doors of notebook 08 (course_lib/generation.py): the generation loops' model, prompt, lengths and
end token, the samplers' logits, temperature, top-k and top-p, and the caches and the fixed-shape decoder that
notebook 08 builds. The doors of the cached forward live with GPTModel's (doors/model.py).

Values inside tensors are read only where that is free (a CPU tensor, outside torch.compile): on a GPU a read would
make the host wait for the device, and in a compiled graph it would break the graph."""

import math

import torch
from torch import Tensor, nn

from ..attention import MultiHeadAttention
from ..config import GPTConfig
from ..guards import require_int, require_number, require_token_tensor, require_type, values_readable
from ..model import GPTModel
from ..tokenization import EOS_ID
from .model import cache_list, static_append  # the caches' doors, GPTModel.forward's too (doors/model.py)


def generation_args(model: nn.Module, token_ids: Tensor, max_new_tokens: int, context_length: int | None,
                    eos_id: int | None = None) -> int:
    """A model, prompt, length, context window and end token generation can use; returns how many of the last tokens
    the model reads: context_length, or the model's own when it is None."""
    cfg = getattr(model, "cfg", None)  # a GPTModel, or a wrapper that passes its attributes on (torch.compile)
    require_type("model.cfg", cfg, GPTConfig, "pass a GPTModel, built with GPTModel(cfg)")
    require_token_tensor("token_ids", token_ids, dims=2, vocab_size=cfg.vocab_size)
    require_int("max_new_tokens", max_new_tokens, minimum=0)
    if context_length is None and token_ids.shape[1] + max_new_tokens > cfg.context_length:
        raise ValueError(f"a prompt of {token_ids.shape[1]} tokens + max_new_tokens {max_new_tokens} = "
                         f"{token_ids.shape[1] + max_new_tokens} tokens, more than the model's context_length "
                         f"{cfg.context_length}, and cropping is off: shorten the prompt or max_new_tokens, or pass "
                         f"context_length={cfg.context_length} to keep only the last {cfg.context_length} tokens")
    if context_length is not None:
        require_int("context_length", context_length, minimum=1)
        require_number("context_length", context_length, 1, cfg.context_length, why="it is how many of the last "
                       "tokens the model reads, at most the model's own context_length")
    if eos_id is not None:  # an id the model can never produce would never stop a row
        require_int("eos_id", eos_id, minimum=0)
        require_number("eos_id", eos_id, 0, cfg.vocab_size - 1, why=f"for GPT-2's <|endoftext|> pass {EOS_ID}")
    return cfg.context_length if context_length is None else context_length


def sampling(temperature=0.0, top_k=None, top_p=None) -> None:
    """A temperature, top_k and top_p a sampler can use (None turns a filter off)."""
    require_number("temperature", temperature, 0, math.inf, high_open=True,
                   why="0 means greedy (argmax), 1 samples the model's own distribution, above 1 flattens it")
    if top_k is not None:  # None: no top-k filter
        require_int("top_k", top_k, minimum=1)
    if top_p is not None:  # None: no top-p filter
        require_number("top_p", top_p, 0, 1, low_open=True, why="top_p=0.9 keeps the most likely tokens until "
                       "their probabilities add up to 0.9, top_p=1 keeps them all")


def logits_tensor(logits, dims: int | None = None) -> None:
    """A floating-point tensor (..., vocab_size) with at least one token; with `dims`, exactly that many dimensions."""
    if not isinstance(logits, Tensor) or not logits.dtype.is_floating_point:
        got = f"dtype {logits.dtype}" if isinstance(logits, Tensor) else type(logits).__name__
        raise TypeError(f"logits must be a floating-point tensor of scores (..., vocab_size), got {got}: pass the "
                        "model's output (token ids are not logits), or convert with .float()")
    if logits.dim() == 0 or logits.shape[-1] == 0 or (dims is not None and logits.dim() != dims):
        shape = "2-D (batch, vocab_size)" if dims == 2 else "(..., vocab_size)"
        raise ValueError(f"logits must be {shape} with at least one token, got shape {tuple(logits.shape)}: for "
                         "one row use logits.unsqueeze(0); of the model's output (batch, tokens, vocab_size) take "
                         "the last position, logits[:, -1, :]")


def temperature_range(temperature, dtype: torch.dtype) -> None:
    """A temperature > 0 that logits of `dtype` can be divided by. The division runs in float32 at least
    (promote_types(dtype, float32): float16 and bfloat16 logits are divided in float32), and the temperature must be
    at least that dtype's epsilon (1.2e-07 in float32): logits / temperature then stays finite for every logit up to
    finfo.max * eps in magnitude (4e31 in float32, any float16 logit), and a smaller temperature samples nothing that
    temperature 0 (greedy) would not."""
    require_number("temperature", temperature, 0, math.inf, low_open=True, high_open=True, why="temperature 0 "
                   "stands for greedy decoding, so take logits.argmax(dim=-1) instead of dividing by zero")
    divided_in = torch.promote_types(dtype, torch.float32)
    floor = torch.finfo(divided_in).eps
    if temperature < floor:
        raise ValueError(f"temperature must be at least {floor:.3g} for {dtype} logits, got {temperature:g}: they are "
                         f"divided in {divided_in}, and below its epsilon logits / temperature can overflow to inf "
                         "while sampling nothing that greedy decoding would not; for greedy decoding pass "
                         "temperature 0")


def scale_logits(logits, temperature) -> None:
    """scale_logits: float logits, and a temperature their division by stays finite (temperature_range). On the CPU,
    where reading is free, the largest finite logit is read too, and a division that would still overflow (a logit
    beyond finfo.max * eps) is refused."""
    logits_tensor(logits)
    temperature_range(temperature, logits.dtype)
    if temperature < 1 and logits.numel() and values_readable(logits):
        largest = float(logits.detach().abs().nan_to_num(0.0, posinf=0.0).max())  # -inf and +inf are not divided
        limit = torch.finfo(torch.promote_types(logits.dtype, torch.float32)).max
        if largest / temperature > limit:
            raise ValueError(f"logits / temperature {temperature:g} overflows: the largest logit is {largest:.3g}, "
                             f"and {largest:.3g} / {temperature:g} > {limit:.3g}; such logits come from a broken "
                             "model (check its weights and inputs), or pass temperature 0 for greedy decoding")


def top_k_filter(logits, k) -> None:
    logits_tensor(logits)
    sampling(top_k=k)


def top_p_filter(logits, p) -> None:
    logits_tensor(logits)
    sampling(top_p=p)


def sample_next_token(logits, temperature, top_k, top_p) -> None:
    """sample_next_token: logits (batch, vocab_size), the settings, and (on the CPU, where reading is free) logits a
    token can be drawn from: no NaN, no +inf, no row that is all -inf."""
    logits_tensor(logits, dims=2)
    sampling(temperature, top_k, top_p)
    if values_readable(logits) and bool(
            (torch.isnan(logits) | (logits == math.inf)).any() | (logits == -math.inf).all(dim=-1).any()):
        raise ValueError("logits hold NaN or +inf, or a row that is all -inf, so no token can be chosen: the model's "
                         "output is broken (diverged weights, or an overflow in float16); check the model and its "
                         "inputs")
    if temperature != 0:
        scale_logits(logits, temperature)


def eval_mode(model) -> None:
    require_type("model", model, nn.Module, "pass the model itself, like GPTModel(cfg)")


def model_dtype(model) -> torch.dtype:
    """The dtype of the model's weights (float32 for a model without any)."""
    weight = next(iter(model.parameters()), None) if isinstance(model, nn.Module) else None
    return torch.float32 if weight is None or not weight.dtype.is_floating_point else weight.dtype


def generate(model, token_ids, max_new_tokens, context_length, temperature, top_k, top_p, eos_id) -> int:
    """generate: everything generation_args and sampling check, and a temperature the model's logits can be divided
    by (temperature_range, in the dtype sample_next_token divides in); returns the context_length the loop uses."""
    context_length = generation_args(model, token_ids, max_new_tokens, context_length, eos_id)
    sampling(temperature, top_k, top_p)
    if temperature != 0:
        temperature_range(temperature, model_dtype(model))
    return context_length


def decoding_loop(model, token_ids, max_new_tokens, context_length, choose, eos_id, model_args) -> int:
    """decoding_loop: what generation_args checks, a choice of the next token and the model's extra arguments as
    functions; returns the context_length the loop uses."""
    context_length = generation_args(model, token_ids, max_new_tokens, context_length, eos_id)
    if not callable(choose):
        raise TypeError(f"choose must be a function (logits, token_ids) -> next ids (batch, 1), got "
                        f"{type(choose).__name__}: e.g. lambda logits, token_ids: sample_next_token(logits)")
    if model_args is not None and not callable(model_args):
        raise TypeError(f"model_args must be None or a function token_ids -> dict of the model's keyword arguments, "
                        f"got {type(model_args).__name__}: e.g. lambda token_ids: {{}}")
    return context_length


def static_kv_cache(capacity) -> None:
    require_int("capacity", capacity, minimum=1)


def next_token_logits(token_ids, caches, context_length) -> None:
    require_token_tensor("token_ids", token_ids, dims=2)  # its shape; the model checks the values it is fed
    require_int("context_length", context_length, minimum=1)
    if not isinstance(caches, (list, tuple)) or not caches:
        raise ValueError("caches must be model.new_kv_caches() or one StaticKVCache per block: they are refilled here")


def graphed_greedy_decoder(model, capacity, batch, compile) -> None:
    require_type("model", model, GPTModel, "build one with GPTModel(cfg)")
    other = next((block.att for block in model.trf_blocks if not isinstance(block.att, MultiHeadAttention)), None)
    if other is not None:  # its step feeds GPT-2's blocks; rotary attention would need the positions too
        raise TypeError(f"GraphedGreedyDecoder runs GPT-2's attention (MultiHeadAttention); this model's blocks use "
                        f"{type(other).__name__} (notebooks 16 and 17): decode it with generate()")
    require_int("capacity", capacity, minimum=2)  # the prompt and the new tokens
    require_number("capacity", capacity, 2, model.cfg.context_length, why="no position past the model's context")
    require_int("batch", batch, minimum=1)
    if not (isinstance(compile, bool) or compile == "max-autotune-no-cudagraphs"):  # other modes bring graphs
        raise ValueError(f"compile must be False, True or 'max-autotune-no-cudagraphs', got {compile!r}")


def capture(warmups) -> None:
    require_int("warmups", warmups, minimum=1)  # torch.compile compiles in the first run: never inside a recording


def graphed_generate(decoder, token_ids, max_new_tokens) -> None:
    """GraphedGreedyDecoder.generate: a prompt and a length that fit the decoder as it was built, and the model's
    weights still where the decoder (and its graph) read them."""
    batch, capacity = decoder.tokens.shape
    require_token_tensor("token_ids", token_ids, dims=2, vocab_size=decoder.model.cfg.vocab_size,
                         device=decoder.tokens.device)
    require_int("max_new_tokens", max_new_tokens, minimum=0)
    prompt = token_ids.shape[1]
    if token_ids.shape[0] != batch or prompt + max_new_tokens > capacity:
        raise ValueError(f"this decoder holds {batch} row(s) of up to {capacity} tokens; token_ids has "
                         f"{token_ids.shape[0]} row(s) of {prompt} tokens + max_new_tokens {max_new_tokens}: build a "
                         f"GraphedGreedyDecoder(model, capacity={prompt + max_new_tokens}, batch={token_ids.shape[0]})"
                         f" (at most the model's context_length, {decoder.model.cfg.context_length})")
    if [(p.data_ptr(), p.dtype) for p in decoder.model.parameters()] != decoder.weights:  # would read freed memory
        raise RuntimeError("the model's weights were moved, converted or replaced since this decoder was built: build "
                           "a new GraphedGreedyDecoder for the model as it is now")

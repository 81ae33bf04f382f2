"""Not a lesson: the doors of notebook 07 (course_lib/model.py): the config a GPTModel is built from, what its forward
reads (token ids, once, for every layer behind it; the KV caches and last_only of notebook 08; the left-padding mask
of notebook 11), the padding helpers' masks, the model init_gpt2_weights draws, and trace_shapes' arguments.

Values inside tensors are read only where that is free (a CPU tensor, outside torch.compile): on a GPU a read would
make the host wait for the device, and in a compiled graph it would break the graph."""

from torch import Tensor, nn

from ..attention import KVCache
from ..config import GPTConfig
from ..guards import (require_attention_mask, require_bool, require_int, require_token_tensor, require_type,
                      values_readable)
from . import config as config_door


def gpt_config(cfg) -> None:
    """GPTModel(cfg): a GPTConfig (notebook 00's door)."""
    config_door.gpt_config(cfg)


def cache_list(kv_caches, n_blocks: int) -> None:
    """None, or a list of one KVCache per block, all holding the same positions: a missing cache or a half-filled
    set would silently give the new tokens wrong positions or no memory of the earlier ones."""
    if kv_caches is None:
        return
    if (not isinstance(kv_caches, (list, tuple)) or len(kv_caches) != n_blocks
            or any(not isinstance(cache, KVCache) or len(cache) != len(kv_caches[0]) for cache in kv_caches)):
        raise ValueError(f"kv_caches must be model.new_kv_caches(): one cache per block ({n_blocks}), all holding "
                         "the same positions; start again with new ones")


def static_append(cache, rows: int, new: int) -> None:
    """StaticKVCache.append of `new` positions for `rows` sequences: room for them, and the batch the stores were
    allocated for (new keys of another batch would broadcast into them, silently). Shapes only, no device read."""
    start, end = len(cache), len(cache) + new
    if end > cache.capacity:
        raise ValueError(f"{start} cached + {new} new positions > capacity {cache.capacity}: create "
                         "StaticKVCache(capacity) with room for the prompt and every new token, or crop() it")
    if cache.key_store is not None and rows != cache.key_store.shape[0]:
        raise ValueError(f"this StaticKVCache holds {cache.key_store.shape[0]} rows (sequences), the new keys "
                         f"{rows} rows: a set of caches serves one batch; start again with new ones")


def left_padding(attention_mask: Tensor) -> None:
    """Every row: its 0s (pads) first, then 1s up to the newest token. The values are read only where that is free,
    on the CPU outside torch.compile; stream_tokens reads a GPU mask once, at its door, not in every forward."""
    real = attention_mask.long()  # (batch, tokens so far)
    if not values_readable(real):
        return
    if bool((real[:, 1:] < real[:, :-1]).any()) or not bool(real[:, -1].all()):
        raise ValueError("attention_mask must pad on the left: in every row the 0s (pads) come first, then 1s up "
                         "to the newest token (right padding would put pads between a prompt and its continuation)")


def forward_args(model, token_ids: Tensor, kv_caches: list[KVCache] | None, last_only: bool,
                 attention_mask: Tensor | None = None) -> int:
    """GPTModel.forward: raise a clear error for token ids, caches, a last_only or a padding mask that forward cannot
    use; return the number of cached positions, where the new tokens start. The ids must be an integer tensor
    (batch, tokens) on the model's device that fits the context after the cached positions, and (where reading is
    free: on the CPU, outside torch.compile) every id inside the vocabulary. Static caches are checked here for room
    and batch, all of them before any block appends, so that a refused call writes nothing. The mask covers the
    cached and the new positions, on the ids' device, and pads on the left."""
    cache_list(kv_caches, len(model.trf_blocks))
    require_bool("last_only", last_only)  # "no" would be truthy: the last position only, silently
    start_pos = 0 if kv_caches is None else len(kv_caches[0])  # new tokens continue after the cached ones
    require_token_tensor("token_ids", token_ids, dims=2, vocab_size=model.cfg.vocab_size,
                         device=model.out_head.weight.device, max_tokens=model.cfg.context_length - start_pos)
    if kv_caches and kv_caches[0].keys is not None and kv_caches[0].keys.shape[0] != token_ids.shape[0]:
        raise ValueError(f"kv_caches hold {kv_caches[0].keys.shape[0]} rows (sequences) but token_ids has "
                         f"{token_ids.shape[0]} rows: a set of caches serves one batch; start again with new ones")
    for cache in kv_caches or ():
        if hasattr(cache, "capacity") and hasattr(cache, "key_store"):  # a StaticKVCache (notebook 08)
            static_append(cache, token_ids.shape[0], token_ids.shape[1])
    if attention_mask is not None:
        require_attention_mask(attention_mask, (token_ids.shape[0], start_pos + token_ids.shape[1]), token_ids.device)
        left_padding(attention_mask)
    return start_pos


def mask_columns(attention_mask, tokens) -> None:
    """attention_mask (batch, tokens so far), a tensor, and tokens: how many of its last columns are the new tokens."""
    if not isinstance(attention_mask, Tensor):
        raise TypeError(f"attention_mask must be a tensor of 1s (real tokens) and 0s (padding), as left_pad returns, "
                        f"got {type(attention_mask).__name__}")
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be (batch, tokens so far), got shape {tuple(attention_mask.shape)}")
    require_int("tokens", tokens, minimum=0)
    if tokens > attention_mask.shape[1]:
        raise ValueError(f"tokens {tokens} is more than the {attention_mask.shape[1]} columns of attention_mask: the "
                         "mask covers every token so far, the new ones included")


def positions_after_padding(attention_mask, tokens) -> None:
    mask_columns(attention_mask, tokens)
    left_padding(attention_mask)


def init_gpt2_weights(model) -> None:
    """init_gpt2_weights: a module with a GPTConfig as its cfg (GPTModel's layout; notebook 16's ModernGPT has it)."""
    if not (isinstance(model, nn.Module) and isinstance(getattr(model, "cfg", None), GPTConfig)):
        raise TypeError(f"model must be a GPTModel (or a model with its layout and a GPTConfig), got "
                        f"{type(model).__name__}: build one with GPTModel(cfg), which calls init_gpt2_weights itself")


def trace_shapes(model, max_depth) -> None:
    """trace_shapes: a module to run, and max_depth None (every level) or at least 1. The token ids are the model's
    to check."""
    require_type("model", model, nn.Module, "pass the model itself, like GPTModel(cfg)")
    require_int("max_depth", 1 if max_depth is None else max_depth, minimum=1)  # None: every level

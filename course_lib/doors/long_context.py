"""Not a lesson: the doors of notebook 17 (course_lib/long_context.py): a LongConfig's new fields (known choices, a
window, one type per layer, the numbers each rotary stretch needs), the arguments of the stretches, the window mask
and the ring cache, and a Hugging Face folder of the families load_long reads (its config.json and its tensors,
refused before anything is built). The forwards have none: what reaches them was checked at the edge."""

import math

import torch
from torch import Tensor

from ..config import GPTConfig
from ..guards import require_bool, require_int, require_number, require_type
from . import modern as modern_door

LONG_FIELDS = ("rope_type", "rope_factor", "original_context", "low_freq_factor", "high_freq_factor", "beta_fast",
               "beta_slow", "attention_factor", "sliding_window", "layer_types", "local_rope_theta", "gate_act",
               "post_norms", "embed_scale", "query_scale", "attn_softcap", "final_softcap")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
GATES = ("silu", "gelu_tanh")


def _positive(name: str, value, why: str = "") -> None:
    require_number(name, value, 0, math.inf, low_open=True, high_open=True, **({"why": why} if why else {}))


def long_fields(cfg) -> None:
    """LongConfig's __post_init__: known choices, and the numbers each switch needs, named by their field."""
    if cfg.rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type must be one of {ROPE_TYPES}, got {cfg.rope_type!r}")
    if cfg.gate_act not in GATES:
        raise ValueError(f"gate_act must be one of {GATES}, got {cfg.gate_act!r}")
    if cfg.gate_act != "silu" and cfg.ffn != "swiglu":
        raise ValueError(f"gate_act {cfg.gate_act!r} with ffn {cfg.ffn!r}: a gate needs the gated feed-forward; "
                         "set ffn='swiglu' (its gate then uses gate_act)")
    if cfg.rope_type == "default" and cfg.rope_factor != 1.0:
        raise ValueError(f"rope_factor {cfg.rope_factor!r} with rope_type 'default': the default angles are not "
                         "stretched, so the factor would be ignored; set rope_type ('linear', 'llama3' or 'yarn'), "
                         "or leave rope_factor 1.0")
    if cfg.rope_type != "default":
        if cfg.positions != "rotary":
            raise ValueError(f"rope_type {cfg.rope_type!r} with positions {cfg.positions!r}: stretching the angles "
                             "needs rotary positions; set positions='rotary'")
        _positive("rope_factor", cfg.rope_factor, "it is how many times longer the context becomes")
    if cfg.rope_type in ("llama3", "yarn"):
        if cfg.original_context is None:
            raise ValueError(f"rope_type {cfg.rope_type!r} needs original_context, the context the model was "
                             "pretrained at (Llama 3.2: 8192)")
        require_int("original_context", cfg.original_context, minimum=1)
    if cfg.rope_type == "llama3":
        _positive("low_freq_factor", cfg.low_freq_factor)
        _positive("high_freq_factor", cfg.high_freq_factor)
        if not cfg.high_freq_factor > cfg.low_freq_factor:
            raise ValueError(f"high_freq_factor {cfg.high_freq_factor} must be above low_freq_factor "
                             f"{cfg.low_freq_factor}: the blend runs from one to the other (Llama 3: 4 and 1)")
    if cfg.rope_type == "yarn":
        _positive("beta_slow", cfg.beta_slow)
        _positive("beta_fast", cfg.beta_fast)
        if not cfg.beta_fast > cfg.beta_slow:
            raise ValueError(f"beta_fast {cfg.beta_fast} must be above beta_slow {cfg.beta_slow}: the ramp runs "
                             "from the pairs that turn beta_fast times to those that turn beta_slow times (32 and 1)")
    for name in ("attention_factor", "local_rope_theta", "query_scale", "attn_softcap", "final_softcap"):
        if getattr(cfg, name) is not None:
            _positive(name, getattr(cfg, name))
    if cfg.local_rope_theta is not None and cfg.local_rope_theta <= 1:
        raise ValueError(f"local_rope_theta {cfg.local_rope_theta} must be above 1: {modern_door.THETA_WHY}")
    if cfg.sliding_window is not None:
        require_int("sliding_window", cfg.sliding_window, minimum=1)
    if cfg.layer_types is not None:
        if not isinstance(cfg.layer_types, tuple) or len(cfg.layer_types) != cfg.n_layers:
            raise ValueError(f"layer_types must be a tuple of n_layers={cfg.n_layers} entries, 'local' or 'global', "
                             f"got {cfg.layer_types!r}")
        if any(kind not in ("local", "global") for kind in cfg.layer_types):
            raise ValueError(f"layer_types holds {sorted(set(cfg.layer_types) - {'local', 'global'})}: each entry is "
                             "'local' (the sliding window) or 'global' (every earlier token)")
        if "local" in cfg.layer_types and cfg.sliding_window is None:
            raise ValueError("layer_types has local layers but sliding_window is None: set the window they use")
    for name in ("post_norms", "embed_scale"):
        require_bool(name, getattr(cfg, name))
    if cfg.embed_scale and cfg.positions != "rotary":
        raise ValueError("embed_scale with learned positions: the scale multiplies the token table of a rotary "
                         "model (Gemma); set positions='rotary'")


def long_config(cfg, fix: str = "build one with LongConfig(...); LongConfig() is GPT-2") -> None:
    """A LongConfig, known by its switches (so the notebook's own class, before its export, passes too)."""
    switches = modern_door.MODERN_FIELDS + LONG_FIELDS  # a ModernConfig or a dict fails here, not deep in a build
    if not (isinstance(cfg, GPTConfig) and all(hasattr(cfg, name) for name in switches)):
        raise TypeError(f"cfg must be a LongConfig, got {type(cfg).__name__}: {fix}")


def scaling(inv_freq, cfg, kind: str) -> None:
    """llama3_inv_freq: a LongConfig of that rope_type, and the speeds as a 1-D float tensor."""
    long_config(cfg)
    if cfg.rope_type != kind:
        raise ValueError(f"cfg.rope_type is {cfg.rope_type!r}: this is the {kind!r} stretch; build the config with "
                         f"rope_type={kind!r} and its numbers")
    if not isinstance(inv_freq, Tensor) or inv_freq.dim() != 1 or not inv_freq.is_floating_point():
        raise TypeError(f"inv_freq must be a 1-D float tensor (head_dim / 2,), Rotary(...).inv_freq(), got "
                        f"{getattr(inv_freq, 'shape', type(inv_freq).__name__)}")


def yarn_ramp(cfg, theta, pairs) -> None:
    """yarn_ramp: a YaRN LongConfig, a theta above 1, and at least one pair."""
    scaling(torch.ones(1), cfg, "yarn")
    require_number("theta", theta, 1, math.inf, low_open=True, high_open=True, why=modern_door.THETA_WHY)
    require_int("pairs", pairs, minimum=1)


def window_may_attend(query_columns, key_columns, window) -> None:
    """window_may_attend: two 1-D integer tensors of columns on one device, and a window of at least 1 or None."""
    for name, columns in (("query_columns", query_columns), ("key_columns", key_columns)):
        integer = isinstance(columns, Tensor) and not (columns.is_floating_point() or columns.is_complex()
                                                        or columns.dtype == torch.bool)  # bools cannot subtract
        if not integer or columns.dim() != 1:
            raise TypeError(f"{name} must be a 1-D integer tensor of stream positions (torch.arange(...)), got "
                            f"{getattr(columns, 'shape', type(columns).__name__)}")
    if query_columns.device != key_columns.device:
        raise ValueError(f"query_columns are on {query_columns.device}, key_columns on {key_columns.device}: put "
                         "both on the model's device")
    if window is not None:
        require_int("window", window, minimum=1)


def ring_kv_cache(window, spare) -> None:
    """RingKVCache(window, spare): at least one slot in the window, and no negative spare."""
    require_int("window", window, minimum=1)
    require_int("spare", spare, minimum=0)


def ring_crop(cache, length) -> None:
    """RingKVCache.crop: 0 (forget all), a length at or past what it holds (nothing to forget, as KVCache.crop), or
    back by at most its spare slots; further back, the window before `length` is already overwritten."""
    require_int("length", length, minimum=0)
    spare = cache.slots - cache.window
    if 0 < length < len(cache) - spare:
        raise ValueError(f"a RingKVCache of window {cache.window} with {spare} spare slots holding {len(cache)} "
                         f"positions cannot crop to {length}: it can take back at most {spare} positions (the slots "
                         "of older ones hold newer ones now); crop to 0 and refill, or build the caches with more "
                         "spare slots, model.new_kv_caches(spare=...)")


def ring_cache_bytes(cfg, tokens, batch, bytes_per_number, spare) -> None:
    """ring_cache_bytes: a LongConfig, and counts (tokens may be 0)."""
    long_config(cfg, "pass the model's LongConfig")
    modern_door.kv_cache_bytes(cfg, tokens, batch, bytes_per_number)
    require_int("spare", spare, minimum=0)


def hf_config(hf, source: str) -> None:
    """long_config_from_hf: a parsed config.json of a family load_long reads, with nothing LongGPT does not build;
    the Llama part is checked by notebook 16's door when modern_config_from_hf reads it."""
    from ..long_context import HF_LONG_TYPES, hf_rope  # this lesson's own: imported when called, no import cycle
    require_type("hf", hf, dict, "pass the parsed config.json: json.loads(path.read_text())")
    if hf.get("model_type") not in HF_LONG_TYPES:
        raise ValueError(f"{source}: model_type {hf.get('model_type')!r}; load_long reads {HF_LONG_TYPES} (for "
                         "GPT-2 use load_gpt2 of notebook 10)")
    for key in ("rope_parameters", "rope_scaling"):
        if hf.get(key) is not None and not isinstance(hf[key], dict):
            raise ValueError(f"{source}: {key} is {hf[key]!r}, not an object: save the folder again with "
                             "save_pretrained")
    per_type = hf.get("rope_parameters") or {}
    for kind in ("full_attention", "sliding_attention"):
        if kind in per_type and not isinstance(per_type[kind], dict):
            raise ValueError(f"{source}: rope_parameters[{kind!r}] is {per_type[kind]!r}, not an object: save the "
                             "folder again with save_pretrained")
    rope, _ = hf_rope(hf)
    refused = {f"rope_type {rope['rope_type']!r}": rope["rope_type"] not in ROPE_TYPES,
               "YaRN's mscale and mscale_all_dim (DeepSeek)": bool(rope.get("mscale") or rope.get("mscale_all_dim")),
               "YaRN without truncation (truncate: false)": rope.get("truncate", True) is False,
               "partial rotary (partial_rotary_factor)": rope.get("partial_rotary_factor", 1.0) != 1.0,
               "bidirectional attention": bool(hf.get("use_bidirectional_attention")),
               "attention_bias": hf.get("attention_bias", False), "mlp_bias": hf.get("mlp_bias", False)}
    act = hf.get("hidden_activation") or hf.get("hidden_act", "silu")
    refused[f"hidden activation {act!r}"] = act not in (("gelu_pytorch_tanh",) if hf["model_type"].startswith("gemma")
                                                       else ("silu",))
    if any(refused.values()):
        raise ValueError(f"{source}: {', '.join(k for k, v in refused.items() if v)}: not built in LongGPT; use "
                         "transformers for it")
    if rope["rope_type"] in ("llama3", "yarn") and "original_max_position_embeddings" not in rope:
        raise ValueError(f"{source}: rope {rope['rope_type']!r} without original_max_position_embeddings: save the "
                         "folder again with save_pretrained")
    if rope["rope_type"] != "default" and "factor" not in rope:
        raise ValueError(f"{source}: rope {rope['rope_type']!r} without its factor: save the folder again with "
                         "save_pretrained")
    for key in ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "attention_factor"):
        if rope.get(key) is not None:  # LongConfig would take float("8"), silently
            require_number(f"{source}: rope_parameters.{key}", rope[key])
    if rope.get("original_max_position_embeddings") is not None:
        require_int(f"{source}: rope_parameters.original_max_position_embeddings",
                    rope["original_max_position_embeddings"], minimum=1)
    for key in ("sliding_window", "sliding_window_pattern", "max_window_layers"):
        if hf.get(key) is not None:
            require_int(f"{source}: {key}", hf[key], minimum=1 if key != "max_window_layers" else 0)
    if hf.get("layer_types") is not None:
        known = ("sliding_attention", "full_attention")
        if not isinstance(hf["layer_types"], list) or any(t not in known for t in hf["layer_types"]):
            raise ValueError(f"{source}: layer_types must list {known} per layer, got {hf['layer_types']!r}")


def hf_state(hf_state, cfg, names: dict[str, str], gemma, source: str) -> None:
    """long_state_from_hf: notebook 16's check of every tensor, against LongGPT(cfg)'s shapes; gemma a bool."""
    from ..long_context import LongGPT  # this lesson's own class: imported when called, so no import cycle
    require_bool("gemma", gemma)  # whether the norms store w (Gemma) or the scale itself
    modern_door.hf_state(hf_state, cfg, names, source, LongGPT)


def load_long(path, device) -> torch.device:
    """load_long: notebook 16's folder checks (config.json and the weights, a device this machine has)."""
    return modern_door.load_modern(path, device)


def layer_index(cfg, layer) -> None:
    """LongConfig.is_local: the index of one of its blocks."""
    require_int("layer", layer, minimum=0)
    if layer >= cfg.n_layers:
        raise ValueError(f"layer {layer} is past the last block: the config has n_layers={cfg.n_layers}, numbered "
                         f"0 .. {cfg.n_layers - 1}")


def softcap(x, cap) -> None:
    """softcap: a tensor, and a cap above 0 (at 0 the formula divides by zero; below, it flips the sign)."""
    require_type("x", x, Tensor, "pass the scores or logits as a tensor")
    _positive("cap", cap, "the outputs stay inside (-cap, cap); Gemma 2 uses 50 for scores, 30 for logits")


def local_attention(cfg, local) -> None:
    """LocalAttention(cfg, local): a LongConfig, and local True only where the config has a window."""
    long_config(cfg)
    require_bool("local", local)
    if local and cfg.sliding_window is None:
        raise ValueError("local=True but cfg.sliding_window is None: a local layer needs the window it slides; set "
                         "sliding_window in the config, or build the layer with local=False")


def ring_caches(model, kv_caches) -> None:
    """LongGPT.forward: a RingKVCache only on a local layer, with at least that layer's window of slots (fewer, or
    one on a global layer, would drop keys the layer attends to, silently)."""
    for i, (block, cache) in enumerate(zip(model.trf_blocks, kv_caches or ())):
        window = block.att.window
        if hasattr(cache, "seen") and hasattr(cache, "window") and (window is None or cache.window < window):
            layer = "a global layer (every earlier token)" if window is None else f"a local layer of window {window}"
            raise ValueError(f"kv_caches[{i}] is a RingKVCache of window {cache.window} on {layer}: it would drop "
                             "keys the layer reads; use model.new_kv_caches()")

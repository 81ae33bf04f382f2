"""Not a lesson: the doors of notebook 00 (course_lib/config.py): a GPTConfig's fields, and the config every class of
the model is built from."""

import torch

from ..guards import require_bool, require_int, require_number, require_type


def config_fields(cfg) -> None:
    """GPTConfig's __post_init__: every field a usable value, emb_dim divisible by n_heads."""
    for name in ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers"):
        require_int(name, getattr(cfg, name), minimum=1)
    if cfg.emb_dim % cfg.n_heads != 0:
        raise ValueError(f"emb_dim {cfg.emb_dim} is not divisible by n_heads {cfg.n_heads}: each head gets "
                         f"emb_dim / n_heads dimensions, so pick n_heads among the divisors of {cfg.emb_dim}")
    require_number("drop_rate", cfg.drop_rate, 0, 1, high_open=True, why="it is the probability of zeroing an "
                   "activation (0 turns dropout off, 1 would zero them all)")
    require_bool("qkv_bias", cfg.qkv_bias)
    require_bool("tie_weights", cfg.tie_weights)


def gpt_config(cfg) -> None:
    """A GPTConfig: every class that is part of the GPT is built from one (a dict with the same keys would fail
    later, deep inside a layer, with an AttributeError that says nothing about the config)."""
    from ..config import GPTConfig  # this lesson's own class: imported when called, so no import cycle
    require_type("cfg", cfg, GPTConfig, "build one with GPTConfig(...) or take one from GPT2_CONFIGS")


def course_device(value):
    """get_device: the COURSE_DEVICE environment variable, unset (None: get_device picks), or a device type this
    machine has; returns the torch.device it names, or None."""
    if value is None or value == "":
        return None
    available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if value not in available:
        raise ValueError(f"COURSE_DEVICE is {value!r}: set it to 'cpu', 'cuda' or 'mps', or unset it to let "
                         "get_device() pick the fastest device here")
    if not available[value]:
        raise ValueError(f"COURSE_DEVICE is {value!r} but this machine has no {value} device (torch sees none): "
                         "unset COURSE_DEVICE, or set it to 'cpu'")
    return torch.device(value)

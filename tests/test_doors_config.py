"""Issue 30: the doors of course_lib.config (GPTConfig, its door gpt_config, GPT2_CONFIGS, get_device), called as a
user who has not read the code would call them. Each case is a call and its expected outcome: ("error", type, a
fragment of the message that names the argument) or ("result", check). `python tests/test_doors_config.py` counts
the outcomes as clear / correct / unclear / silent."""

import dataclasses
import math

import numpy as np
import torch

from course_lib.config import GPT2_CONFIGS, GPTConfig, get_device
from course_lib.doors.config import gpt_config

from doors import door_tests, report

SMALL = dict(vocab_size=50, context_length=8, emb_dim=8, n_heads=2, n_layers=2)


def small(**changes):
    return lambda: GPTConfig(**(SMALL | changes))


def is_small(**expected):
    return lambda cfg: all(getattr(cfg, name) == value for name, value in (SMALL | expected).items())


CASES = [
    ("default", lambda: GPTConfig(), ("result", lambda cfg: (cfg.vocab_size, cfg.emb_dim) == (50257, 768))),
    ("small", small(), ("result", is_small())),
    ("drop_rate int 0", small(drop_rate=0), ("result", is_small(drop_rate=0))),
    ("numpy float64 drop_rate", small(drop_rate=np.float64(0.2)), ("result", lambda cfg: cfg.drop_rate == 0.2)),
    ("qkv_bias False", small(qkv_bias=False), ("result", lambda cfg: cfg.qkv_bias is False)),
    ("tie_weights False", small(tie_weights=False), ("result", lambda cfg: cfg.tie_weights is False)),
    ("replace keeps checks", lambda: dataclasses.replace(GPTConfig(**SMALL), n_heads=3),
     ("error", ValueError, "not divisible by n_heads 3")),
    ("replace valid", lambda: dataclasses.replace(GPTConfig(**SMALL), n_heads=4), ("result", is_small(n_heads=4))),
    ("frozen", lambda: setattr(GPTConfig(**SMALL), "emb_dim", 16), ("error", dataclasses.FrozenInstanceError, "emb_dim")),
    ("unknown field", lambda: GPTConfig(emb_size=8), ("error", TypeError, "emb_size")),
    ("emb_dim % n_heads", small(emb_dim=10, n_heads=4), ("error", ValueError, "emb_dim 10 is not divisible by n_heads 4")),
    ("n_heads > emb_dim", small(emb_dim=4, n_heads=8), ("error", ValueError, "not divisible by n_heads 8")),
    ("drop_rate -0.1", small(drop_rate=-0.1), ("error", ValueError, "drop_rate must be in [0, 1)")),
    ("drop_rate 1", small(drop_rate=1), ("error", ValueError, "drop_rate must be in [0, 1)")),
    ("drop_rate nan", small(drop_rate=math.nan), ("error", ValueError, "drop_rate must be in [0, 1)")),
    ("drop_rate inf", small(drop_rate=math.inf), ("error", ValueError, "drop_rate must be in [0, 1)")),
    ("drop_rate str", small(drop_rate="0.1"), ("error", TypeError, "drop_rate must be a number")),
    ("drop_rate bool", small(drop_rate=True), ("error", TypeError, "drop_rate must be a number")),
    ("drop_rate None", small(drop_rate=None), ("error", TypeError, "drop_rate must be a number")),
    ("drop_rate tensor", small(drop_rate=torch.tensor(0.1)), ("error", TypeError, "drop_rate must be a number")),
    ("qkv_bias 1", small(qkv_bias=1), ("error", TypeError, "qkv_bias must be True or False")),
    ("qkv_bias 'no'", small(qkv_bias="no"), ("error", TypeError, "qkv_bias must be True or False")),
    ("tie_weights None", small(tie_weights=None), ("error", TypeError, "tie_weights must be True or False")),
    ("gpt_config ok", lambda: gpt_config(GPTConfig(**SMALL)), ("result", lambda r: r is None)),
    ("gpt_config dict", lambda: gpt_config(SMALL), ("error", TypeError, "cfg must be a GPTConfig, got dict")),
    ("gpt_config None", lambda: gpt_config(None), ("error", TypeError, "cfg must be a GPTConfig, got NoneType")),
    ("gpt_config class", lambda: gpt_config(GPTConfig), ("error", TypeError, "cfg must be a GPTConfig, got type")),
    ("gpt_config name", lambda: gpt_config("gpt2"), ("error", TypeError, "take one from GPT2_CONFIGS")),
    ("GPT2_CONFIGS sizes", lambda: {name: (c.emb_dim, c.n_heads, c.n_layers) for name, c in GPT2_CONFIGS.items()},
     ("result", lambda r: r == {"gpt2": (768, 12, 12), "gpt2-medium": (1024, 16, 24), "gpt2-large": (1280, 20, 36),
                                "gpt2-xl": (1600, 25, 48)})),
    ("get_device", get_device, ("result", lambda d: isinstance(d, torch.device))),
    ("get_device arg", lambda: get_device("cuda"), ("error", TypeError, "get_device() takes 0 positional")),
]
for field in ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers"):
    CASES += [
        (f"{field} 0", small(**{field: 0}), ("error", ValueError, f"{field} must be >= 1, got 0")),
        (f"{field} -1", small(**{field: -1}), ("error", ValueError, f"{field} must be >= 1, got -1")),
        (f"{field} 2.0", small(**{field: 2.0}), ("error", TypeError, f"{field} must be an int, got 2.0")),
        (f"{field} True", small(**{field: True}), ("error", TypeError, f"{field} must be an int, got True")),
        (f"{field} None", small(**{field: None}), ("error", TypeError, f"{field} must be an int, got None")),
        (f"{field} numpy", small(**{field: np.int64(2)}), ("error", TypeError, f"{field} must be an int")),
    ]


test_door = door_tests(CASES)


if __name__ == "__main__":  # the counts of issue 30's closing note
    report(CASES)

import math

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.config import GPTConfig


class GELU(nn.Module):
    """GELU in the tanh approximation GPT-2 was trained with (Hendrycks & Gimpel, 2016):
    0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3))).

    `fused` picks how: True (the default) calls F.gelu(x, approximate="tanh"), which evaluates this formula
    in one pass over x; False runs the eight elementwise operations above one by one, each reading and
    writing the whole tensor (and each kept for backward). Same numbers up to float rounding."""

    fused = True  # class default, shared by every instance unless one sets its own

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not torch.is_floating_point(x):
            raise TypeError(f"GELU expects a floating-point tensor, got "
                            f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}: "
                            "convert it with x.float()")
        if self.fused:
            return F.gelu(x, approximate="tanh")
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


class FeedForward(nn.Module):
    """The position-wise MLP of a transformer block: emb_dim -> 4 * emb_dim -> GELU -> emb_dim."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if not isinstance(cfg, GPTConfig):
            raise TypeError(f"cfg must be a GPTConfig, got {type(cfg).__name__}: build one with "
                            "course_lib.config.GPTConfig(emb_dim=...) or take one from GPT2_CONFIGS")
        self.emb_dim = cfg.emb_dim
        self.layers = nn.Sequential(
            nn.Linear(cfg.emb_dim, 4 * cfg.emb_dim),  # expand: (..., emb_dim) -> (..., 4 * emb_dim)
            GELU(),
            nn.Linear(4 * cfg.emb_dim, cfg.emb_dim),  # project back: (..., 4 * emb_dim) -> (..., emb_dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not torch.is_floating_point(x):
            raise TypeError(f"FeedForward expects a floating-point tensor, got "
                            f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}: "
                            "pass the output of the embedding layer or a LayerNorm")
        if x.dim() == 0 or x.shape[-1] != self.emb_dim:
            raise ValueError(f"FeedForward was built for emb_dim {self.emb_dim} but got shape "
                             f"{tuple(x.shape)}: the input must be shaped (batch, tokens, {self.emb_dim})")
        return self.layers(x)  # (batch, tokens, emb_dim)

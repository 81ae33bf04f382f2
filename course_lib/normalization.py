import math

import torch
import torch.nn.functional as F
from torch import nn


class LayerNorm(nn.Module):
    """Layer normalisation over the last dimension (Ba, Kiros & Hinton 2016), as GPT-2 uses it.

    Each vector along the last axis is shifted to mean 0 and scaled to variance 1 (biased variance,
    `eps` added inside the square root), then multiplied by `scale` and offset by `shift`.

    `fused` picks how: True (the default) hands this formula to F.layer_norm, one kernel that reads x once
    and keeps only the mean and 1/std for backward; False runs it step by step. Both give the same numbers
    up to float rounding; set `ln.fused = False` on an instance to watch every step."""

    fused = True  # class default, shared by every instance unless one sets its own

    def __init__(self, emb_dim: int, eps: float = 1e-5):
        super().__init__()
        if not isinstance(emb_dim, int) or isinstance(emb_dim, bool):
            raise TypeError(f"emb_dim must be an int, got {emb_dim!r} ({type(emb_dim).__name__})")
        if emb_dim < 1:
            raise ValueError(f"emb_dim must be a positive int, got {emb_dim}: it is the size of the "
                             "last dimension that gets normalised")
        if not isinstance(eps, (int, float)) or isinstance(eps, bool):
            raise TypeError(f"eps must be a float, got {eps!r} ({type(eps).__name__})")
        if not 0 < eps < math.inf:
            raise ValueError(f"eps must be a positive finite number, got {eps}: it keeps the division "
                             "finite when a row has zero variance (1e-5 is the usual value)")
        self.emb_dim = emb_dim
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(emb_dim))  # learnable gain, starts as the identity
        self.shift = nn.Parameter(torch.zeros(emb_dim))  # learnable bias, starts at zero

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not torch.is_floating_point(x):
            raise TypeError(f"LayerNorm expects a floating-point tensor, got "
                            f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}: "
                            "convert it with x.float()")
        if x.dim() == 0 or x.shape[-1] != self.emb_dim:
            got = "a 0-d tensor" if x.dim() == 0 else f"last dimension {x.shape[-1]}"
            raise ValueError(f"LayerNorm was built for emb_dim {self.emb_dim} but got {got} "
                             f"(shape {tuple(x.shape)}): the input must be shaped (..., {self.emb_dim})")
        if self.fused and x.dtype == self.scale.dtype:  # F.layer_norm needs x and parameters in one dtype
            return F.layer_norm(x, (self.emb_dim,), self.scale, self.shift, self.eps)
        mean = x.mean(dim=-1, keepdim=True)  # (..., 1)
        var = x.var(dim=-1, keepdim=True, unbiased=False)  # (..., 1), divides by emb_dim, not emb_dim - 1
        norm_x = (x - mean) / torch.sqrt(var + self.eps)  # (..., emb_dim), mean 0 and variance ~1 per row
        return self.scale * norm_x + self.shift

    def extra_repr(self) -> str:
        return f"{self.emb_dim}, eps={self.eps}"

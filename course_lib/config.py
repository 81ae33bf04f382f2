from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GPTConfig:
    """The hyperparameters that fix a GPT-2 model's shape."""

    vocab_size: int = 50257  # tokens the BPE tokenizer knows
    context_length: int = 1024  # most tokens the model reads at once
    emb_dim: int = 768  # width of every token's vector
    n_heads: int = 12  # attention heads per layer
    n_layers: int = 12  # transformer blocks
    drop_rate: float = 0.1  # dropout probability during training
    qkv_bias: bool = True  # bias terms in the query/key/value projections

    def __post_init__(self):
        for name in ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.emb_dim % self.n_heads != 0:
            raise ValueError(f"emb_dim {self.emb_dim} is not divisible by n_heads {self.n_heads}: "
                             f"each head gets emb_dim / n_heads dimensions, so pick n_heads among the "
                             f"divisors of {self.emb_dim}")
        if not isinstance(self.drop_rate, (int, float)) or isinstance(self.drop_rate, bool):
            raise TypeError(f"drop_rate must be a float, got {self.drop_rate!r} ({type(self.drop_rate).__name__})")
        if not 0.0 <= self.drop_rate < 1.0:
            raise ValueError(f"drop_rate must be in [0, 1), got {self.drop_rate}: it is the probability "
                             "of zeroing an activation (0 turns dropout off, 1 would zero them all)")
        if not isinstance(self.qkv_bias, bool):
            raise TypeError(f"qkv_bias must be True or False, got {self.qkv_bias!r}")


GPT2_CONFIGS = {
    "gpt2": GPTConfig(emb_dim=768, n_heads=12, n_layers=12),  # 124M parameters
    "gpt2-medium": GPTConfig(emb_dim=1024, n_heads=16, n_layers=24),  # 355M
    "gpt2-large": GPTConfig(emb_dim=1280, n_heads=20, n_layers=36),  # 774M
    "gpt2-xl": GPTConfig(emb_dim=1600, n_heads=25, n_layers=48),  # 1558M
}


def get_device() -> torch.device:
    """The fastest device here: a CUDA GPU, then Apple's MPS, then the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")

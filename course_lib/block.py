from torch import Tensor, nn

from course_lib.attention import KVCache, MultiHeadAttention
from course_lib.config import GPTConfig
from course_lib.feedforward import FeedForward
from course_lib.normalization import LayerNorm


class TransformerBlock(nn.Module):
    """One GPT-2 block, pre-LayerNorm: each sub-layer reads a normalised copy of x and adds its
    (dropped-out) result back onto x, so the shortcut path itself is never normalised.

    x = x + dropout(attention(LayerNorm(x)));  x = x + dropout(feed_forward(LayerNorm(x)))"""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if not isinstance(cfg, GPTConfig):
            raise TypeError(f"cfg must be a GPTConfig, got {type(cfg).__name__}: build one with "
                            "course_lib.config.GPTConfig(...) or take one from GPT2_CONFIGS")
        self.norm1 = LayerNorm(cfg.emb_dim)
        self.att = MultiHeadAttention(d_in=cfg.emb_dim, d_out=cfg.emb_dim, context_length=cfg.context_length,
                                      dropout=cfg.drop_rate, num_heads=cfg.n_heads, qkv_bias=cfg.qkv_bias)
        self.norm2 = LayerNorm(cfg.emb_dim)
        self.ff = FeedForward(cfg)
        self.drop_shortcut = nn.Dropout(cfg.drop_rate)

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        """(batch, tokens, emb_dim) -> (batch, tokens, emb_dim); with kv_cache, the new tokens also attend
        to the cached positions and their keys and values are appended to it."""
        x = x + self.drop_shortcut(self.att(self.norm1(x), kv_cache))  # attention sub-layer + shortcut
        x = x + self.drop_shortcut(self.ff(self.norm2(x)))  # feed-forward sub-layer + shortcut
        return x  # (batch, tokens, emb_dim)

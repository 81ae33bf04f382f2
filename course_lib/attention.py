import math

import torch
import torch.nn.functional as F
from einops import rearrange
from fancy_einsum import einsum
from torch import Tensor, nn


def check_attention_args(d_in, d_out, context_length, dropout, num_heads=1, qkv_bias=False):
    """Raise a clear error for sizes no attention layer can have; every attention class calls this."""
    for name, value in (("d_in", d_in), ("d_out", d_out), ("context_length", context_length),
                        ("num_heads", num_heads)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if d_out % num_heads != 0:
        raise ValueError(f"d_out {d_out} is not divisible by num_heads {num_heads}: each head gets "
                         f"d_out / num_heads dimensions, so pick num_heads among the divisors of {d_out}")
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool):
        raise TypeError(f"dropout must be a float, got {dropout!r} ({type(dropout).__name__})")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}: it is the probability of zeroing an "
                         "attention weight, and 1 would zero them all")
    if not isinstance(qkv_bias, bool):
        raise TypeError(f"qkv_bias must be True or False, got {qkv_bias!r}")


def check_attention_input(x, d_in, context_length, dtype, cached_tokens=0):
    """Raise a clear error unless x is a (batch, tokens, d_in) float tensor that fits the context."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor of shape (batch, tokens, d_in), got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"x must be 3-D (batch, tokens, d_in), got shape {tuple(x.shape)}: "
                         "for a single sequence add a batch dimension with x.unsqueeze(0)")
    if not x.is_floating_point():
        raise TypeError(f"x has dtype {x.dtype}, but attention reads embedding vectors: "
                        "turn token ids into vectors with an embedding layer first")
    if x.dtype != dtype:
        raise TypeError(f"x has dtype {x.dtype} but the layer's weights are {dtype}: "
                        f"convert with x.to({dtype})")
    if x.shape[-1] != d_in:
        raise ValueError(f"x has {x.shape[-1]} features in its last dimension but the layer expects "
                         f"d_in {d_in}: project the input to {d_in} features or build the layer with "
                         f"d_in={x.shape[-1]}")
    if x.shape[1] == 0:
        raise ValueError("x has 0 tokens: pass at least one token per sequence")
    if cached_tokens + x.shape[1] > context_length:
        if cached_tokens == 0:
            raise ValueError(f"x has {x.shape[1]} tokens, more than context_length {context_length}: "
                             f"crop the input to the last {context_length} tokens")
        raise ValueError(f"{x.shape[1]} new tokens plus {cached_tokens} cached tokens = "
                         f"{cached_tokens + x.shape[1]}, more than context_length {context_length}: crop the "
                         f"input to the last {context_length} tokens and start again with an empty KVCache")


class CausalAttention(nn.Module):
    """One head of causal self-attention: every token mixes the values of itself and earlier tokens."""

    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        check_attention_args(d_in, d_out, context_length, dropout, qkv_bias=qkv_bias)
        self.d_in, self.d_out, self.context_length, self.dropout = d_in, d_out, context_length, dropout
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        # True above the diagonal: the future positions a query must not see. Not saved in state_dict.
        future_mask = torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), diagonal=1)
        self.register_buffer("future_mask", future_mask, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        check_attention_input(x, self.d_in, self.context_length, self.W_query.weight.dtype)
        num_tokens = x.shape[1]
        queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)  # (batch, tokens, d_out)
        scores = queries @ keys.transpose(1, 2) / math.sqrt(self.d_out)  # (batch, tokens, tokens)
        scores = scores.masked_fill(self.future_mask[:num_tokens, :num_tokens], float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # each row sums to 1, zeros above the diagonal
        weights = F.dropout(weights, p=self.dropout, training=self.training)
        return weights @ values  # (batch, tokens, d_out)


class MultiHeadAttentionWrapper(nn.Module):
    """Multi-head attention the readable way: num_heads independent CausalAttention heads, concatenated."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        check_attention_args(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        self.d_in, self.d_out, self.num_heads, self.head_dim = d_in, d_out, num_heads, d_out // num_heads
        self.context_length, self.dropout = context_length, dropout
        self.heads = nn.ModuleList(CausalAttention(d_in, self.head_dim, context_length, dropout, qkv_bias)
                                   for _ in range(num_heads))  # each head sees all d_in, outputs head_dim
        self.out_proj = nn.Linear(d_out, d_out)  # mixes what the heads found

    def forward(self, x: Tensor) -> Tensor:
        context = torch.cat([head(x) for head in self.heads], dim=-1)  # (batch, tokens, d_out)
        return self.out_proj(context)  # (batch, tokens, d_out)


@torch.no_grad()
def copy_fused_weights_to_wrapper(fused: nn.Module, wrapper: MultiHeadAttentionWrapper) -> None:
    """Give head h of `wrapper` rows h*head_dim:(h+1)*head_dim of `fused`'s W_query, W_key and W_value.

    `fused` is any module with the fused layout (W_query, W_key, W_value, out_proj, num_heads); afterwards
    both modules compute the same function."""
    expected = (wrapper.num_heads * wrapper.head_dim, wrapper.d_in)  # (d_out, d_in)
    shape = tuple(fused.W_query.weight.shape)
    if fused.num_heads != wrapper.num_heads or shape != expected:
        raise ValueError(f"fused has num_heads {fused.num_heads} and W_query weight {shape}, wrapper has "
                         f"num_heads {wrapper.num_heads} and needs {expected}: build both with the same "
                         "d_in, d_out and num_heads")
    if (fused.W_query.bias is None) != (wrapper.heads[0].W_query.bias is None):
        raise ValueError("fused and wrapper disagree on qkv_bias: build both with the same qkv_bias")
    for h, head in enumerate(wrapper.heads):
        rows = slice(h * wrapper.head_dim, (h + 1) * wrapper.head_dim)
        for name in ("W_query", "W_key", "W_value"):
            source, target = getattr(fused, name), getattr(head, name)
            target.weight.copy_(source.weight[rows])
            if source.bias is not None:
                target.bias.copy_(source.bias[rows])
    wrapper.out_proj.load_state_dict(fused.out_proj.state_dict())


class MultiHeadAttentionEinsum(nn.Module):
    """The fused multi-head computation written with named dimensions (einops and fancy_einsum).

    Same constructor, parameters and state_dict keys as MultiHeadAttention."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        check_attention_args(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        self.d_in, self.d_out, self.num_heads, self.head_dim = d_in, d_out, num_heads, d_out // num_heads
        self.context_length, self.dropout = context_length, dropout
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        future_mask = torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), diagonal=1)
        self.register_buffer("future_mask", future_mask, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        check_attention_input(x, self.d_in, self.context_length, self.W_query.weight.dtype)
        num_tokens = x.shape[1]
        split = "batch pos (head head_dim) -> batch head pos head_dim"
        q = rearrange(self.W_query(x), split, head=self.num_heads)
        k = rearrange(self.W_key(x), split, head=self.num_heads)
        v = rearrange(self.W_value(x), split, head=self.num_heads)
        scores = einsum("batch head q_pos head_dim, batch head k_pos head_dim -> batch head q_pos k_pos",
                        q, k) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(self.future_mask[:num_tokens, :num_tokens], float("-inf"))
        weights = F.dropout(torch.softmax(scores, dim=-1), p=self.dropout, training=self.training)
        context = einsum("batch head q_pos k_pos, batch head k_pos head_dim -> batch head q_pos head_dim",
                         weights, v)
        return self.out_proj(rearrange(context, "batch head pos head_dim -> batch pos (head head_dim)"))


class KVCache:
    """Keys and values of the positions one attention layer has already processed."""

    def __init__(self):
        self.keys: Tensor | None = None  # (batch, num_heads, cached_tokens, head_dim)
        self.values: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Add the keys and values of new positions; return those of all positions so far."""
        if not isinstance(keys, Tensor) or not isinstance(values, Tensor):
            raise TypeError(f"keys and values must be tensors, got {type(keys).__name__} and "
                            f"{type(values).__name__}")
        if keys.dim() != 4 or keys.shape != values.shape:
            raise ValueError(f"keys and values must both be (batch, num_heads, tokens, head_dim), got "
                             f"{tuple(keys.shape)} and {tuple(values.shape)}")
        if self.keys is None:
            self.keys, self.values = keys, values
            return keys, values
        for dim, what, fix in ((0, "batch size", "use a new KVCache() for each batch of sequences"),
                               (1, "heads", "give each attention layer its own KVCache"),
                               (3, "head_dim", "give each attention layer its own KVCache")):
            if keys.shape[dim] != self.keys.shape[dim]:
                raise ValueError(f"kv_cache holds {what} {self.keys.shape[dim]} but the new keys have "
                                 f"{what} {keys.shape[dim]}: {fix}")
        self.keys = torch.cat([self.keys, keys], dim=2)  # (batch, num_heads, cached + new, head_dim)
        self.values = torch.cat([self.values, values], dim=2)
        return self.keys, self.values


class MultiHeadAttention(nn.Module):
    """Causal multi-head self-attention with fused projections, as in GPT-2.

    forward(x) uses PyTorch's fused scaled_dot_product_attention; forward(x, return_weights=True) also
    returns the attention pattern (batch, num_heads, tokens, cached + tokens); forward(x, kv_cache=cache)
    appends the new keys and values to `cache` and lets the new tokens attend to every cached position."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        check_attention_args(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        self.d_in, self.d_out, self.num_heads, self.head_dim = d_in, d_out, num_heads, d_out // num_heads
        self.context_length, self.dropout = context_length, dropout
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        future_mask = torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), diagonal=1)
        self.register_buffer("future_mask", future_mask, persistent=False)

    def forward(self, x: Tensor, kv_cache: KVCache | None = None, return_weights: bool = False):
        if kv_cache is not None and not isinstance(kv_cache, KVCache):
            raise TypeError(f"kv_cache must be a KVCache or None, got {type(kv_cache).__name__}")
        cached = 0 if kv_cache is None else len(kv_cache)  # positions this layer has already seen
        check_attention_input(x, self.d_in, self.context_length, self.W_query.weight.dtype, cached)
        batch, num_tokens, _ = x.shape
        heads = (batch, num_tokens, self.num_heads, self.head_dim)  # d_out split into num_heads pieces
        queries = self.W_query(x).view(heads).transpose(1, 2)  # (batch, num_heads, tokens, head_dim)
        keys = self.W_key(x).view(heads).transpose(1, 2)
        values = self.W_value(x).view(heads).transpose(1, 2)
        if kv_cache is not None:
            keys, values = kv_cache.append(keys, values)  # (batch, num_heads, cached + tokens, head_dim)
        # New token i sits at position cached + i: it may see positions 0 .. cached + i, not the rest.
        future = self.future_mask[cached:cached + num_tokens, :cached + num_tokens]  # (tokens, all)

        if return_weights:  # explicit: every step visible, and the pattern (before dropout) comes back
            scores = queries @ keys.transpose(2, 3) / math.sqrt(self.head_dim)  # (batch, heads, tokens, all)
            weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            context = F.dropout(weights, p=self.dropout, training=self.training) @ values
        else:  # fast: one fused kernel, no (tokens x tokens) matrix kept
            dropout_p = self.dropout if self.training else 0.0
            if cached == 0:  # the kernel masks on the fly: no mask tensor at all
                context = F.scaled_dot_product_attention(queries, keys, values, dropout_p=dropout_p,
                                                         is_causal=True)
            elif num_tokens == 1:  # one new token may see every cached position: nothing to mask
                context = F.scaled_dot_product_attention(queries, keys, values, dropout_p=dropout_p)
            else:  # is_causal would align its mask top-left, so pass ours (True = may attend)
                context = F.scaled_dot_product_attention(queries, keys, values, attn_mask=~future,
                                                         dropout_p=dropout_p)
        merged = context.transpose(1, 2).reshape(batch, num_tokens, self.d_out)  # heads side by side again
        out = self.out_proj(merged)  # (batch, tokens, d_out)
        return (out, weights) if return_weights else out

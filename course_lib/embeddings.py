import math

import torch
from torch import nn

from course_lib.config import GPTConfig


class SinusoidalPositionalEmbedding(nn.Module):
    """The fixed sine/cosine position code of "Attention Is All You Need" (Vaswani et al., 2017).

    Column j of position p holds sin(p * w) for even j and cos(p * w) for odd j, with
    w = 10000 ** (-2 * (j // 2) / emb_dim). An odd emb_dim keeps the formula as it is: its last column
    is a sine whose cosine partner would be column emb_dim, which does not exist.
    `forward(num_tokens, start_pos=0)` returns the codes of positions start_pos .. start_pos + num_tokens - 1.
    """

    def __init__(self, emb_dim: int, max_len: int):
        super().__init__()
        for name, value in (("emb_dim", emb_dim), ("max_len", max_len)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.emb_dim, self.max_len = emb_dim, max_len
        positions = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
        even = torch.arange(0, emb_dim, 2, dtype=torch.float64)  # the even column indices 2i
        angles = positions * torch.exp(-math.log(10000.0) * even / emb_dim)  # (max_len, ceil(emb_dim / 2))
        table = torch.empty(max_len, emb_dim, dtype=torch.float64)
        table[:, 0::2] = torch.sin(angles)
        table[:, 1::2] = torch.cos(angles[:, : emb_dim // 2])  # an odd emb_dim has one cosine fewer
        # A buffer follows .to(device) but is not trained; not persistent: it is recomputed, never saved.
        self.register_buffer("table", table.float(), persistent=False)  # (max_len, emb_dim)

    def forward(self, num_tokens: int, start_pos: int = 0) -> torch.Tensor:
        """The codes of positions start_pos .. start_pos + num_tokens - 1: (num_tokens, emb_dim)."""
        for name, value in (("num_tokens", num_tokens), ("start_pos", start_pos)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        if start_pos < 0:
            raise ValueError(f"start_pos must be >= 0, got {start_pos}")
        if start_pos + num_tokens > self.max_len:
            raise ValueError(f"start_pos {start_pos} + {num_tokens} tokens need positions "
                             f"{start_pos}..{start_pos + num_tokens - 1} but max_len is {self.max_len}; "
                             f"build the module with max_len >= {start_pos + num_tokens}")
        return self.table[start_pos : start_pos + num_tokens]


class GPTEmbedding(nn.Module):
    """GPT-2's input layer: token embedding plus learned position embedding, then dropout.

    `forward(token_ids, start_pos=0)` maps integer ids (batch, tokens) to (batch, tokens, emb_dim); the
    tokens sit at positions start_pos .. start_pos + tokens - 1 (a KV cache feeds one new token at a time).
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if not isinstance(cfg, GPTConfig):
            raise TypeError(f"cfg must be a GPTConfig, got {type(cfg).__name__}; "
                            "build one with GPTConfig(...) or take one from GPT2_CONFIGS")
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.emb_dim)
        self.pos_emb = nn.Embedding(cfg.context_length, cfg.emb_dim)
        self.drop_emb = nn.Dropout(cfg.drop_rate)

    def forward(self, token_ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        if not isinstance(token_ids, torch.Tensor):
            raise TypeError(f"token_ids must be a torch.Tensor of shape (batch, tokens), got "
                            f"{type(token_ids).__name__}; wrap it with torch.tensor(...)")
        if token_ids.dtype.is_floating_point or token_ids.dtype.is_complex or token_ids.dtype == torch.bool:
            raise TypeError(f"token_ids must hold integer token ids, got dtype {token_ids.dtype}; "
                            "convert with token_ids.long()")
        if token_ids.dim() != 2:
            raise ValueError(f"token_ids must have shape (batch, tokens), got shape "
                             f"{tuple(token_ids.shape)}; for a single sequence use token_ids.unsqueeze(0)")
        if token_ids.numel() == 0:
            raise ValueError(f"token_ids is empty, shape {tuple(token_ids.shape)}; "
                             "pass at least one sequence of at least one token")
        if token_ids.device != self.tok_emb.weight.device:
            raise ValueError(f"token_ids are on {token_ids.device} but the embedding weights are on "
                             f"{self.tok_emb.weight.device}; move them with token_ids.to(...)")
        if not isinstance(start_pos, int) or isinstance(start_pos, bool):
            raise TypeError(f"start_pos must be an int, got {start_pos!r} ({type(start_pos).__name__}); "
                            "pass a Python int, e.g. int(start_pos)")
        if start_pos < 0:
            raise ValueError(f"start_pos must be >= 0, got {start_pos}")
        vocab_size, context_length = self.tok_emb.num_embeddings, self.pos_emb.num_embeddings
        num_tokens = token_ids.shape[1]
        if start_pos + num_tokens > context_length:
            restart = " and restart at start_pos 0 (reset the KV cache)" if start_pos else ""
            raise ValueError(f"start_pos {start_pos} + {num_tokens} tokens need positions "
                             f"{start_pos}..{start_pos + num_tokens - 1} but context_length is "
                             f"{context_length}; crop the input to the last {context_length} tokens{restart}")
        low, high = token_ids.min().item(), token_ids.max().item()  # one look at the data per call
        if high >= vocab_size:
            raise ValueError(f"token id {high} >= vocab_size {vocab_size}: the ids come from a larger "
                             f"vocabulary than this model's; use the tokenizer the model was built for")
        if low < 0:
            raise ValueError(f"token id {low} < 0: token ids index the vocabulary, 0..{vocab_size - 1}")
        positions = torch.arange(start_pos, start_pos + num_tokens, device=token_ids.device)  # (tokens,)
        tokens = self.tok_emb(token_ids.long())  # (batch, tokens, emb_dim)
        return self.drop_emb(tokens + self.pos_emb(positions))  # (tokens, emb_dim) broadcasts over the batch

import math

import torch
from torch import Tensor, nn

from course_lib.attention import KVCache
from course_lib.block import TransformerBlock
from course_lib.config import GPTConfig
from course_lib.embeddings import GPTEmbedding
from course_lib.normalization import LayerNorm


class GPTModel(nn.Module):
    """GPT-2: embeddings -> n_layers transformer blocks -> final LayerNorm -> linear head to vocabulary logits.

    tie_weights=True shares one matrix between the token embedding and the output head, as GPT-2 did."""

    def __init__(self, cfg: GPTConfig, tie_weights: bool = False):
        super().__init__()
        if not isinstance(cfg, GPTConfig):
            raise TypeError(f"cfg must be a GPTConfig, got {type(cfg).__name__}: build one with "
                            "course_lib.config.GPTConfig(...) or take one from GPT2_CONFIGS")
        if not isinstance(tie_weights, bool):
            raise TypeError(f"tie_weights must be True or False, got {tie_weights!r}")
        self.cfg = cfg
        self.embedding = GPTEmbedding(cfg)  # token + position embeddings, dropout
        self.trf_blocks = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.final_norm = LayerNorm(cfg.emb_dim)
        self.out_head = nn.Linear(cfg.emb_dim, cfg.vocab_size, bias=False)
        self._init_weights()
        if tie_weights:  # one Parameter, two roles: row i embeds token i and scores token i
            self.out_head.weight = self.embedding.tok_emb.weight

    @torch.no_grad()
    def _init_weights(self) -> None:
        """GPT-2's initialisation: weights ~ N(0, 0.02), biases 0, LayerNorm scale 1 and shift 0; the two
        projections that write into the shortcut path get std 0.02 / sqrt(2 * n_layers), so the sum of
        2 * n_layers residual updates keeps roughly the variance of one."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, LayerNorm):
                nn.init.ones_(module.scale)
                nn.init.zeros_(module.shift)
        residual_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for block in self.trf_blocks:
            nn.init.normal_(block.att.out_proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.ff.layers[2].weight, mean=0.0, std=residual_std)

    def new_kv_caches(self) -> list[KVCache]:
        """One empty KVCache per transformer block, to pass to forward(..., kv_caches=...)."""
        return [KVCache() for _ in self.trf_blocks]

    def forward(self, token_ids: Tensor, kv_caches: list[KVCache] | None = None,
                last_only: bool = False) -> Tensor:
        """Token ids (batch, tokens) -> logits (batch, tokens, vocab_size), or (batch, 1, vocab_size) for the
        last position only when last_only=True. With kv_caches (from new_kv_caches()), the tokens continue
        the cached sequence: their positions start at len(kv_caches[0]) and every block extends its cache."""
        if not isinstance(last_only, bool):
            raise TypeError(f"last_only must be True or False, got {last_only!r}")
        start_pos = 0
        if kv_caches is not None:
            if not isinstance(kv_caches, (list, tuple)):
                raise TypeError(f"kv_caches must be a list of KVCache (one per block) or None, got "
                                f"{type(kv_caches).__name__}: create it with model.new_kv_caches()")
            if len(kv_caches) != len(self.trf_blocks):
                raise ValueError(f"kv_caches has {len(kv_caches)} caches but the model has "
                                 f"{len(self.trf_blocks)} blocks: create it with model.new_kv_caches()")
            for i, cache in enumerate(kv_caches):
                if not isinstance(cache, KVCache):
                    raise TypeError(f"kv_caches[{i}] must be a KVCache, got {type(cache).__name__}: "
                                    "create the list with model.new_kv_caches()")
            lengths = sorted({len(cache) for cache in kv_caches})
            if len(lengths) > 1:
                raise ValueError(f"kv_caches hold different numbers of tokens {lengths}: they must all "
                                 "come from the same calls; start again with model.new_kv_caches()")
            start_pos = len(kv_caches[0])  # the new tokens continue after the cached ones
        x = self.embedding(token_ids, start_pos)  # (batch, tokens, emb_dim); checks ids and positions
        for i, block in enumerate(self.trf_blocks):
            x = block(x, None if kv_caches is None else kv_caches[i])  # (batch, tokens, emb_dim)
        if last_only:
            x = x[:, -1:, :]  # (batch, 1, emb_dim): generation needs only the next-token logits
        return self.out_head(self.final_norm(x))  # (batch, tokens or 1, vocab_size)


def trace_shapes(model: nn.Module, token_ids: Tensor, max_depth: int | None = None) -> list[tuple[str, tuple]]:
    """Run one forward pass and list (module name, output shape) for every submodule it calls, in the
    order the calls start (a parent before its children); max_depth=1 keeps top-level names only,
    2 also their children, and so on. The hooks are removed afterwards, even if the pass fails."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if max_depth is not None and (not isinstance(max_depth, int) or isinstance(max_depth, bool)
                                  or max_depth < 1):
        raise ValueError(f"max_depth must be None (every level) or an int >= 1, got {max_depth!r}")
    trace: list[list] = []  # [name, shape] pairs; the shape is filled in when the call ends
    open_calls: list[int] = []  # indices into trace of the calls still running (calls nest)

    def shape_of(output):
        if isinstance(output, Tensor):
            return tuple(output.shape)
        if isinstance(output, (tuple, list)):
            return tuple(shape_of(o) for o in output)
        return type(output).__name__

    def make_hooks(name):
        def before(module, args):
            open_calls.append(len(trace))
            trace.append([name, None])

        def after(module, args, output):
            trace[open_calls.pop()][1] = shape_of(output)

        return before, after

    handles = []
    for name, module in model.named_modules():
        if name and (max_depth is None or name.count(".") < max_depth):
            before, after = make_hooks(name)
            handles.append(module.register_forward_pre_hook(before))
            handles.append(module.register_forward_hook(after))
    try:
        with torch.no_grad():
            model(token_ids)
    finally:
        for handle in handles:
            handle.remove()
    return [(name, shape) for name, shape in trace]

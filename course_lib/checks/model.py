"""The checks of the exercises in notebooks/07_gpt_model.ipynb."""

import functools
from dataclasses import replace

import torch
from torch import Tensor

from course_lib.config import GPTConfig
from course_lib.model import GPTModel

from .core import Checker, build, compare, isolated_rng, load_reference_weights, require_class, table_variants


def model_variant(ref: GPTModel, ids: Tensor, layout: str) -> Tensor:
    emb = ref.embedding
    tokens = emb.tok_emb(ids)
    positions = emb.pos_emb(torch.arange(ids.shape[1], device=ids.device))
    x = tokens if layout == "no_pos" else tokens + positions
    if layout == "norm_first":
        x = ref.final_norm(x)
    start = x
    for block in ref.trf_blocks:
        x = block(start if layout == "not_chained" else x)
    if layout not in ("no_final_norm", "norm_first"):
        x = ref.final_norm(x)
    logits = ref.out_head(x)
    return torch.softmax(logits, dim=-1) if layout == "softmax" else logits


MODEL_BUGS = {
    "no_pos": "no positional embedding: add pos_emb(torch.arange(tokens)) to the token embeddings",
    "no_final_norm": "the final LayerNorm is missing: logits = out_head(final_norm(x)) after the last block",
    "norm_first": "final_norm is applied before the blocks; it belongs after the last block, right before out_head",
    "not_chained": "every block reads the embeddings: each block must read the previous block's output, "
                   "for block in trf_blocks: x = block(x)",
    "softmax": "the model returns probabilities: return the raw logits (the softmax belongs to the loss and to "
               "sampling)",
}


def head_is_tied(model) -> bool:
    """Whether the model's out_head uses the token embedding's Parameter itself (flat or in `embedding`)."""
    head = getattr(getattr(model, "out_head", None), "weight", None)
    return head is not None and any(
        p is head for p in (getattr(getattr(model, "tok_emb", None), "weight", None),
                            getattr(getattr(getattr(model, "embedding", None), "tok_emb", None), "weight", None)))


def check_embedding_dropout(ck: Checker, learner_impl, cfg: GPTConfig) -> None:
    """In training mode with drop_rate 0.5, about half of what the first block reads must be exactly 0: the
    embeddings' dropout (GPTEmbedding's drop_emb)."""
    model = build(ck, learner_impl, replace(cfg, drop_rate=0.5), signature="MyGPTModel(cfg) with a GPTConfig")
    seen = []
    first = next(iter(getattr(model, "trf_blocks", [])), None)
    if first is None:
        ck.fail("your model has no trf_blocks to run", "hold the blocks in self.trf_blocks (an nn.ModuleList)")
    handle = first.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
    try:
        ck.call("forward in training mode with drop_rate 0.5", model.train(), torch.randint(0, cfg.vocab_size, (4, 8)))
    finally:
        handle.remove()
    zeros = (seen[0] == 0).double().mean().item() if seen else 0.0
    if zeros < 0.2:
        ck.fail(f"in training mode with drop_rate 0.5, {zeros:.0%} of what the first block reads is 0",
                "no dropout on the embeddings: the blocks read drop_emb(tok_emb(ids) + pos_emb(positions)), with "
                "self.drop_emb = nn.Dropout(cfg.drop_rate) (GPTEmbedding does it)")
    ck.ok()


@isolated_rng
def check_gpt_model(learner_impl) -> None:
    """Check `learner_impl`, the GPT model of notebook 07.

    learner_impl(cfg) takes a GPTConfig and, like course_lib.model.GPTModel, holds the embeddings (either
    `embedding` = course_lib GPTEmbedding, or `tok_emb` and `pos_emb` directly), `trf_blocks` (an nn.ModuleList or
    nn.Sequential of course_lib TransformerBlocks), `final_norm` (course_lib LayerNorm) and `out_head`
    (nn.Linear(emb_dim, vocab_size, bias=False)), whose weight IS the token embedding's when cfg.tie_weights (GPT-2's
    default); forward(token_ids) maps (batch, tokens) to logits (batch, tokens, vocab_size). In training mode the
    embeddings go through dropout (cfg.drop_rate) before the first block."""
    ck = Checker("check_gpt_model")
    require_class(ck, learner_impl, "MyGPTModel(cfg)")
    cfg = GPTConfig(vocab_size=40, context_length=8, emb_dim=8, n_heads=2, n_layers=2, drop_rate=0.0, qkv_bias=False,
                    tie_weights=True)
    mine = build(ck, learner_impl, cfg, signature="MyGPTModel(cfg) with a GPTConfig")
    names = set(mine.state_dict())
    flat = {k.removeprefix("embedding.") for k in names}
    if not any(k.startswith("final_norm.") for k in flat):
        ck.fail("your model has no final_norm", MODEL_BUGS["no_final_norm"] + " (self.final_norm = LayerNorm(emb_dim))")
    if not any(k.startswith("pos_emb.") for k in flat):
        ck.fail("your model has no pos_emb", MODEL_BUGS["no_pos"] + " (self.pos_emb = nn.Embedding(context_length, "
                "emb_dim))")
    if "out_head.bias" in names:
        ck.fail("your out_head has a bias", "GPT-2's output layer has none: nn.Linear(emb_dim, vocab_size, bias=False)")
    tied = head_is_tied(mine)
    if cfg.tie_weights and not tied:
        ck.fail("with cfg.tie_weights=True (GPT-2's default), your out_head has its own weight",
                "untied head when the config says tied: if cfg.tie_weights, reuse the token embedding as the head, "
                "self.out_head.weight = self.embedding.tok_emb.weight (or self.tok_emb.weight)")
    untied_cfg = replace(cfg, tie_weights=False)
    if head_is_tied(build(ck, learner_impl, untied_cfg, signature="MyGPTModel(cfg) with a GPTConfig")):
        ck.fail("with cfg.tie_weights=False, your out_head still shares the token embedding's weight",
                "tied head when the config says untied: tie only if cfg.tie_weights")
    ref = GPTModel(replace(cfg, tie_weights=tied))  # the learner's model is tied or not by construction
    with torch.no_grad():
        ref.final_norm.scale.copy_(1 + 0.5 * torch.randn(cfg.emb_dim))
        ref.final_norm.shift.copy_(0.5 * torch.randn(cfg.emb_dim))
    ref = ref.double().eval()
    state = ref.state_dict()

    def rename(key):
        if key in state:
            return key
        if "embedding." + key in state:
            return "embedding." + key
        return key

    load_reference_weights(ck, mine, state, rename)
    mine = mine.double().eval()
    ck.ok()
    with torch.no_grad():
        for ids, situation in ((torch.randint(0, cfg.vocab_size, (2, 5)), "on token ids (2, 5)"),
                               (torch.randint(0, cfg.vocab_size, (1, cfg.context_length)),
                                f"on a full context of {cfg.context_length} tokens"),
                               (torch.tensor([[3]]), "on one token")):
            got = ck.call(f"forward {situation}", mine, ids)
            variants = table_variants(MODEL_BUGS, functools.partial(model_variant, ref, ids))
            compare(ck, got, ref(ids), variants, situation,
                    "embeddings (token + position) -> every block in order -> final_norm -> out_head")
        ids = torch.randint(0, cfg.vocab_size, (1, 6))
        changed = ids.clone()
        changed[0, -1] = (ids[0, -1] + 1) % cfg.vocab_size
        if not torch.allclose(mine(ids)[:, :-1], mine(changed)[:, :-1], atol=1e-8, rtol=1e-6):
            ck.fail("changing only the last token changes the logits of earlier positions: the future leaks",
                    "the blocks must use causal attention (course_lib's MultiHeadAttention masks the future)")
        ck.ok()
        check_embedding_dropout(ck, learner_impl, cfg)
    ck.done("Your GPT model matches course_lib's GPTModel: embeddings, blocks, final norm, output head.")

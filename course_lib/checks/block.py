"""The checks of the exercises in notebooks/06_transformer_block.ipynb."""

import functools

import torch
from torch import Tensor, nn

from course_lib.block import TransformerBlock
from course_lib.config import GPTConfig

from .core import (Checker, build, compare, isolated_rng, linear_layers, load_reference_weights, require_class,
                   table_variants)


def block_variant(ref: TransformerBlock, x: Tensor, layout: str) -> Tensor:
    n1, n2, att, ff = ref.norm1, ref.norm2, ref.att, ref.ff
    if layout == "post_ln":
        h = n1(x + att(x))
        return n2(h + ff(h))
    if layout == "shared_norm1":
        h = x + att(n1(x))
        return h + ff(n1(h))
    if layout == "shared_norm2":
        h = x + att(n2(x))
        return h + ff(n2(h))
    if layout == "no_second_shortcut":
        return ff(n2(x + att(n1(x))))
    if layout == "no_first_shortcut":
        h = att(n1(x))
        return h + ff(n2(h))
    if layout == "no_shortcuts":
        return ff(n2(att(n1(x))))
    if layout == "normalised_shortcut":
        h = n1(x)
        h = h + att(h)
        g = n2(h)
        return g + ff(g)
    if layout == "ff_first":
        h = x + ff(n2(x))
        return h + att(n1(h))
    if layout == "no_norms":
        h = x + att(x)
        return h + ff(h)
    raise ValueError(layout)


BLOCK_BUGS = {
    "post_ln": "post-LN instead of pre-LN: GPT-2 normalises the input of each sub-layer, "
               "x = x + drop(att(norm1(x))), not x = norm1(x + att(x))",
    "shared_norm1": "one shared LayerNorm: norm1 is used before both sub-layers; the feed-forward needs its own "
                    "norm2",
    "shared_norm2": "one shared LayerNorm: norm2 is used before both sub-layers; attention reads norm1(x)",
    "no_second_shortcut": "the second shortcut is missing: x = x + drop(ff(norm2(x)))",
    "no_first_shortcut": "the first shortcut is missing: x = x + drop(att(norm1(x)))",
    "no_shortcuts": "both shortcuts are missing: each sub-layer's output is added to its input, x = x + drop(...)",
    "normalised_shortcut": "the shortcut carries the normalised x: keep x itself on the shortcut and feed "
                           "norm1(x) only into the sub-layer, x = x + drop(att(norm1(x)))",
    "ff_first": "the sub-layers are in the wrong order: attention first, then the feed-forward network",
    "no_norms": "the LayerNorms are never applied: x = x + drop(att(norm1(x))), then x = x + drop(ff(norm2(x)))",
}


def silence_attention_dropout(att: nn.Module) -> None:
    """Turn off the attention layer's own dropout, whichever way it reads its rate: course_lib's MultiHeadAttention
    reads self.drop_rate (F.scaled_dot_product_attention's dropout_p), a learner's may hold nn.Dropout layers."""
    if isinstance(getattr(att, "drop_rate", None), float):
        att.drop_rate = 0.0
    for module in att.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


@isolated_rng
def check_transformer_block(learner_impl) -> None:
    """Check `learner_impl`, the pre-LN transformer block of notebook 06.

    learner_impl(cfg) takes a GPTConfig and, like course_lib.block.TransformerBlock, holds norm1 and norm2
    (course_lib LayerNorm), att (course_lib MultiHeadAttention), ff (course_lib FeedForward) and
    drop_shortcut (nn.Dropout(cfg.drop_rate)); forward(x) maps (batch, tokens, emb_dim) to the same shape."""
    ck = Checker("check_transformer_block")
    require_class(ck, learner_impl, "MyBlock(cfg)")
    cfg = GPTConfig(vocab_size=50, context_length=8, emb_dim=8, n_heads=2, n_layers=1, drop_rate=0.0, qkv_bias=False)
    mine = build(ck, learner_impl, cfg, signature="MyBlock(cfg) with a GPTConfig")
    ref = TransformerBlock(cfg)
    with torch.no_grad():  # LayerNorms that are not the identity, so that using the wrong one shows
        for norm in (ref.norm1, ref.norm2):
            norm.scale.copy_(1 + 0.5 * torch.randn(cfg.emb_dim))
            norm.shift.copy_(0.5 * torch.randn(cfg.emb_dim))
    ref = ref.double().eval()
    state = ref.state_dict()
    names = set(mine.state_dict())
    if names and not any(k.startswith("norm2.") for k in names) and any(k.startswith("norm1.") for k in names):
        ck.fail("your block has no norm2", BLOCK_BUGS["shared_norm1"])
    load_reference_weights(ck, mine, state)
    mine = mine.double().eval()
    ck.ok()
    fallback = "pre-LN: x = x + drop_shortcut(att(norm1(x))), then x = x + drop_shortcut(ff(norm2(x)))"
    with torch.no_grad():
        for x, situation in ((torch.randn(2, 5, cfg.emb_dim, dtype=torch.float64), "on a batch (2, 5, 8)"),
                             (torch.randn(1, 1, cfg.emb_dim, dtype=torch.float64), "on one token (1, 1, 8)")):
            got = ck.call(f"forward {situation}", mine, x)
            variants = table_variants(BLOCK_BUGS, functools.partial(block_variant, ref, x))
            compare(ck, got, ref(x), variants, situation, fallback)

        # Dropout, in training mode, one sub-layer at a time: silence attention's own dropout and one sub-layer's
        # output, so that the block computes x + drop(sublayer(norm(x))). Correct: some entries equal x exactly;
        # dropout on the sum (shortcut included) zeroes entries instead.
        dropping = build(ck, learner_impl, GPTConfig(vocab_size=50, context_length=8, emb_dim=8, n_heads=2,
                                                     n_layers=1, drop_rate=0.5, qkv_bias=False),
                         signature="MyBlock(cfg)")
        load_reference_weights(ck, dropping, state)
        dropping = dropping.double().train()
        silence_attention_dropout(dropping.att)
        x = torch.randn(4, 8, cfg.emb_dim, dtype=torch.float64)
        for kept, silenced, bug in (
                ("attention", linear_layers(dropping.ff)[-1],
                 "no dropout on the sub-layer outputs: x = x + self.drop_shortcut(self.att(self.norm1(x)))"),
                ("feed-forward", getattr(dropping.att, "out_proj", None) or linear_layers(dropping.att)[-1],
                 "no dropout on the feed-forward shortcut: x = x + self.drop_shortcut(self.ff(self.norm2(x)))")):
            state_before = {k: v.clone() for k, v in silenced.state_dict().items()}
            silenced.weight.zero_()
            silenced.bias.zero_()
            out = ck.call(f"forward in training mode with drop_rate 0.5 ({kept} only)", dropping, x)
            silenced.load_state_dict(state_before)
            if (out == 0).double().mean() > 0.2:
                ck.fail("in training mode with drop_rate 0.5, about half of your block's outputs are exactly 0: "
                        "dropout also wipes out the shortcut",
                        "shortcut added before dropout: apply drop_shortcut to the sub-layer's output only, "
                        "x = x + drop_shortcut(att(norm1(x))), not drop_shortcut(x + att(norm1(x)))")
            if (out - x == 0).double().mean() < 0.2:
                ck.fail(f"in training mode with drop_rate 0.5, none of the {kept} outputs is dropped", bug)
        dropping.eval()
        if not torch.equal(dropping(x), dropping(x)):
            ck.fail("in eval mode two calls on the same input give different outputs",
                    "dropout still runs in eval mode: use nn.Dropout (it follows .eval()) or "
                    "F.dropout(..., training=self.training)")
        ck.ok()
    ck.done("Your block matches course_lib's TransformerBlock: pre-LN, dropout on each sub-layer, two shortcuts.")

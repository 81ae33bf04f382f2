"""The checks of the exercises in notebooks/05_attention.ipynb."""

import functools
import inspect
import math
from dataclasses import replace

import torch
from torch import Tensor, nn

from course_lib.attention import CausalAttention, MultiHeadAttention
from course_lib.config import GPTConfig

from .core import Checker, build, compare, isolated_rng, require_class, require_function


def attend(q, k, v, scale, mask="causal", softmax_dim=-1):
    """Attention with a deliberate choice of scale, mask and softmax dimension; q, k, v: (..., tokens, d)."""
    n = q.shape[-2]
    ones = torch.ones(n, n, dtype=torch.bool, device=q.device)
    masks = {"causal": torch.triu(ones, 1), "diagonal": torch.triu(ones, 0), "one_ahead": torch.triu(ones, 2),
             "past": torch.tril(ones, -1)}
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., tokens, tokens)
    if mask in masks:
        weights = torch.softmax(scores.masked_fill(masks[mask], float("-inf")), dim=softmax_dim)
    elif mask == "zero":
        weights = torch.softmax(scores.masked_fill(masks["causal"], 0.0), dim=softmax_dim)
    elif mask == "after_softmax":
        weights = torch.softmax(scores, dim=softmax_dim).masked_fill(masks["causal"], 0.0)
    elif mask == "after_softmax_inf":
        weights = torch.softmax(scores, dim=softmax_dim).masked_fill(masks["causal"], float("-inf"))
    else:  # "none"
        weights = torch.softmax(scores, dim=softmax_dim)
    return weights @ v


def attention_variants(core, d_k: int, others: dict[str, int]):
    """Known mistakes of scaled causal attention; core(scale=..., mask=..., softmax_dim=...) computes one."""
    found = [
        ("the mask is applied after the softmax, so the weights of the past do not sum to 1 and the future "
         "still shapes them: mask the scores with -inf, then take the softmax", lambda: core(mask="after_softmax")),
        ("the mask is applied after the softmax: mask the scores with -inf, then take the softmax",
         lambda: core(mask="after_softmax_inf")),
        ("no causal mask: every token sees the future; fill the scores above the diagonal with -inf "
         "(torch.triu(..., diagonal=1)) before the softmax", lambda: core(mask="none")),
        ("the mask is off by one: it also hides the diagonal, so a token cannot see itself (and the first row "
         "is all -inf, NaN); use torch.triu(..., diagonal=1)", lambda: core(mask="diagonal")),
        ("the mask is off by one: each token also sees the next one; use torch.triu(..., diagonal=1)",
         lambda: core(mask="one_ahead")),
        ("the mask hides the past instead of the future: use torch.triu(..., diagonal=1), not torch.tril",
         lambda: core(mask="past")),
        ("masked scores are set to 0 instead of -inf, and exp(0) = 1 still gives the future a weight: use "
         "masked_fill(mask, float('-inf'))", lambda: core(mask="zero")),
        ("the softmax runs over the wrong dimension (the queries): use torch.softmax(scores, dim=-1), so each "
         "query's weights over the keys sum to 1", lambda: core(softmax_dim=-2)),
        ("the 1/sqrt(d_k) scaling is missing: divide the scores by sqrt(d_k) (the keys' last dimension) before "
         "the softmax", lambda: core(scale=1.0)),
        ("the scores are divided by d_k instead of sqrt(d_k)", lambda: core(scale=1 / d_k)),
        ("the scores are multiplied by sqrt(d_k) instead of divided", lambda: core(scale=math.sqrt(d_k))),
    ]
    for what, size in others.items():
        found.append((f"the scores are divided by sqrt({what}) = sqrt({size}); divide by sqrt(d_k), the size of "
                      f"one key vector ({d_k})", lambda s=size: core(scale=1 / math.sqrt(s))))
    return found


def check_bias_and_dropout(ck: Checker, make_mine, make_ref, layers: tuple[str, ...], x: Tensor,
                           n_heads: int = 1) -> None:
    """The two constructor arguments the default cases leave at False and 0: qkv_bias=True must give W_query,
    W_key and W_value biases that the forward adds; drop_rate must drop attention weights in training mode
    (rescaled, so the mean output is the same) and nothing in eval mode. make_*(qkv_bias, drop_rate) build a
    module; x is (batch, tokens, emb_dim)."""
    mine, ref = make_mine(True, 0.0), make_ref(True, 0.0).double().eval()
    for name in ("W_query", "W_key", "W_value"):
        if getattr(getattr(mine, name, None), "bias", None) is None:
            ck.fail(f"with qkv_bias=True, {name} has no bias",
                    "qkv_bias is ignored: build the projection with bias=qkv_bias, e.g. nn.Linear(..., bias=qkv_bias)")
    mine = mine.double().eval()
    with torch.no_grad():
        for name in ("W_query", "W_key", "W_value"):
            getattr(ref, name).bias.normal_()  # non-zero biases: a forward that skips them shows
        for name in layers:
            getattr(mine, name).load_state_dict(getattr(ref, name).state_dict())
        compare(ck, ck.call("forward with qkv_bias=True", mine, x), ref(x), [], "with qkv_bias=True",
                "the biases must be added: call the layers themselves, self.W_query(x)")
        rate = DROP_RATE
        mine, ref = make_mine(False, rate).double(), make_ref(False, rate).double()
        for name in layers:
            getattr(mine, name).load_state_dict(getattr(ref, name).state_dict())
        expected = ref.eval()(x)
        compare(ck, ck.call(f"forward in eval mode with drop_rate={rate}", mine.eval(), x), expected, [],
                f"with drop_rate={rate} in eval mode", "dropout must be off in eval mode: use nn.Dropout, which "
                "follows the module's mode (or F.dropout(..., training=self.training))")
        check_dropout_on_weights(ck, mine, ref, layers, x.shape[-1], n_heads, rate)


DROP_RATE = 0.4  # not 0.1, 0.2 or 0.5: a rate written into the code instead of drop_rate shows


def check_dropout_on_weights(ck: Checker, mine: nn.Module, ref: nn.Module, layers: tuple[str, ...], emb_dim: int,
                             n_heads: int, rate: float) -> None:
    """In training mode, on single tokens, dropout on the attention weights keeps or drops each head's whole
    output: a token's only weight (on itself) is 1, so a head returns its value / (1 - rate) or 0. out_proj, if
    any, becomes the identity, so each head's block of the output shows it. Dropout after out_proj (or on the
    values, or on the output) drops single numbers instead; a rate fixed in the code drops another share."""
    with torch.no_grad():
        if "out_proj" in layers:
            ref.out_proj.weight.copy_(torch.eye(emb_dim, dtype=ref.out_proj.weight.dtype))
            ref.out_proj.bias.zero_()
        for name in layers:
            getattr(mine, name).load_state_dict(getattr(ref, name).state_dict())
        tokens = torch.randn(64, 1, emb_dim, dtype=torch.float64)
        expected = ref.eval()(tokens)  # (64, 1, out_dim): every head keeps its value
        mine.train()
        draws = torch.stack([ck.call(f"forward in training mode with drop_rate={rate}", mine, tokens)
                             for _ in range(40)])  # (40, 64, 1, out_dim)
    if tuple(draws.shape[1:]) != tuple(expected.shape):
        ck.fail(f"in training mode your output has shape {tuple(draws.shape[1:])}, expected {tuple(expected.shape)}",
                "training mode must compute the same shapes as eval mode")
    ratio = (draws / expected).reshape(*draws.shape[:-1], n_heads, -1)  # (draws, 64, 1, heads, head_dim)
    dropped = (draws.reshape(ratio.shape) == 0).all(dim=-1)
    if torch.allclose(draws, expected.expand_as(draws), atol=1e-10, rtol=1e-8):
        ck.fail(f"with drop_rate={rate} in training mode, nothing is dropped",
                "drop_rate is ignored: drop attention weights after the softmax in training mode, "
                "self.dropout = nn.Dropout(drop_rate) and weights = self.dropout(weights)")
    kept_scale = ratio[~dropped]  # (kept heads, head_dim): all equal to 1 / (1 - rate) if correct
    mixed = ((draws.reshape(ratio.shape) == 0).any(dim=-1) & ~dropped).any() or \
        not torch.allclose(kept_scale, kept_scale[..., :1].expand_as(kept_scale), atol=1e-6, rtol=1e-6)
    if mixed:
        ck.fail(f"with drop_rate={rate} in training mode, single numbers of a head's output are dropped, where "
                "dropout on the attention weights keeps or drops a token's whole head on a one-token input",
                "dropout is applied after the attention (to the output, after out_proj, or to the values) instead "
                "of on the attention weights: weights = self.dropout(torch.softmax(scores, dim=-1)), then "
                "weights @ values")
    share = dropped.double().mean().item()
    scale = kept_scale.mean().item() if kept_scale.numel() else float("nan")
    if abs(share - rate) > 0.06:
        fixed = round(share, 1)
        ck.fail(f"with drop_rate={rate} in training mode, {share:.0%} of the heads' weights are dropped",
                f"the dropout rate is fixed (about {fixed}) instead of the drop_rate argument: "
                "nn.Dropout(drop_rate) (or cfg.drop_rate), not a number written into the code")
    if abs(scale - 1 / (1 - rate)) > 1e-6:
        ck.fail(f"with drop_rate={rate} in training mode, the kept weights are multiplied by {scale:.4g}, "
                f"expected 1 / (1 - {rate}) = {1 / (1 - rate):.4g}",
                "the kept attention weights must be divided by (1 - drop_rate), as nn.Dropout does, so that "
                "dropout leaves the mean unchanged")
    ck.ok()


@isolated_rng
def check_causal_attention(learner_impl) -> None:
    """Check causal self-attention from notebook 05, given either

    * a function `my_attention(queries, keys, values)` on float tensors (batch, tokens, d_k) that returns the
      context vectors (batch, tokens, d_k), or
    * a class like course_lib.attention.CausalAttention: MyCausalAttention(emb_dim, head_dim, context_length, drop_rate,
      qkv_bias=False) with nn.Linear layers W_query, W_key, W_value, and forward(x): (batch, tokens, emb_dim) ->
      (batch, tokens, head_dim).

    Compared with course_lib.attention.CausalAttention (scale by 1/sqrt(d_k), mask the future with -inf,
    softmax over the keys, weighted sum of the values)."""
    ck = Checker("check_causal_attention")
    fallback = ("follow the order scores = queries @ keys.transpose(-2, -1) -> divide by sqrt(d_k) -> "
                "masked_fill(future, -inf) -> softmax(dim=-1) -> @ values")
    batch, tokens, d_k = 2, 5, 4
    with torch.no_grad():
        if inspect.isclass(learner_impl):
            require_class(ck, learner_impl, "MyCausalAttention(emb_dim, head_dim, context_length, drop_rate)")
            emb_dim, context_length = 6, 8
            mine = build(ck, learner_impl, emb_dim, d_k, context_length, 0.0,
                         signature="MyCausalAttention(emb_dim, head_dim, context_length, drop_rate, qkv_bias=False)")
            ref = CausalAttention(emb_dim, d_k, context_length, 0.0).double().eval()
            for name in ("W_query", "W_key", "W_value"):
                layer = getattr(mine, name, None)
                if not isinstance(layer, nn.Linear) or tuple(layer.weight.shape) != (d_k, emb_dim):
                    ck.fail(f"your class has no nn.Linear {name} mapping emb_dim -> head_dim",
                            f"name the projections as in the lesson: self.{name} = nn.Linear(emb_dim, head_dim, "
                            "bias=qkv_bias)")
                if layer.bias is not None:
                    ck.fail(f"{name} has a bias although qkv_bias is False",
                            f"pass the flag on: self.{name} = nn.Linear(emb_dim, head_dim, bias=qkv_bias)")
            mine = mine.double().eval()
            for name in ("W_query", "W_key", "W_value"):
                getattr(mine, name).load_state_dict(getattr(ref, name).state_dict())
            ck.ok()
            others = {"emb_dim": emb_dim, "tokens": tokens}

            def run(x):
                return ck.call(f"forward on x of shape {tuple(x.shape)}", mine, x)

            def qkv(x):
                return ref.W_query(x), ref.W_key(x), ref.W_value(x)

            def extra_arguments():
                check_bias_and_dropout(
                    ck, lambda bias, rate: build(ck, learner_impl, emb_dim, d_k, context_length, rate, bias,
                                                 signature="MyCausalAttention(emb_dim, head_dim, context_length, "
                                                 "drop_rate, qkv_bias=False)"),
                    lambda bias, rate: CausalAttention(emb_dim, d_k, context_length, rate, bias),
                    ("W_query", "W_key", "W_value"), torch.randn(batch, tokens, emb_dim, dtype=torch.float64))
        else:
            require_function(ck, learner_impl, "my_attention(queries, keys, values)")
            # The reference on given queries/keys/values: a CausalAttention whose projections pick them out of
            # x = [queries | keys | values].
            emb_dim = 3 * d_k
            ref = CausalAttention(emb_dim, d_k, tokens, 0.0).double().eval()
            eye = torch.eye(d_k, dtype=torch.float64)
            for i, name in enumerate(("W_query", "W_key", "W_value")):
                weight = torch.zeros(d_k, emb_dim, dtype=torch.float64)
                weight[:, i * d_k:(i + 1) * d_k] = eye
                getattr(ref, name).weight.copy_(weight)
            others = {"tokens": tokens}

            def qkv(x):
                return x[..., :d_k], x[..., d_k:2 * d_k], x[..., 2 * d_k:]

            def extra_arguments():
                pass  # a function has no qkv_bias or drop_rate

            def run(x):
                q, k, v = (t.clone() for t in qkv(x))
                return ck.call(f"my_attention on queries, keys and values of shape {tuple(q.shape)}",
                               learner_impl, q, k, v)

        for x, situation in ((torch.randn(batch, tokens, emb_dim, dtype=torch.float64), f"on a batch of {batch} "
                              f"sequences of {tokens} tokens"),
                             (torch.randn(1, 1, emb_dim, dtype=torch.float64), "on one token")):
            q, k, v = qkv(x)

            def core(scale=1 / math.sqrt(d_k), mask="causal", softmax_dim=-1, q=q, k=k, v=v):
                return attend(q, k, v, scale, mask, softmax_dim)

            compare(ck, run(x), ref(x), attention_variants(core, d_k, others), situation, fallback)
        # The future must not leak: changing the last token must leave every earlier output as it was.
        x = torch.randn(1, tokens, emb_dim, dtype=torch.float64)
        changed = x.clone()
        changed[:, -1] += 10 * torch.randn(emb_dim, dtype=torch.float64)
        before, after = run(x), run(changed)
        if not torch.allclose(before[:, :-1], after[:, :-1], atol=1e-8, rtol=1e-6):
            ck.fail("changing only the last token changes the outputs of earlier tokens: the future leaks",
                    "the causal mask is missing or applied in the wrong place; mask the scores above the diagonal "
                    "with -inf before the softmax")
        ck.ok()
    extra_arguments()
    ck.done("Your causal attention matches course_lib's CausalAttention: scale, mask, softmax, weighted sum.")


def mha_variant(ref: MultiHeadAttention, x: Tensor, split="heads", merge="heads", n_heads=None, scale=None,
                mask="causal", softmax_dim=-1, out_proj=True) -> Tensor:
    """Multi-head attention with ref's weights and one deliberate choice of how heads are split and merged."""
    batch, tokens, _ = x.shape
    heads = ref.n_heads if n_heads is None else n_heads
    head_dim = ref.emb_dim // heads

    def split_heads(t):  # (batch, tokens, emb_dim) -> (batch, heads, tokens, head_dim)
        if split == "no_transpose":
            return t.reshape(batch, heads, tokens, head_dim)
        if split == "interleaved":
            return t.view(batch, tokens, head_dim, heads).permute(0, 3, 1, 2)
        return t.view(batch, tokens, heads, head_dim).transpose(1, 2)

    q, k, v = (split_heads(layer(x)) for layer in (ref.W_query, ref.W_key, ref.W_value))
    context = attend(q, k, v, 1 / math.sqrt(head_dim) if scale is None else scale, mask, softmax_dim)  # (batch, heads, tokens, hd)
    if merge == "no_transpose":
        merged = context.reshape(batch, tokens, ref.emb_dim)
    elif merge == "interleaved":
        merged = context.permute(0, 2, 3, 1).reshape(batch, tokens, ref.emb_dim)
    else:
        merged = context.transpose(1, 2).reshape(batch, tokens, ref.emb_dim)
    return ref.out_proj(merged) if out_proj else merged


@isolated_rng
def check_multihead_attention(learner_impl) -> None:
    """Check `learner_impl`, fused causal multi-head attention from notebook 05.

    learner_impl(cfg), like course_lib.attention.MultiHeadAttention, holds nn.Linear layers W_query, W_key,
    W_value and out_proj (emb_dim -> emb_dim); forward(x) maps (batch, tokens, emb_dim) to the same shape,
    splitting emb_dim into n_heads heads of emb_dim // n_heads dimensions."""
    ck = Checker("check_multihead_attention")
    require_class(ck, learner_impl, "MyMultiHeadAttention(cfg)")
    cfg = GPTConfig(vocab_size=50, context_length=8, emb_dim=8, n_heads=2, n_layers=1, drop_rate=0.0, qkv_bias=False)
    emb_dim, head_dim = cfg.emb_dim, cfg.emb_dim // cfg.n_heads
    mine = build(ck, learner_impl, cfg, signature="MyMultiHeadAttention(cfg) with a GPTConfig")
    ref = MultiHeadAttention(cfg).double().eval()
    shape = (emb_dim, emb_dim)  # every projection maps emb_dim -> emb_dim
    for name in ("W_query", "W_key", "W_value", "out_proj"):
        layer = getattr(mine, name, None)
        if not isinstance(layer, nn.Linear):
            if name == "out_proj":
                ck.fail("your class has no out_proj layer",
                        "out_proj is missing: after merging the heads, mix them with self.out_proj = "
                        "nn.Linear(emb_dim, emb_dim)")
            ck.fail(f"your class has no nn.Linear called {name}",
                    f"name the layers as in the lesson: self.{name} = nn.Linear(emb_dim, emb_dim, bias=qkv_bias)")
        if tuple(layer.weight.shape) != shape:
            ck.fail(f"{name} has weight shape {tuple(layer.weight.shape)}, expected {shape}",
                    f"{name} maps {shape[1]} -> {shape[0]} features: all heads together are emb_dim wide, each "
                    "head gets emb_dim // n_heads of them")
        if (layer.bias is None) != (getattr(ref, name).bias is None):
            ck.fail(f"{name} {'has no' if layer.bias is None else 'has a'} bias",
                    "W_query, W_key and W_value take bias=qkv_bias (False by default); out_proj keeps its bias")
    ck.ok()
    mine = mine.double().eval()
    with torch.no_grad():
        for name in ("W_query", "W_key", "W_value", "out_proj"):
            getattr(mine, name).load_state_dict(getattr(ref, name).state_dict())
        split_bug = ("heads are split along the wrong axis: t.view(batch, n_heads, tokens, head_dim) without a "
                     "transpose mixes tokens into heads; use t.view(batch, tokens, n_heads, head_dim).transpose(1, 2)")
        interleave_bug = ("heads are split along the wrong axis: view(batch, tokens, head_dim, n_heads) gives head h "
                          "the features h, h + n_heads, ...; use view(batch, tokens, n_heads, head_dim)"
                          ".transpose(1, 2)")
        merge_bug = ("the heads are merged without transposing back: use context.transpose(1, 2).reshape(batch, "
                     "tokens, emb_dim) (or .contiguous().view(...))")
        for x, situation in ((torch.randn(2, 5, emb_dim, dtype=torch.float64), "on a batch of 2 sequences of 5 tokens"),
                             (torch.randn(1, 1, emb_dim, dtype=torch.float64), "on one token")):
            v = functools.partial(mha_variant, ref, x)
            variants = [
                ("out_proj is missing (or not applied): after merging the heads, return self.out_proj(context)",
                 lambda: v(out_proj=False)),
                (split_bug, lambda: v(split="no_transpose", merge="no_transpose")),
                (split_bug, lambda: v(split="no_transpose")),
                (interleave_bug, lambda: v(split="interleaved", merge="interleaved")),
                (interleave_bug, lambda: v(split="interleaved")),
                (merge_bug, lambda: v(merge="no_transpose")),
                ("the scores are divided by sqrt(emb_dim); each head's dot products have head_dim terms, so divide "
                 "by sqrt(head_dim) = sqrt(emb_dim // n_heads)", lambda: v(scale=1 / math.sqrt(emb_dim))),
                ("n_heads is ignored: the layer computes one big head; split emb_dim into n_heads heads of "
                 "head_dim each", lambda: v(n_heads=1)),
                *attention_variants(lambda scale=1 / math.sqrt(head_dim), mask="causal", softmax_dim=-1:
                                    v(scale=scale, mask=mask, softmax_dim=softmax_dim), head_dim,
                                    {"emb_dim": emb_dim, "tokens": x.shape[1]}),
            ]
            got = ck.call(f"forward {situation}", mine, x)
            compare(ck, got, ref(x), variants, situation,
                    "split with view(batch, tokens, n_heads, head_dim).transpose(1, 2), attend per head, merge "
                    "with transpose(1, 2).reshape(batch, tokens, emb_dim), then out_proj")
        x = torch.randn(1, 5, emb_dim, dtype=torch.float64)
        changed = x.clone()
        changed[:, -1] += 10 * torch.randn(emb_dim, dtype=torch.float64)
        if not torch.allclose(mine(x)[:, :-1], mine(changed)[:, :-1], atol=1e-8, rtol=1e-6):
            ck.fail("changing only the last token changes the outputs of earlier tokens: the future leaks",
                    "the causal mask is missing or misplaced; mask each head's scores above the diagonal with -inf "
                    "before the softmax")
        ck.ok()
    check_bias_and_dropout(ck, lambda bias, rate: build(ck, learner_impl, replace(cfg, qkv_bias=bias, drop_rate=rate),
                                                        signature="MyMultiHeadAttention(cfg) with a GPTConfig"),
                           lambda bias, rate: MultiHeadAttention(replace(cfg, qkv_bias=bias, drop_rate=rate)),
                           ("W_query", "W_key", "W_value", "out_proj"), torch.randn(2, 5, emb_dim, dtype=torch.float64),
                           n_heads=cfg.n_heads)
    ck.done("Your multi-head attention matches course_lib's MultiHeadAttention: split, attend, merge, project.")

"""The exercise checks catch each planted bug with a message that names it, and pass correct code.

Every learner-style implementation below is written independently of course_lib and takes a `bug` argument:
None is correct; any other value plants one named mistake, which its check must report."""

import functools
import importlib
import math
import pkgutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib import checks
from course_lib.attention import CausalAttention, MultiHeadAttention
from course_lib.block import TransformerBlock
from course_lib.checks import CheckFailed
from course_lib.checks import block as block_checks
from course_lib.checks import generation as generation_checks
from course_lib.checks import model as model_checks
from course_lib.checks.training import reference_next_token_loss
from course_lib.decoding import penalize_repetition
from course_lib.embeddings import GPTEmbedding
from course_lib.feedforward import GELU, FeedForward
from course_lib.generation import scale_logits, top_k_filter, top_p_filter
from course_lib.model import GPTModel
from course_lib.normalization import LayerNorm
from course_lib.tokenization import count_pairs, merge_pair


def passes(check, impl, capsys, praise: str) -> None:
    """The check accepts impl and prints exactly one friendly line."""
    check(impl)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{check.__name__}: all ") and "checks passed" in lines[0] and praise in lines[0]


def fails(check, impl, match: str) -> None:
    with pytest.raises(CheckFailed, match=match) as info:
        check(impl)
    assert isinstance(info.value, AssertionError)
    assert str(info.value).startswith(f"{check.__name__}: ")
    assert "\nLikely bug: " in str(info.value)


# ----------------------------------------------------------------------------------------- merge_pair, count_pairs

def my_merge_pair(symbols, pair, bug=None):
    out, i = [], 0
    end = len(symbols) - 1 if bug == "drops_tail" else len(symbols)
    if bug == "right_to_left":
        symbols, pair = symbols[::-1], pair[::-1]
    merged_once = False
    while i < end:
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair and not (bug == "first_only" and merged_once):
            out.append(pair[1] + pair[0] if bug == "reversed_join" else pair[0] + pair[1])
            merged_once = True
            i += 1 if bug == "keeps_second" else 2
        else:
            out.append(symbols[i])
            i += 1
    if bug == "right_to_left":
        out = [s[::-1] for s in out[::-1]]
    return out if bug == "list" else tuple(out)


def merge_pair_marking(symbols, pair):
    """A tempting version: mark every matching position, then drop the marked second halves."""
    out = list(symbols)
    for i in range(len(symbols) - 1):
        if (symbols[i], symbols[i + 1]) == pair:
            out[i], out[i + 1] = pair[0] + pair[1], None
    return tuple(s for s in out if s is not None)


def merge_pair_from_first(symbols, pair):
    """Correct for every word with at least one symbol, but starts from symbols[0]."""
    out = [symbols[0]]
    for s in symbols[1:]:
        if (out[-1], s) == pair:
            out[-1] = pair[0] + pair[1]
        else:
            out.append(s)
    return tuple(out)


MERGE_BUGS = {
    "drops_tail": "last symbol is lost",
    "first_only": "only the first occurrence",
    "keeps_second": "second symbol of the pair is kept",
    "right_to_left": "scan runs right to left",
    "list": "return a tuple",
    "reversed_join": "joined symbol is reversed",
}


def test_merge_pair_passes(capsys):
    passes(checks.check_merge_pair, merge_pair, capsys, "merge_pair")
    passes(checks.check_merge_pair, my_merge_pair, capsys, "overlapping pairs included")


@pytest.mark.parametrize("bug", MERGE_BUGS)
def test_merge_pair_bugs(bug):
    fails(checks.check_merge_pair, functools.partial(my_merge_pair, bug=bug), MERGE_BUGS[bug])


def test_merge_pair_overlap_and_empty_word():
    fails(checks.check_merge_pair, merge_pair_marking, "overlapping pairs are merged twice")
    fails(checks.check_merge_pair, merge_pair_from_first, "one-symbol and empty words must work")


def my_count_pairs(words, bug=None):
    counts = {}
    for symbols, freq in words.items():
        pairs = list(zip(symbols, symbols[1:]))
        for pair in set(pairs) if bug == "set" else pairs:
            counts[pair] = counts.get(pair, 0) + (1 if bug == "no_freq" else freq)
    return counts


def test_count_pairs(capsys):
    passes(checks.check_count_pairs, count_pairs, capsys, "count_pairs")
    passes(checks.check_count_pairs, my_count_pairs, capsys, "count_pairs")
    fails(checks.check_count_pairs, functools.partial(my_count_pairs, bug="no_freq"), "each word counted once")
    fails(checks.check_count_pairs, functools.partial(my_count_pairs, bug="set"), "repeats inside a word")


# ----------------------------------------------------------------------------------------- sinusoidal, embedding

def my_sinusoidal_table(emb_dim, context_length, bug=None):
    table = torch.zeros(context_length, emb_dim)
    for pos in range(context_length):
        for j in range(emb_dim):
            exponent = j if bug == "column_speed" else 2 * (j // 2)
            angle = pos * 10000 ** ((1 if bug == "no_minus" else -1) * exponent / emb_dim)
            use_sin = (j % 2 == 0) != (bug == "swapped")
            table[pos, j] = math.sin(angle) if use_sin else math.cos(angle)
    if bug == "odd_crash" and emb_dim % 2:
        raise RuntimeError("shape mismatch: value tensor of shape [7, 5] cannot be broadcast to [7, 4]")
    if bug == "blocks":
        table = torch.cat([table[:, 0::2], table[:, 1::2]], dim=1)  # all sines, then all cosines
    return table


SINUSOIDAL_BUGS = {"swapped": "sine and cosine are swapped", "column_speed": "every column has its own speed",
                   "no_minus": "lost its minus sign", "odd_crash": "odd emb_dim", "blocks": "sit in two blocks"}


def test_sinusoidal_passes(capsys):
    passes(checks.check_sinusoidal_table, my_sinusoidal_table, capsys, "odd emb_dim included")


@pytest.mark.parametrize("bug", SINUSOIDAL_BUGS)
def test_sinusoidal_bugs(bug):
    fails(checks.check_sinusoidal_table, functools.partial(my_sinusoidal_table, bug=bug), SINUSOIDAL_BUGS[bug])


def make_embedding(bug=None):
    class MyGPTEmbedding(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.emb_dim)
            rows = cfg.vocab_size if bug == "pos_rows" else cfg.context_length
            self.pos_emb = nn.Embedding(rows, cfg.emb_dim)
            self.drop = nn.Dropout(0.0 if bug == "no_dropout" else cfg.drop_rate)

        def forward(self, token_ids, start_pos=0):
            first = 1 if bug == "from_one" else 0 if bug == "ignores_start" else start_pos + 0
            positions = torch.arange(first, first + token_ids.shape[1])
            if bug == "by_token_id":
                positions = token_ids
            x = self.tok_emb(token_ids)
            if bug != "no_pos":
                x = x + self.pos_emb(positions)
            return self.drop(x)

    return MyGPTEmbedding


EMBEDDING_BUGS = {"no_pos": "position embedding is never added", "by_token_id": "looked up with the token ids",
                  "from_one": "positions start at 1", "no_dropout": "no dropout after the sum",
                  "ignores_start": "start_pos is ignored", "pos_rows": "one row per position"}


def test_embedding_passes(capsys):
    passes(checks.check_gpt_embedding, GPTEmbedding, capsys, "then dropout")
    passes(checks.check_gpt_embedding, make_embedding(), capsys, "then dropout")


@pytest.mark.parametrize("bug", EMBEDDING_BUGS)
def test_embedding_bugs(bug):
    fails(checks.check_gpt_embedding, make_embedding(bug), EMBEDDING_BUGS[bug])


# ----------------------------------------------------------------------------------------- layernorm

def make_layernorm(bug=None):
    class MyLayerNorm(nn.Module):
        def __init__(self, emb_dim, eps=1e-5):
            super().__init__()
            self.eps = {"no_eps": 0.0, "eps_ignored": 1e-5}.get(bug, eps)
            if bug == "weight_bias":
                self.weight, self.bias = nn.Parameter(torch.ones(emb_dim)), nn.Parameter(torch.zeros(emb_dim))
            elif bug != "no_params":
                self.scale, self.shift = nn.Parameter(torch.ones(emb_dim)), nn.Parameter(torch.zeros(emb_dim))

        def forward(self, x):
            dim = 1 if bug == "wrong_axis" else -1
            mean = x.mean(dim=dim, keepdim=True)
            var = ((x - mean) ** 2).sum(dim=dim, keepdim=True) / (x.shape[dim] - (bug == "unbiased"))
            if bug == "in_place":
                x -= mean
                centred = x
            else:
                centred = x if bug == "no_mean" else x - mean
            if bug == "eps_outside":
                normed = centred / (var.sqrt() + self.eps)
            else:
                normed = centred / (var + self.eps).sqrt()
            if bug in ("no_params", "unused_params", "weight_bias"):
                return normed
            return self.scale * normed + self.shift

    return MyLayerNorm


LAYERNORM_BUGS = {"eps_outside": "eps is added outside the square root", "unbiased": "unbiased variance",
                  "wrong_axis": "normalising over the wrong dimension", "no_params": "no learnable scale and shift",
                  "unused_params": "scale and shift are not applied", "no_eps": "eps is missing",
                  "no_mean": "the mean is not subtracted", "weight_bias": "name them as in the lesson",
                  "in_place": "in-place operation on the input", "eps_ignored": "your eps argument is ignored"}


def test_layernorm_passes(capsys):
    passes(checks.check_layernorm, LayerNorm, capsys, "nn.LayerNorm")
    passes(checks.check_layernorm, make_layernorm(), capsys, "nn.LayerNorm")


@pytest.mark.parametrize("bug", LAYERNORM_BUGS)
def test_layernorm_bugs(bug):
    fails(checks.check_layernorm, make_layernorm(bug), LAYERNORM_BUGS[bug])


def test_checks_reject_what_is_not_the_learner_class_or_function():
    with pytest.raises(TypeError, match=r"expects your class, not an instance of it: call "
                                        r"check_layernorm\(LayerNorm\)"):
        checks.check_layernorm(LayerNorm(4))
    with pytest.raises(TypeError, match="is not one: declare it as class Plain"):
        checks.check_layernorm(type("Plain", (), {}))
    with pytest.raises(TypeError, match="expects your nn.Module class"):
        checks.check_layernorm("LayerNorm")
    with pytest.raises(TypeError, match="expects a function such as my_merge_pair.*got the class"):
        checks.check_merge_pair(LayerNorm)
    with pytest.raises(TypeError, match="expects a function such as my_top_k"):
        checks.check_top_k(3)
    with pytest.raises(TypeError, match="got an instance of CausalAttention: pass the function"):
        checks.check_causal_attention(CausalAttention(4, 4, 4, 0.0))
    with pytest.raises(TypeError, match=r"not an instance: call check_gelu\(GELU\)"):
        checks.check_gelu(GELU())


def test_a_crashing_constructor_is_reported_with_the_lesson_signature():
    class NeedsEps(nn.Module):
        def __init__(self, emb_dim, eps):
            super().__init__()

    fails(checks.check_layernorm, NeedsEps, r"NeedsEps\(6\) raised TypeError.*\nLikely bug: the constructor must "
                                            r"accept the lesson's arguments: MyLayerNorm\(emb_dim, eps=1e-5\)")


# ----------------------------------------------------------------------------------------- gelu, feedforward

def my_gelu(x, bug=None):
    if bug == "exact":
        return x * 0.5 * (1 + torch.erf(x / math.sqrt(2)))
    if bug == "relu":
        return torch.clamp(x, min=0)
    c = 2 / math.pi if bug == "constant" else math.sqrt(2 / math.pi)
    inner = c * (x + (0.0 if bug == "no_cubic" else 0.044715) * x * x * x)
    gate = (1.0 if bug == "no_half" else 0.5) * (1 + torch.tanh(inner))
    return x.mul_(gate) if bug == "in_place" else x * gate


GELU_BUGS = {"exact": "exact GELU", "relu": "this is ReLU", "no_half": "factor 0.5 in front is missing",
             "constant": r"sqrt\(2 / pi\) written as 2 / pi", "no_cubic": "cubic term is missing",
             "in_place": "in-place operation"}


def test_gelu_passes(capsys):
    passes(checks.check_gelu, GELU, capsys, "tanh form")
    passes(checks.check_gelu, my_gelu, capsys, "tanh form")


@pytest.mark.parametrize("bug", GELU_BUGS)
def test_gelu_bugs(bug):
    fails(checks.check_gelu, functools.partial(my_gelu, bug=bug), GELU_BUGS[bug])


def make_feedforward(bug=None):
    class MyFeedForward(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            hidden = cfg.emb_dim if bug == "no_expansion" else 4 * cfg.emb_dim
            self.up, self.down = nn.Linear(cfg.emb_dim, hidden), nn.Linear(hidden, cfg.emb_dim)
            self.act = {"relu": nn.ReLU(), "exact": nn.GELU()}.get(bug, nn.GELU(approximate="tanh"))

        def forward(self, x):
            if bug == "no_activation":
                return self.down(self.up(x))
            if bug == "activation_after":
                return self.act(self.down(self.up(x)))
            return self.down(self.act(self.up(x)))

    return MyFeedForward


FEEDFORWARD_BUGS = {"no_expansion": "no 4x expansion", "no_activation": "activation is missing",
                    "relu": "ReLU instead of GELU", "exact": "exact GELU", "activation_after": "after the second Linear"}


def test_feedforward_passes(capsys):
    passes(checks.check_feedforward, FeedForward, capsys, "4 * emb_dim")
    passes(checks.check_feedforward, make_feedforward(), capsys, "4 * emb_dim")


@pytest.mark.parametrize("bug", FEEDFORWARD_BUGS)
def test_feedforward_bugs(bug):
    fails(checks.check_feedforward, make_feedforward(bug), FEEDFORWARD_BUGS[bug])


# ----------------------------------------------------------------------------------------- attention

def my_attention(queries, keys, values, bug=None, scale_dim=None, dropout=None):
    tokens = queries.shape[-2]
    scores = queries @ keys.transpose(-2, -1)  # (..., tokens, tokens)
    if bug != "no_scale":
        scores = scores / math.sqrt(scale_dim or keys.shape[-1])
    diagonal = {"diagonal": 0, "one_ahead": 2}.get(bug, 1)
    future = torch.triu(torch.ones(tokens, tokens, dtype=torch.bool), diagonal=diagonal)
    if bug == "past":
        future = torch.tril(torch.ones(tokens, tokens, dtype=torch.bool), diagonal=-1)
    dim = -2 if bug == "softmax_dim" else -1
    if bug == "after_softmax":
        weights = torch.softmax(scores, dim=dim).masked_fill(future, 0.0)
    elif bug == "no_mask":
        weights = torch.softmax(scores, dim=dim)
    else:
        fill = 0.0 if bug == "fill_zero" else -torch.inf
        weights = torch.softmax(scores.masked_fill(future, fill), dim=dim)
    return (weights if dropout is None else dropout(weights)) @ values


def attention_parts(module, d_in, d_out, qkv_bias, drop_rate, bug):
    """The projections and the attention dropout of a learner's attention class, with the planted bugs of its
    constructor arguments: qkv_bias ignored, biases never used, drop_rate ignored, kept weights not rescaled."""
    bias = qkv_bias and bug != "no_qkv_bias"
    module.W_query, module.W_key, module.W_value = (nn.Linear(d_in, d_out, bias=bias) for _ in range(3))
    module.dropout = UnscaledDropout(drop_rate) if bug == "dropout_not_rescaled" else nn.Dropout(
        0.0 if bug == "no_dropout" else drop_rate)


class UnscaledDropout(nn.Dropout):
    def forward(self, w):  # zeroes like nn.Dropout but forgets to divide the survivors by 1 - p
        return w * (torch.rand_like(w) >= self.p) if self.training else w


def projections(module, x, bug):
    if bug == "bias_unused":
        return tuple(F.linear(x, layer.weight) for layer in (module.W_query, module.W_key, module.W_value))
    return module.W_query(x), module.W_key(x), module.W_value(x)


ATTENTION_BUGS = {"after_softmax": "mask is applied after the softmax",
                  "no_scale": r"1/sqrt\(d_k\) scaling is missing",
                  "diagonal": "also hides the diagonal", "one_ahead": "each token also sees the next one",
                  "no_mask": "no causal mask", "softmax_dim": "softmax runs over the wrong dimension",
                  "fill_zero": "set to 0 instead of -inf", "past": "hides the past instead of the future"}


def make_causal_attention(bug=None):
    class MyCausalAttention(nn.Module):
        def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
            super().__init__()
            attention_parts(self, d_in, d_out, qkv_bias, dropout, bug)
            self.d_in = d_in

        def forward(self, x):
            scale_dim = self.d_in if bug == "scale_d_in" else None
            return my_attention(*projections(self, x, bug), bug, scale_dim, self.dropout)

    return MyCausalAttention


def test_causal_attention_passes(capsys):
    passes(checks.check_causal_attention, CausalAttention, capsys, "weighted sum")
    passes(checks.check_causal_attention, my_attention, capsys, "weighted sum")
    passes(checks.check_causal_attention, make_causal_attention(), capsys, "weighted sum")


@pytest.mark.parametrize("bug", ATTENTION_BUGS)
def test_causal_attention_function_bugs(bug):
    fails(checks.check_causal_attention, functools.partial(my_attention, bug=bug), ATTENTION_BUGS[bug])


ARGUMENT_BUGS = {"no_qkv_bias": "qkv_bias is ignored", "bias_unused": "the biases must be added",
                 "no_dropout": "drop_rate is ignored", "dropout_not_rescaled": r"divided by \(1 - drop_rate\)"}


@pytest.mark.parametrize("bug", ["after_softmax", "scale_d_in", *ARGUMENT_BUGS])
def test_causal_attention_class_bugs(bug):
    expected = {**ATTENTION_BUGS, **ARGUMENT_BUGS, "scale_d_in": r"divided by sqrt\(emb_dim\)"}[bug]
    fails(checks.check_causal_attention, make_causal_attention(bug), expected)


def make_multihead(bug=None):
    class MyMultiHeadAttention(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            d = cfg.emb_dim
            self.n_heads, self.head_dim, self.emb_dim = cfg.n_heads, d // cfg.n_heads, d
            attention_parts(self, d, d, cfg.qkv_bias, cfg.drop_rate, bug)
            if bug != "no_out_proj":
                self.out_proj = nn.Linear(d, d)

        def forward(self, x):
            batch, tokens, _ = x.shape

            def split(t):
                if bug == "view_no_transpose":
                    return t.view(batch, self.n_heads, tokens, self.head_dim)
                if bug == "interleaved":
                    return t.view(batch, tokens, self.head_dim, self.n_heads).permute(0, 3, 1, 2)
                return t.view(batch, tokens, self.n_heads, self.head_dim).transpose(1, 2)

            q, k, v = (split(t) for t in projections(self, x, bug))
            scale_dim = self.emb_dim if bug == "scale_emb_dim" else None
            context = my_attention(q, k, v, bug if bug == "after_softmax" else None, scale_dim, self.dropout)
            if bug in ("merge_no_transpose", "view_no_transpose"):
                merged = context.reshape(batch, tokens, self.emb_dim)
            else:
                merged = context.transpose(1, 2).reshape(batch, tokens, self.emb_dim)
            return merged if bug in ("out_proj_unused", "no_out_proj") else self.out_proj(merged)

    return MyMultiHeadAttention


MULTIHEAD_BUGS = {"view_no_transpose": r"split along the wrong axis: t.view\(batch, n_heads, tokens, head_dim\) "
                                       r"without a transpose",
                  "interleaved": r"split along the wrong axis: view\(batch, tokens, head_dim, n_heads\)",
                  "merge_no_transpose": "merged without transposing back",
                  "out_proj_unused": "out_proj is missing", "no_out_proj": "out_proj is missing",
                  "scale_emb_dim": r"divided by sqrt\(emb_dim\)", "after_softmax": "mask is applied after the softmax",
                  **ARGUMENT_BUGS}


def test_multihead_passes(capsys):
    passes(checks.check_multihead_attention, MultiHeadAttention, capsys, "split, attend, merge, project")
    passes(checks.check_multihead_attention, make_multihead(), capsys, "split, attend, merge, project")


@pytest.mark.parametrize("bug", MULTIHEAD_BUGS)
def test_multihead_bugs(bug):
    fails(checks.check_multihead_attention, make_multihead(bug), MULTIHEAD_BUGS[bug])


# ----------------------------------------------------------------------------------------- block

def make_block(bug=None):
    class MyBlock(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.norm1 = nn.LayerNorm(cfg.emb_dim) if bug == "torch_layernorm" else LayerNorm(cfg.emb_dim)
            self.att = MultiHeadAttention(cfg)
            if bug != "no_norm2":
                self.norm2 = LayerNorm(cfg.emb_dim)
            self.ff = FeedForward(cfg)
            self.drop_shortcut = nn.Dropout(cfg.drop_rate)

        def forward(self, x):
            drop = (lambda t: t) if bug == "no_dropout" else self.drop_shortcut
            norm2 = self.norm1 if bug in ("no_norm2", "norm1_twice") else self.norm2
            if bug == "post_ln":
                x = self.norm1(x + drop(self.att(x)))
                return self.norm2(x + drop(self.ff(x)))
            if bug == "dropout_after_shortcut":
                x = drop(x + self.att(self.norm1(x)))
                return drop(x + self.ff(norm2(x)))
            x = x + drop(self.att(self.norm1(x)))
            if bug == "no_second_shortcut":
                return drop(self.ff(norm2(x)))
            return x + drop(self.ff(norm2(x)))

    return MyBlock


BLOCK_BUGS = {"dropout_after_shortcut": "shortcut added before dropout", "post_ln": "post-LN instead of pre-LN",
              "no_norm2": "one shared LayerNorm", "norm1_twice": "one shared LayerNorm",
              "no_second_shortcut": "second shortcut is missing", "no_dropout": "no dropout on the sub-layer outputs",
              "torch_layernorm": "nn.LayerNorm names its parameters weight and bias"}


def test_block_passes(capsys):
    passes(checks.check_transformer_block, TransformerBlock, capsys, "pre-LN")
    passes(checks.check_transformer_block, make_block(), capsys, "pre-LN")


@pytest.mark.parametrize("bug", BLOCK_BUGS)
def test_block_bugs(bug):
    fails(checks.check_transformer_block, make_block(bug), BLOCK_BUGS[bug])


# ----------------------------------------------------------------------------------------- model

def make_model(bug=None):
    class MyGPTModel(nn.Module):  # the classic flat layout: tok_emb and pos_emb at the top level
        def __init__(self, cfg):
            super().__init__()
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.emb_dim)
            self.pos_emb = nn.Embedding(cfg.context_length, cfg.emb_dim)
            self.trf_blocks = nn.Sequential(*[TransformerBlock(cfg) for _ in range(cfg.n_layers)])
            if bug != "no_final_norm_attribute":
                self.final_norm = LayerNorm(cfg.emb_dim)
            self.out_head = nn.Linear(cfg.emb_dim, cfg.vocab_size, bias=bug == "head_bias")
            if bug == "tied":
                self.out_head.weight = self.tok_emb.weight

        def forward(self, token_ids):
            x = self.tok_emb(token_ids)
            if bug != "no_pos":
                x = x + self.pos_emb(torch.arange(token_ids.shape[1]))
            if bug == "not_chained":
                x = [block(x) for block in self.trf_blocks][-1]
            else:
                x = self.trf_blocks(x)
            if bug not in ("no_final_norm", "no_final_norm_attribute"):
                x = self.final_norm(x)
            logits = self.out_head(x)
            return logits.softmax(dim=-1) if bug == "softmax" else logits

    return MyGPTModel


MODEL_BUGS = {"no_pos": "no positional embedding", "no_final_norm": "final LayerNorm is missing",
              "no_final_norm_attribute": "final LayerNorm is missing",
              "not_chained": "every block reads the embeddings", "softmax": "returns probabilities",
              "head_bias": "GPT-2's output layer has none"}


def test_model_passes(capsys):
    passes(checks.check_gpt_model, GPTModel, capsys, "final norm")
    passes(checks.check_gpt_model, make_model(), capsys, "final norm")
    passes(checks.check_gpt_model, make_model("tied"), capsys, "final norm")


@pytest.mark.parametrize("bug", MODEL_BUGS)
def test_model_bugs(bug):
    fails(checks.check_gpt_model, make_model(bug), MODEL_BUGS[bug])


# ----------------------------------------------------------------------------------------- sampling

def my_scale_logits(logits, temperature, bug=None):
    if bug == "multiplied":
        return logits * temperature
    if bug == "after_softmax":
        return torch.softmax(logits, dim=-1) / temperature
    if bug == "probabilities":
        return torch.softmax(logits / temperature, dim=-1)
    if bug == "in_place":
        logits /= temperature
        return logits
    if bug == "clamped":
        return logits / max(temperature, 0.1)
    return logits / temperature


TEMPERATURE_BUGS = {"multiplied": "multiplied by the temperature", "after_softmax": "temperature applied after softmax",
                    "probabilities": "you return probabilities", "in_place": "in-place operation",
                    "clamped": "the temperature is clamped to at least 0.1"}


def test_temperature_passes(capsys):
    passes(checks.check_temperature, scale_logits, capsys, "scale_logits")
    passes(checks.check_temperature, my_scale_logits, capsys, "scale_logits")
    passes(checks.check_temperature, lambda logits, t: logits / t + 3.0, capsys, "scale_logits")  # a shift is fine


@pytest.mark.parametrize("bug", TEMPERATURE_BUGS)
def test_temperature_bugs(bug):
    fails(checks.check_temperature, functools.partial(my_scale_logits, bug=bug), TEMPERATURE_BUGS[bug])


def my_top_k(logits, k, bug=None):
    if bug != "no_clamp":
        k = min(k, logits.shape[-1])
    if bug in (None, "no_clamp"):  # the lesson's way: exactly k survive, also on ties
        top = logits.topk(k, dim=-1)
        return torch.full_like(logits, -torch.inf).scatter(-1, top.indices, top.values)
    if bug == "batch":
        threshold = logits.flatten().topk(k).values[-1]
    elif bug == "k_plus_one":
        threshold = logits.sort(dim=-1, descending=True).values[..., min(k, logits.shape[-1] - 1), None]
    elif bug == "smallest":
        threshold = logits.topk(k, dim=-1, largest=False).values[..., -1:]
        return logits.masked_fill(logits > threshold, -torch.inf)
    else:
        threshold = logits.topk(k, dim=-1).values[..., -1:]
    if bug == "k_plus_one":
        return logits.masked_fill(logits < threshold, -torch.inf)
    drop = logits <= threshold if bug == "less_equal" else logits < threshold
    return logits.masked_fill(drop, 0.0 if bug == "zero_fill" else -torch.inf)


TOP_K_BUGS = {"less_equal": "keeps k - 1 tokens", "k_plus_one": r"keeps k \+ 1 tokens",
              "zero_fill": "set to 0 instead of -inf", "no_clamp": "k larger than the vocabulary",
              "smallest": "keeps the k smallest", "batch": "over the whole batch",
              "keeps_ties": "keeps more than k tokens when logits tie"}


def test_top_k_passes(capsys):
    passes(checks.check_top_k, top_k_filter, capsys, "top_k_filter")
    passes(checks.check_top_k, my_top_k, capsys, "top_k_filter")


@pytest.mark.parametrize("bug", TOP_K_BUGS)
def test_top_k_bugs(bug):
    fails(checks.check_top_k, functools.partial(my_top_k, bug=bug), TOP_K_BUGS[bug])


def my_top_p(logits, p, bug=None):
    probs = torch.softmax(logits, dim=-1)
    if bug == "unsorted":
        sorted_probs, order = probs, torch.arange(probs.shape[-1]).expand_as(probs)
    else:
        sorted_probs, order = probs.sort(dim=-1, descending=bug != "ascending")
    cumulative = sorted_probs.cumsum(dim=-1)
    keep = cumulative <= p if bug == "exclude_crossing" else cumulative - sorted_probs < p
    if bug != "not_scattered":
        keep = torch.zeros_like(keep).scatter(-1, order, keep)
    return logits.masked_fill(~keep, -torch.inf)


TOP_P_BUGS = {"exclude_crossing": "token that crosses p is excluded", "unsorted": "probabilities are not sorted",
              "ascending": "sorted in ascending order", "not_scattered": "not mapped back to vocabulary order"}


def test_top_p_passes(capsys):
    passes(checks.check_top_p, top_p_filter, capsys, "top_p_filter")
    passes(checks.check_top_p, my_top_p, capsys, "top_p_filter")


@pytest.mark.parametrize("bug", TOP_P_BUGS)
def test_top_p_bugs(bug):
    fails(checks.check_top_p, functools.partial(my_top_p, bug=bug), TOP_P_BUGS[bug])


# ----------------------------------------------------------------------------------------- loss

def my_loss(logits, token_ids, bug=None):
    if bug == "not_shifted":
        predictions, targets = logits, token_ids
    else:
        predictions, targets = logits[:, :-1], token_ids[:, 1:]  # position t predicts token t + 1
    if bug == "softmax_first":
        predictions = predictions.softmax(dim=-1)
    if bug == "log_of_softmax":
        log_probs = predictions.softmax(dim=-1).log()
    else:
        log_probs = predictions.log_softmax(dim=-1)
    losses = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (batch, tokens - 1)
    if bug == "sum":
        return losses.sum()
    if bug == "batch_mean":
        return losses.sum(dim=1).mean()
    if bug == "per_sequence":
        return losses.mean(dim=1)
    if bug == "item":
        return losses.mean().item()
    return losses.mean()


LOSS_BUGS = {"not_shifted": "targets are not shifted", "softmax_first": "softmax applied before F.cross_entropy",
             "log_of_softmax": r"log\(softmax\(...\)\) underflows", "sum": "summed instead of averaged",
             "batch_mean": "mean is taken over the batch only", "per_sequence": "one loss per sequence",
             "item": "Python number"}


def test_loss_passes(capsys):
    passes(checks.check_next_token_loss, reference_next_token_loss, capsys, "F.cross_entropy")
    passes(checks.check_next_token_loss, my_loss, capsys, "F.cross_entropy")


@pytest.mark.parametrize("bug", LOSS_BUGS)
def test_loss_bugs(bug):
    fails(checks.check_next_token_loss, functools.partial(my_loss, bug=bug), LOSS_BUGS[bug])


# ----------------------------------------------------------------------------------------- repetition penalty, beam step

def my_repetition_penalty(logits, token_ids, penalty, bug=None):
    out = logits.clone()
    for row in range(logits.shape[0]):
        history = token_ids[0 if bug == "row_zero" else row].tolist()
        for token in (history if bug == "per_occurrence" else set(history)):
            z = out[row, token]
            if bug == "divide_all":
                out[row, token] = z / penalty
            elif bug == "multiply_all":
                out[row, token] = z * penalty
            elif bug == "swapped":
                out[row, token] = z * penalty if z > 0 else z / penalty
            else:
                out[row, token] = z / penalty if z > 0 else z * penalty
    if bug == "everything":
        return torch.where(logits > 0, logits / penalty, logits * penalty)
    return out


REPETITION_BUGS = {"divide_all": "divided by the penalty: a negative logit", "multiply_all": "multiplied by the penalty",
                   "swapped": "two cases are swapped", "per_occurrence": "once per occurrence",
                   "everything": "every logit is penalised", "row_zero": "history of row 0"}


def test_repetition_penalty_passes(capsys):
    passes(checks.check_repetition_penalty, penalize_repetition, capsys, "penalize_repetition")
    passes(checks.check_repetition_penalty, my_repetition_penalty, capsys, "penalize_repetition")


@pytest.mark.parametrize("bug", REPETITION_BUGS)
def test_repetition_penalty_bugs(bug):
    fails(checks.check_repetition_penalty, functools.partial(my_repetition_penalty, bug=bug), REPETITION_BUGS[bug])


def my_beam_step(beam_scores, log_probs, num_beams, bug=None):
    beams, vocab = log_probs.shape
    candidates = []  # (score, beam, token) for every beam and token
    for beam in range(beams):
        for token in range(vocab):
            added = 0.0 if bug == "no_sum" else beam_scores[beam].item()
            candidates.append((added + log_probs[beam, token].item(), beam, token))
    if bug == "per_beam":
        candidates = [max(c for c in candidates if c[1] == beam) for beam in range(beams)]
    best = sorted(candidates, reverse=True)[:num_beams]
    if bug == "worst_first":
        best = best[::-1]
    if bug == "split_by_beams":
        best = [(s, (b * vocab + t) // num_beams, (b * vocab + t) % num_beams) for s, b, t in best]
    return (torch.tensor([s for s, _, _ in best]), torch.tensor([b for _, b, _ in best]),
            torch.tensor([t for _, _, t in best]))


BEAM_STEP_BUGS = {"no_sum": "scores are not added", "per_beam": "best token of each beam",
                  "split_by_beams": "split with num_beams", "worst_first": "best first"}


def test_beam_step_passes(capsys):
    passes(checks.check_beam_step, my_beam_step, capsys, "beam_search")


@pytest.mark.parametrize("bug", BEAM_STEP_BUGS)
def test_beam_step_bugs(bug):
    fails(checks.check_beam_step, functools.partial(my_beam_step, bug=bug), BEAM_STEP_BUGS[bug])


def my_induction_score(pattern, period, bug=None):
    tokens = pattern.shape[-1]
    offset = period if bug == "same_token" else period - 1
    first_query = period - 1 if bug == "first_copy_too" else period
    queries = torch.arange(first_query, tokens)
    taken = pattern[:, :, queries, queries - offset]  # (batch, heads, queries)
    if bug == "heads_together":
        return taken.mean().expand(pattern.shape[1])
    if bug == "no_batch_mean":
        return taken[0].mean(dim=-1)
    return taken.mean(dim=(0, 2))


INDUCTION_BUGS = {"same_token": "earlier occurrence itself", "first_copy_too": "first copy are counted",
                  "heads_together": "heads are averaged together", "no_batch_mean": "batch is not averaged"}


def test_induction_score_passes(capsys):
    passes(checks.check_induction_score, my_induction_score, capsys, "induction_score")


@pytest.mark.parametrize("bug", INDUCTION_BUGS)
def test_induction_score_bugs(bug):
    fails(checks.check_induction_score, functools.partial(my_induction_score, bug=bug), INDUCTION_BUGS[bug])


def my_logit_lens(model, cache, target_ids, bug=None):
    names = ["embed"] + [f"blocks.{i}.{'resid_pre' if bug == 'resid_pre' else 'resid_post'}"
                         for i in range(len(model.trf_blocks))]
    if bug == "no_embed":
        names = names[1:]
    rows = []
    with torch.no_grad():
        for name in names:
            stream = cache[name] if bug == "no_norm" else model.final_norm(cache[name])
            probs = torch.softmax(model.out_head(stream), dim=-1)
            rows.append(probs.max(-1).values if bug == "top_prob" else
                        probs.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1))
    return torch.stack(rows)


LENS_BUGS = {"no_norm": "final_norm is skipped", "resid_pre": "inputs of the blocks", "no_embed": "embeddings are left out",
             "top_prob": "most likely token"}


def test_logit_lens_passes(capsys):
    passes(checks.check_logit_lens, my_logit_lens, capsys, "logit_lens")


@pytest.mark.parametrize("bug", LENS_BUGS)
def test_logit_lens_bugs(bug):
    fails(checks.check_logit_lens, functools.partial(my_logit_lens, bug=bug), LENS_BUGS[bug])


# Each table above with the number of bugs it plants today: a table that loses entries fails the count below.
PLANTED = {"MERGE_BUGS": (MERGE_BUGS, 6), "SINUSOIDAL_BUGS": (SINUSOIDAL_BUGS, 5),
           "EMBEDDING_BUGS": (EMBEDDING_BUGS, 6), "LAYERNORM_BUGS": (LAYERNORM_BUGS, 10), "GELU_BUGS": (GELU_BUGS, 6),
           "FEEDFORWARD_BUGS": (FEEDFORWARD_BUGS, 5), "ATTENTION_BUGS": (ATTENTION_BUGS, 8),
           "MULTIHEAD_BUGS": (MULTIHEAD_BUGS, 11), "BLOCK_BUGS": (BLOCK_BUGS, 7), "MODEL_BUGS": (MODEL_BUGS, 6),
           "TEMPERATURE_BUGS": (TEMPERATURE_BUGS, 5), "TOP_K_BUGS": (TOP_K_BUGS, 7), "TOP_P_BUGS": (TOP_P_BUGS, 4),
           "LOSS_BUGS": (LOSS_BUGS, 7), "ARGUMENT_BUGS": (ARGUMENT_BUGS, 4),
           "REPETITION_BUGS": (REPETITION_BUGS, 6), "BEAM_STEP_BUGS": (BEAM_STEP_BUGS, 4),
           "INDUCTION_BUGS": (INDUCTION_BUGS, 4), "LENS_BUGS": (LENS_BUGS, 4)}


def test_planted_bug_count():
    shrunk = {name: f"{len(table)} < {floor}" for name, (table, floor) in PLANTED.items() if len(table) < floor}
    assert not shrunk, f"planted-bug tables lost entries: {shrunk}"
    tables = [table for table, _ in PLANTED.values()]
    assert sum(len(t) for t in tables) >= 30
    # bugs that look alike from outside may share a message, but the course names at least 20 different ones
    assert len({message for t in tables for message in t.values()}) >= 20
    # the checks' own tables of known mistakes, one per lesson file that keeps one
    for name, table, floor in (("block.BLOCK_BUGS", block_checks.BLOCK_BUGS, 9),
                               ("model.MODEL_BUGS", model_checks.MODEL_BUGS, 5),
                               ("generation.TOP_P_BUGS", generation_checks.TOP_P_BUGS, 5)):
        assert len(table) >= floor, f"course_lib.checks.{name} lost entries: {len(table)} < {floor}"


def test_the_package_exports_the_check_of_every_lesson_file():
    """Every check (a function wrapped by isolated_rng) of every file of course_lib.checks is in its __all__."""
    found = {}
    for info in pkgutil.iter_modules(checks.__path__):
        module = importlib.import_module(f"{checks.__name__}.{info.name}")
        found.update({name: value for name, value in vars(module).items() if name.startswith("check_")
                      and hasattr(value, "__wrapped__") and value.__module__ == module.__name__})
    assert len(found) == 19, sorted(found)
    assert sorted(checks.__all__) == sorted([*found, "CheckFailed"])
    assert all(getattr(checks, name) is check for name, check in found.items())
    assert checks.CheckFailed is importlib.import_module("course_lib.checks.core").CheckFailed


def test_checks_leave_the_callers_random_state_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    checks.check_layernorm(LayerNorm)
    assert torch.equal(torch.rand(3), expected)

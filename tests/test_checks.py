"""The exercise checks catch each planted bug with a message that names it, and pass correct code.

Every learner-style implementation below is written independently of course_lib and takes a `bug` argument: None
is correct; any other value plants one named mistake. A my_* function takes it as `bug=`; a make_* factory builds
the learner's class with it. PLANTED lists every planted bug with what its check's message must name, CORRECT
every correct implementation each check must accept; one test runs each table."""

import collections
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
from course_lib.checks import (CheckFailed, check_beam_search, check_beam_step, check_bpe_encode,
                               check_causal_attention, check_count_pairs, check_greedy_decoding, check_min_p,
                               check_no_repeat_ngram, check_perplexity,
                               check_feedforward, check_gelu, check_gpt_embedding, check_gpt_model,
                               check_induction_score, check_layernorm, check_logit_lens, check_merge_pair,
                               check_multihead_attention, check_next_token_loss, check_repetition_penalty,
                               check_sinusoidal_table, check_temperature, check_top_k, check_top_p,
                               check_transformer_block)
from course_lib.checks import block as block_checks
from course_lib.checks import generation as generation_checks
from course_lib.checks import model as model_checks
from course_lib.checks.training import reference_next_token_loss
from course_lib.decoding import ban_repeated_ngrams, beam_search, min_p_filter, penalize_repetition
from course_lib.embeddings import GPTEmbedding
from course_lib.feedforward import GELU, FeedForward
from course_lib.generation import generate_text_simple, scale_logits, top_k_filter, top_p_filter
from course_lib.model import GPTModel
from course_lib.normalization import LayerNorm
from course_lib.tokenization import BPETokenizer, count_pairs, merge_pair, split_words

# check_lora_linear's planted bugs and correct code live beside the LoRA tests that run them; counted here too
from test_finetuning_lora import LORA_CORRECT, LORA_PLANTED
# so do those of notebook 16's checks (RMSNorm, rotary and grouped-query attention)
from test_checks_modern import MODERN_CORRECT, MODERN_PLANTED
# and those of notebook 15's checks (the DPO loss, group advantages, the GRPO loss)
from test_checks_alignment import ALIGNMENT_CORRECT, ALIGNMENT_PLANTED
# and those of notebook 17's checks (the window mask, the ring cache, YaRN's ramp)
from test_checks_long_context import LONG_CONTEXT_CORRECT, LONG_CONTEXT_PLANTED


# ----------------------------------------------------------------------------------------- merge_pair, count_pairs

def my_merge_pair(symbols, pair, bug=None):
    if bug == "marks_every_match":
        return merge_pair_marking(symbols, pair)
    if bug == "starts_from_first":
        return merge_pair_from_first(symbols, pair)
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


def my_count_pairs(words, bug=None):
    counts = {}
    for symbols, freq in words.items():
        pairs = list(zip(symbols, symbols[1:]))
        for pair in set(pairs) if bug == "set" else pairs:
            counts[pair] = counts.get(pair, 0) + (1 if bug == "no_freq" else freq)
    return counts


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


def make_embedding(bug=None):
    class MyGPTEmbedding(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.emb_dim)
            rows = cfg.vocab_size if bug == "pos_rows" else cfg.context_length
            self.pos_emb = nn.Embedding(rows, cfg.emb_dim)
            self.drop = nn.Dropout({"no_dropout": 0.0, "dropout_fixed": 0.1}.get(bug, cfg.drop_rate))

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
        {"no_dropout": 0.0, "dropout_fixed": 0.1}.get(bug, drop_rate))


class UnscaledDropout(nn.Dropout):
    def forward(self, w):  # zeroes like nn.Dropout but forgets to divide the survivors by 1 - p
        return w * (torch.rand_like(w) >= self.p) if self.training else w


def projections(module, x, bug):
    if bug == "bias_unused":
        return tuple(F.linear(x, layer.weight) for layer in (module.W_query, module.W_key, module.W_value))
    return module.W_query(x), module.W_key(x), module.W_value(x)


def make_causal_attention(bug=None):
    class MyCausalAttention(nn.Module):
        def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
            super().__init__()
            attention_parts(self, d_in, d_out, qkv_bias, dropout, bug)
            self.d_in = d_in

        def forward(self, x):
            scale_dim = self.d_in if bug == "scale_d_in" else None
            if bug == "dropout_on_output":
                return self.dropout(my_attention(*projections(self, x, bug), None, scale_dim))
            return my_attention(*projections(self, x, bug), bug, scale_dim, self.dropout)

    return MyCausalAttention


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
            context = my_attention(q, k, v, bug if bug == "after_softmax" else None, scale_dim,
                                   None if bug == "dropout_after_out_proj" else self.dropout)
            if bug in ("merge_no_transpose", "view_no_transpose"):
                merged = context.reshape(batch, tokens, self.emb_dim)
            else:
                merged = context.transpose(1, 2).reshape(batch, tokens, self.emb_dim)
            if bug == "dropout_after_out_proj":
                return self.dropout(self.out_proj(merged))
            return merged if bug in ("out_proj_unused", "no_out_proj") else self.out_proj(merged)

    return MyMultiHeadAttention


# ----------------------------------------------------------------------------------------- block, model

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
            if bug == "no_ff_dropout":
                return x + self.ff(norm2(x))
            return x + drop(self.ff(norm2(x)))

    return MyBlock


def make_model(bug=None):
    class MyGPTModel(nn.Module):  # the classic flat layout: tok_emb and pos_emb at the top level
        def __init__(self, cfg):
            super().__init__()
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.emb_dim)
            self.pos_emb = nn.Embedding(cfg.context_length, cfg.emb_dim)
            self.trf_blocks = nn.Sequential(*[TransformerBlock(cfg) for _ in range(cfg.n_layers)])
            if bug != "no_final_norm_attribute":
                self.final_norm = LayerNorm(cfg.emb_dim)
            self.drop_emb = nn.Dropout(0.0 if bug == "no_emb_dropout" else cfg.drop_rate)
            self.out_head = nn.Linear(cfg.emb_dim, cfg.vocab_size, bias=bug == "head_bias")
            if (cfg.tie_weights and bug != "untied") or bug == "always_tied":
                self.out_head.weight = self.tok_emb.weight

        def forward(self, token_ids):
            x = self.tok_emb(token_ids)
            if bug != "no_pos":
                x = x + self.pos_emb(torch.arange(token_ids.shape[1]))
            x = self.drop_emb(x)
            if bug == "not_chained":
                x = [block(x) for block in self.trf_blocks][-1]
            else:
                x = self.trf_blocks(x)
            if bug not in ("no_final_norm", "no_final_norm_attribute"):
                x = self.final_norm(x)
            logits = self.out_head(x)
            return logits.softmax(dim=-1) if bug == "softmax" else logits

    return MyGPTModel


# ----------------------------------------------------------------------------------------- sampling, loss

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


def shifted_scale_logits(logits, temperature):
    return logits / temperature + 3.0  # a shift changes no probability: fine


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


# ----------------------------------------------------------------------------------------- decoding, interpretability

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


# ----------------------------------------------------------------------------------------- greedy, n-gram ban, min-p, beam search, perplexity, BPE encoding

def my_generate_greedy(model, token_ids, max_new_tokens, context_length, bug=None):
    if bug != "train_mode":
        model.eval()
    with torch.no_grad():
        for _ in range(max_new_tokens - (bug == "one_short")):
            window = token_ids if bug == "no_crop" else token_ids[:, -context_length:]
            logits = model(window)[:, 0 if bug == "first_position" else -1, :]
            if bug == "sample":
                next_id = torch.multinomial(torch.softmax(logits, dim=-1), 1)
            else:
                next_id = logits.argmax(dim=-1, keepdim=True)
            token_ids = torch.cat([token_ids, next_id], dim=1)
    return token_ids[:, -max_new_tokens:] if bug == "new_only" else token_ids


def my_ban_repeated_ngrams(logits, token_ids, n, bug=None):
    out = logits.clone()
    for row, ids in enumerate(token_ids.tolist()):
        prefix = ids[-(n - 1):] if bug == "python_slice" else ids[len(ids) - n + 1:]
        stop = len(ids) - n if bug == "skip_last" else len(ids) - n + 1
        for i in range(max(stop, 0)):
            if bug == "any_prefix" or ids[i:i + n - 1] == prefix:
                out[row, ids[i + n - 1]] = 0.0 if bug == "zero_fill" else -torch.inf
    return out


def my_min_p(logits, min_p, bug=None):
    probs = torch.softmax(logits, dim=-1)
    if bug == "absolute":
        threshold = min_p
    elif bug == "batch_max":
        threshold = min_p * probs.max()
    elif bug == "logits":
        return logits.masked_fill(logits < min_p * logits.amax(dim=-1, keepdim=True), -torch.inf)
    else:
        threshold = min_p * probs.amax(dim=-1, keepdim=True)
    drop = probs <= threshold if bug == "less_equal" else probs < threshold
    return logits.masked_fill(drop, -torch.inf)


def my_beam_search(model, token_ids, num_beams, max_new_tokens, bug=None):
    model.eval()
    beams = [(0.0, token_ids[0].tolist())]
    with torch.no_grad():
        for _ in range(max_new_tokens):
            candidates = []
            for score, ids in beams:
                logits = model(torch.tensor([ids]))[0, -1]
                steps = logits if bug == "logits" else torch.log_softmax(logits, dim=-1)
                for token, step in enumerate(steps.tolist()):
                    candidates.append(((0.0 if bug == "no_sum" else score) + step, ids + [token]))
            beams = sorted(candidates, key=lambda c: -c[0])[:1 if bug == "greedy" else num_beams]
    return torch.tensor([beams[-1 if bug == "worst" else 0][1]])


def my_perplexity(logits, token_ids, bug=None):
    log_probs = logits[:, :-1].log_softmax(dim=-1)
    losses = -log_probs.gather(-1, token_ids[:, 1:, None]).squeeze(-1)  # (batch, tokens - 1)
    if bug == "no_exp":
        return losses.mean()
    if bug == "base_2":
        return 2 ** losses.mean()
    if bug == "mean_of_exp":
        return losses.exp().mean()
    if bug == "per_sequence":
        return losses.mean(dim=1).exp()
    if bug == "sum":
        return losses.sum().exp()
    return math.exp(losses.mean().item())  # a Python float is fine for a perplexity


def my_bpe_encode(text, merges, bug=None):
    rank = {pair: k for k, pair in enumerate(merges)}
    token_id = {bytes([i]): i for i in range(256)}
    token_id.update({a + b: (255 if bug == "off_by_one" else 256) + k for k, (a, b) in enumerate(merges)})
    ids = []
    for chunk in ([text] if bug == "no_split" else split_words(text)):
        symbols = [bytes([ord(ch)]) if bug == "characters" and ord(ch) < 256 else ch.encode() for ch in chunk] \
            if bug == "characters" else [bytes([b]) for b in chunk.encode("utf-8")]
        if bug in (None, "no_split", "characters", "off_by_one"):  # every merge in order, over the whole chunk
            for pair in merges:
                symbols = list(merge_pair(tuple(symbols), pair))
        else:
            while True:
                pairs = [p for p in zip(symbols, symbols[1:]) if p in rank]
                if not pairs:
                    break
                pair = pairs[0] if bug == "leftmost" else max(pairs, key=rank.get)
                symbols = list(merge_pair(tuple(symbols), pair))
        ids += [token_id[s] for s in symbols]
    return ids


def bpe_encode(text, merges):
    """course_lib's own encoder, called the way the check calls a learner's."""
    return BPETokenizer(merges).encode(text)


def perplexity(logits, token_ids):
    """course_lib's loss, exponentiated."""
    return torch.exp(reference_next_token_loss(logits, token_ids))


# ----------------------------------------------------------------------------------------- the tables

PLANTED = [  # (check, learner code, planted bug, what the check's message must match)
    (check_merge_pair, my_merge_pair, "drops_tail", "last symbol is lost"),
    (check_merge_pair, my_merge_pair, "first_only", "only the first occurrence"),
    (check_merge_pair, my_merge_pair, "keeps_second", "second symbol of the pair is kept"),
    (check_merge_pair, my_merge_pair, "right_to_left", "scan runs right to left"),
    (check_merge_pair, my_merge_pair, "list", "return a tuple"),
    (check_merge_pair, my_merge_pair, "reversed_join", "joined symbol is reversed"),
    (check_merge_pair, my_merge_pair, "marks_every_match", "overlapping pairs are merged twice"),
    (check_merge_pair, my_merge_pair, "starts_from_first", "one-symbol and empty words must work"),
    (check_count_pairs, my_count_pairs, "no_freq", "each word counted once"),
    (check_count_pairs, my_count_pairs, "set", "repeats inside a word"),
    (check_sinusoidal_table, my_sinusoidal_table, "swapped", "sine and cosine are swapped"),
    (check_sinusoidal_table, my_sinusoidal_table, "column_speed", "every column has its own speed"),
    (check_sinusoidal_table, my_sinusoidal_table, "no_minus", "lost its minus sign"),
    (check_sinusoidal_table, my_sinusoidal_table, "odd_crash", "odd emb_dim"),
    (check_sinusoidal_table, my_sinusoidal_table, "blocks", "sit in two blocks"),
    (check_gpt_embedding, make_embedding, "no_pos", "position embedding is never added"),
    (check_gpt_embedding, make_embedding, "by_token_id", "looked up with the token ids"),
    (check_gpt_embedding, make_embedding, "from_one", "positions start at 1"),
    (check_gpt_embedding, make_embedding, "no_dropout", "no dropout after the sum"),
    (check_gpt_embedding, make_embedding, "dropout_fixed", "dropout rate is fixed"),
    (check_gpt_embedding, make_embedding, "ignores_start", "start_pos is ignored"),
    (check_gpt_embedding, make_embedding, "pos_rows", "one row per position"),
    (check_layernorm, make_layernorm, "eps_outside", "eps is added outside the square root"),
    (check_layernorm, make_layernorm, "unbiased", "unbiased variance"),
    (check_layernorm, make_layernorm, "wrong_axis", "normalising over the wrong dimension"),
    (check_layernorm, make_layernorm, "no_params", "no learnable scale and shift"),
    (check_layernorm, make_layernorm, "unused_params", "scale and shift are not applied"),
    (check_layernorm, make_layernorm, "no_eps", "eps is missing"),
    (check_layernorm, make_layernorm, "no_mean", "the mean is not subtracted"),
    (check_layernorm, make_layernorm, "weight_bias", "name them as in the lesson"),
    (check_layernorm, make_layernorm, "in_place", "in-place operation on the input"),
    (check_layernorm, make_layernorm, "eps_ignored", "your eps argument is ignored"),
    (check_gelu, my_gelu, "exact", "exact GELU"),
    (check_gelu, my_gelu, "relu", "this is ReLU"),
    (check_gelu, my_gelu, "no_half", "factor 0.5 in front is missing"),
    (check_gelu, my_gelu, "constant", r"sqrt\(2 / pi\) written as 2 / pi"),
    (check_gelu, my_gelu, "no_cubic", "cubic term is missing"),
    (check_gelu, my_gelu, "in_place", "in-place operation"),
    (check_feedforward, make_feedforward, "no_expansion", "no 4x expansion"),
    (check_feedforward, make_feedforward, "no_activation", "activation is missing"),
    (check_feedforward, make_feedforward, "relu", "ReLU instead of GELU"),
    (check_feedforward, make_feedforward, "exact", "exact GELU"),
    (check_feedforward, make_feedforward, "activation_after", "after the second Linear"),
    (check_causal_attention, my_attention, "after_softmax", "mask is applied after the softmax"),
    (check_causal_attention, my_attention, "no_scale", r"1/sqrt\(d_k\) scaling is missing"),
    (check_causal_attention, my_attention, "diagonal", "also hides the diagonal"),
    (check_causal_attention, my_attention, "one_ahead", "each token also sees the next one"),
    (check_causal_attention, my_attention, "no_mask", "no causal mask"),
    (check_causal_attention, my_attention, "softmax_dim", "softmax runs over the wrong dimension"),
    (check_causal_attention, my_attention, "fill_zero", "set to 0 instead of -inf"),
    (check_causal_attention, my_attention, "past", "hides the past instead of the future"),
    (check_causal_attention, make_causal_attention, "after_softmax", "mask is applied after the softmax"),
    (check_causal_attention, make_causal_attention, "scale_d_in", r"divided by sqrt\(emb_dim\)"),
    (check_causal_attention, make_causal_attention, "no_qkv_bias", "qkv_bias is ignored"),
    (check_causal_attention, make_causal_attention, "bias_unused", "the biases must be added"),
    (check_causal_attention, make_causal_attention, "no_dropout", "drop_rate is ignored"),
    (check_causal_attention, make_causal_attention, "dropout_not_rescaled", r"divided by \(1 - drop_rate\)"),
    (check_causal_attention, make_causal_attention, "dropout_fixed", "dropout rate is fixed"),
    (check_causal_attention, make_causal_attention, "dropout_on_output", "instead of on the attention weights"),
    (check_multihead_attention, make_multihead, "view_no_transpose",
     r"split along the wrong axis: t.view\(batch, n_heads, tokens, head_dim\) without a transpose"),
    (check_multihead_attention, make_multihead, "interleaved",
     r"split along the wrong axis: view\(batch, tokens, head_dim, n_heads\)"),
    (check_multihead_attention, make_multihead, "merge_no_transpose", "merged without transposing back"),
    (check_multihead_attention, make_multihead, "out_proj_unused", "out_proj is missing"),
    (check_multihead_attention, make_multihead, "no_out_proj", "out_proj is missing"),
    (check_multihead_attention, make_multihead, "scale_emb_dim", r"divided by sqrt\(emb_dim\)"),
    (check_multihead_attention, make_multihead, "after_softmax", "mask is applied after the softmax"),
    (check_multihead_attention, make_multihead, "no_qkv_bias", "qkv_bias is ignored"),
    (check_multihead_attention, make_multihead, "bias_unused", "the biases must be added"),
    (check_multihead_attention, make_multihead, "no_dropout", "drop_rate is ignored"),
    (check_multihead_attention, make_multihead, "dropout_not_rescaled", r"divided by \(1 - drop_rate\)"),
    (check_multihead_attention, make_multihead, "dropout_fixed", "dropout rate is fixed"),
    (check_multihead_attention, make_multihead, "dropout_after_out_proj", "instead of on the attention weights"),
    (check_transformer_block, make_block, "dropout_after_shortcut", "shortcut added before dropout"),
    (check_transformer_block, make_block, "post_ln", "post-LN instead of pre-LN"),
    (check_transformer_block, make_block, "no_norm2", "one shared LayerNorm"),
    (check_transformer_block, make_block, "norm1_twice", "one shared LayerNorm"),
    (check_transformer_block, make_block, "no_second_shortcut", "second shortcut is missing"),
    (check_transformer_block, make_block, "no_dropout", "no dropout on the sub-layer outputs"),
    (check_transformer_block, make_block, "no_ff_dropout", "no dropout on the feed-forward shortcut"),
    (check_transformer_block, make_block, "torch_layernorm", "nn.LayerNorm names its parameters weight and bias"),
    (check_gpt_model, make_model, "no_pos", "no positional embedding"),
    (check_gpt_model, make_model, "no_final_norm", "final LayerNorm is missing"),
    (check_gpt_model, make_model, "no_final_norm_attribute", "final LayerNorm is missing"),
    (check_gpt_model, make_model, "not_chained", "every block reads the embeddings"),
    (check_gpt_model, make_model, "softmax", "returns probabilities"),
    (check_gpt_model, make_model, "head_bias", "GPT-2's output layer has none"),
    (check_gpt_model, make_model, "untied", "untied head when the config says tied"),
    (check_gpt_model, make_model, "always_tied", "tied head when the config says untied"),
    (check_gpt_model, make_model, "no_emb_dropout", "no dropout on the embeddings"),
    (check_temperature, my_scale_logits, "multiplied", "multiplied by the temperature"),
    (check_temperature, my_scale_logits, "after_softmax", "temperature applied after softmax"),
    (check_temperature, my_scale_logits, "probabilities", "you return probabilities"),
    (check_temperature, my_scale_logits, "in_place", "in-place operation"),
    (check_temperature, my_scale_logits, "clamped", "the temperature is clamped to at least 0.1"),
    (check_top_k, my_top_k, "less_equal", "keeps k - 1 tokens"),
    (check_top_k, my_top_k, "k_plus_one", r"keeps k \+ 1 tokens"),
    (check_top_k, my_top_k, "zero_fill", "set to 0 instead of -inf"),
    (check_top_k, my_top_k, "no_clamp", "k larger than the vocabulary"),
    (check_top_k, my_top_k, "smallest", "keeps the k smallest"),
    (check_top_k, my_top_k, "batch", "over the whole batch"),
    (check_top_k, my_top_k, "keeps_ties", "keeps more than k tokens when logits tie"),
    (check_top_p, my_top_p, "exclude_crossing", "token that crosses p is excluded"),
    (check_top_p, my_top_p, "unsorted", "probabilities are not sorted"),
    (check_top_p, my_top_p, "ascending", "sorted in ascending order"),
    (check_top_p, my_top_p, "not_scattered", "not mapped back to vocabulary order"),
    (check_next_token_loss, my_loss, "not_shifted", "targets are not shifted"),
    (check_next_token_loss, my_loss, "softmax_first", "softmax applied before F.cross_entropy"),
    (check_next_token_loss, my_loss, "log_of_softmax", r"log\(softmax\(...\)\) underflows"),
    (check_next_token_loss, my_loss, "sum", "summed instead of averaged"),
    (check_next_token_loss, my_loss, "batch_mean", "mean is taken over the batch only"),
    (check_next_token_loss, my_loss, "per_sequence", "one loss per sequence"),
    (check_next_token_loss, my_loss, "item", "Python number"),
    (check_repetition_penalty, my_repetition_penalty, "divide_all", "divided by the penalty: a negative logit"),
    (check_repetition_penalty, my_repetition_penalty, "multiply_all", "multiplied by the penalty"),
    (check_repetition_penalty, my_repetition_penalty, "swapped", "two cases are swapped"),
    (check_repetition_penalty, my_repetition_penalty, "per_occurrence", "once per occurrence"),
    (check_repetition_penalty, my_repetition_penalty, "everything", "every logit is penalised"),
    (check_repetition_penalty, my_repetition_penalty, "row_zero", "history of row 0"),
    (check_beam_step, my_beam_step, "no_sum", "scores are not added"),
    (check_beam_step, my_beam_step, "per_beam", "best token of each beam"),
    (check_beam_step, my_beam_step, "split_by_beams", "split with num_beams"),
    (check_beam_step, my_beam_step, "worst_first", "best first"),
    (check_induction_score, my_induction_score, "same_token", "earlier occurrence itself"),
    (check_induction_score, my_induction_score, "first_copy_too", "first copy are counted"),
    (check_induction_score, my_induction_score, "heads_together", "heads are averaged together"),
    (check_induction_score, my_induction_score, "no_batch_mean", "batch is not averaged"),
    (check_logit_lens, my_logit_lens, "no_norm", "final_norm is skipped"),
    (check_logit_lens, my_logit_lens, "resid_pre", "inputs of the blocks"),
    (check_logit_lens, my_logit_lens, "no_embed", "embeddings are left out"),
    (check_logit_lens, my_logit_lens, "top_prob", "most likely token"),
    (check_greedy_decoding, my_generate_greedy, "train_mode", "left in training mode"),
    (check_greedy_decoding, my_generate_greedy, "sample", "sampled"),
    (check_greedy_decoding, my_generate_greedy, "first_position", "first position's logits"),
    (check_greedy_decoding, my_generate_greedy, "no_crop", "crop it to its last context_length tokens"),
    (check_greedy_decoding, my_generate_greedy, "new_only", "new ones only"),
    (check_greedy_decoding, my_generate_greedy, "one_short", "off by one in the number of steps"),
    (check_no_repeat_ngram, my_ban_repeated_ngrams, "any_prefix", "whatever precedes it"),
    (check_no_repeat_ngram, my_ban_repeated_ngrams, "python_slice", "with n = 1 nothing is banned"),
    (check_no_repeat_ngram, my_ban_repeated_ngrams, "skip_last", "last n-gram is never looked at"),
    (check_no_repeat_ngram, my_ban_repeated_ngrams, "zero_fill", "set to 0 instead of -inf"),
    (check_min_p, my_min_p, "absolute", "threshold is min_p itself"),
    (check_min_p, my_min_p, "batch_max", "top probability of the whole batch"),
    (check_min_p, my_min_p, "logits", "compared with min_p times the top logit"),
    (check_min_p, my_min_p, "less_equal", "<= drops the tokens exactly at the threshold"),
    (check_beam_search, my_beam_search, "greedy", "only one beam runs"),
    (check_beam_search, my_beam_search, "no_sum", "last token's log-probability alone"),
    (check_beam_search, my_beam_search, "logits", "raw logits are summed"),
    (check_beam_search, my_beam_search, "worst", "worst of the final beams"),
    (check_perplexity, my_perplexity, "no_exp", "exp is missing"),
    (check_perplexity, my_perplexity, "base_2", r"2 \*\* loss"),
    (check_perplexity, my_perplexity, "mean_of_exp", r"mean of exp"),
    (check_perplexity, my_perplexity, "per_sequence", "one perplexity per sequence"),
    (check_perplexity, my_perplexity, "sum", "exp of the summed loss"),
    (check_bpe_encode, my_bpe_encode, "leftmost", "first mergeable pair of the text is merged first"),
    (check_bpe_encode, my_bpe_encode, "latest_first", "latest-learned first"),
    (check_bpe_encode, my_bpe_encode, "no_split", "merges cross chunk boundaries"),
    (check_bpe_encode, my_bpe_encode, "characters", "characters are encoded instead of UTF-8 bytes"),
    (check_bpe_encode, my_bpe_encode, "off_by_one", "ids are off by one"),
]

CORRECT = [  # (check, correct code: course_lib's own or a learner's with no bug, what the one line must praise)
    (check_merge_pair, merge_pair, "merge_pair"),
    (check_merge_pair, my_merge_pair, "overlapping pairs included"),
    (check_count_pairs, count_pairs, "count_pairs"),
    (check_count_pairs, my_count_pairs, "count_pairs"),
    (check_sinusoidal_table, my_sinusoidal_table, "odd emb_dim included"),
    (check_gpt_embedding, GPTEmbedding, "then dropout"),
    (check_gpt_embedding, make_embedding, "then dropout"),
    (check_layernorm, LayerNorm, "nn.LayerNorm"),
    (check_layernorm, make_layernorm, "nn.LayerNorm"),
    (check_gelu, GELU, "tanh form"),
    (check_gelu, my_gelu, "tanh form"),
    (check_feedforward, FeedForward, "4 * emb_dim"),
    (check_feedforward, make_feedforward, "4 * emb_dim"),
    (check_causal_attention, CausalAttention, "weighted sum"),
    (check_causal_attention, my_attention, "weighted sum"),
    (check_causal_attention, make_causal_attention, "weighted sum"),
    (check_multihead_attention, MultiHeadAttention, "split, attend, merge, project"),
    (check_multihead_attention, make_multihead, "split, attend, merge, project"),
    (check_transformer_block, TransformerBlock, "pre-LN"),
    (check_transformer_block, make_block, "pre-LN"),
    (check_gpt_model, GPTModel, "final norm"),
    (check_gpt_model, make_model, "final norm"),
    (check_temperature, scale_logits, "scale_logits"),
    (check_temperature, my_scale_logits, "scale_logits"),
    (check_temperature, shifted_scale_logits, "scale_logits"),
    (check_top_k, top_k_filter, "top_k_filter"),
    (check_top_k, my_top_k, "top_k_filter"),
    (check_top_p, top_p_filter, "top_p_filter"),
    (check_top_p, my_top_p, "top_p_filter"),
    (check_next_token_loss, reference_next_token_loss, "F.cross_entropy"),
    (check_next_token_loss, my_loss, "F.cross_entropy"),
    (check_repetition_penalty, penalize_repetition, "penalize_repetition"),
    (check_repetition_penalty, my_repetition_penalty, "penalize_repetition"),
    (check_beam_step, my_beam_step, "beam_search"),
    (check_induction_score, my_induction_score, "induction_score"),
    (check_logit_lens, my_logit_lens, "logit_lens"),
    (check_greedy_decoding, generate_text_simple, "generate_text_simple"),
    (check_greedy_decoding, my_generate_greedy, "generate_text_simple"),
    (check_no_repeat_ngram, ban_repeated_ngrams, "ban_repeated_ngrams"),
    (check_no_repeat_ngram, my_ban_repeated_ngrams, "ban_repeated_ngrams"),
    (check_min_p, min_p_filter, "min_p_filter"),
    (check_min_p, my_min_p, "min_p_filter"),
    (check_beam_search, beam_search, "beam_search"),
    (check_beam_search, my_beam_search, "beam_search"),
    (check_perplexity, perplexity, "exp(F.cross_entropy)"),
    (check_perplexity, my_perplexity, "exp(F.cross_entropy)"),
    (check_bpe_encode, bpe_encode, "merges in the order they were learned"),
    (check_bpe_encode, my_bpe_encode, "merges in the order they were learned"),
]

# The fewest planted bugs each check keeps today: a check that loses rows of PLANTED fails test_planted_bug_count.
FLOORS = {"check_merge_pair": 8, "check_count_pairs": 2, "check_sinusoidal_table": 5, "check_gpt_embedding": 7,
          "check_layernorm": 10, "check_gelu": 6, "check_feedforward": 5, "check_causal_attention": 16,
          "check_multihead_attention": 13, "check_transformer_block": 8, "check_gpt_model": 9, "check_temperature": 5,
          "check_top_k": 7, "check_top_p": 4, "check_next_token_loss": 7, "check_repetition_penalty": 6,
          "check_beam_step": 4, "check_induction_score": 4, "check_logit_lens": 4, "check_greedy_decoding": 6,
          "check_no_repeat_ngram": 4, "check_min_p": 4, "check_beam_search": 4, "check_perplexity": 5,
          "check_bpe_encode": 5, "check_lora_linear": 17, "check_rms_norm": 22, "check_rotary_attention": 14,
          "check_grouped_query_attention": 7, "check_dpo_loss": 14, "check_group_advantages": 12,
          "check_grpo_loss": 16, "check_window_mask": 9, "check_ring_cache": 9, "check_yarn_ramp": 8}


def learner_code(code, bug=None):
    """The code a check is given: a make_* factory builds its class with the bug planted, a my_* function gets it
    as bug=; with no bug, a my_* function and course_lib's own code go as they are."""
    if getattr(code, "__name__", "").startswith("make_"):
        return code(bug)
    return code if bug is None else functools.partial(code, bug=bug)


def planted_id(row):
    """check-bug, with the learner's name between them when the check has that bug planted in two learners."""
    check, code, bug, _ = row
    twins = sum(other[0] is check and other[2] == bug for other in PLANTED)
    return f"{check.__name__}-{code.__name__ + '-' if twins > 1 else ''}{bug}"


def assert_caught(check, code, match: str) -> None:
    """The check rejects code with CheckFailed (an AssertionError), names itself, and names the likely bug."""
    with pytest.raises(CheckFailed, match=match) as info:
        check(code)
    assert isinstance(info.value, AssertionError)
    assert str(info.value).startswith(f"{check.__name__}: ")
    assert "\nLikely bug: " in str(info.value)


@pytest.mark.parametrize(("check", "code", "bug", "match"), PLANTED, ids=[planted_id(row) for row in PLANTED])
def test_each_planted_bug_is_caught_and_named(check, code, bug, match):
    assert_caught(check, learner_code(code, bug), match)


@pytest.mark.parametrize(("check", "code", "praise"), CORRECT,
                         ids=[getattr(row, "id", None) or f"{row[0].__name__}-{row[1].__name__}" for row in CORRECT])
def test_each_check_passes_correct_code(check, code, praise, capsys):
    """The check accepts correct code and prints exactly one friendly line."""
    check(learner_code(code))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{check.__name__}: all ") and "checks passed" in lines[0] and praise in lines[0]


def test_a_crashing_constructor_is_reported_with_the_lesson_signature():
    class NeedsEps(nn.Module):
        def __init__(self, emb_dim, eps):
            super().__init__()

    assert_caught(check_layernorm, NeedsEps, r"NeedsEps\(6\) raised TypeError.*\nLikely bug: the constructor must "
                                             r"accept the lesson's arguments: MyLayerNorm\(emb_dim, eps=1e-5\)")


def test_checks_reject_what_is_not_the_learner_class_or_function():
    with pytest.raises(TypeError, match=r"expects your class, not an instance of it: call "
                                        r"check_layernorm\(LayerNorm\)"):
        check_layernorm(LayerNorm(4))
    with pytest.raises(TypeError, match="is not one: declare it as class Plain"):
        check_layernorm(type("Plain", (), {}))
    with pytest.raises(TypeError, match="expects your nn.Module class"):
        check_layernorm("LayerNorm")
    with pytest.raises(TypeError, match="expects a function such as my_merge_pair.*got the class"):
        check_merge_pair(LayerNorm)
    with pytest.raises(TypeError, match="expects a function such as my_top_k"):
        check_top_k(3)
    with pytest.raises(TypeError, match="got an instance of CausalAttention: pass the function"):
        check_causal_attention(CausalAttention(4, 4, 4, 0.0))
    with pytest.raises(TypeError, match=r"not an instance: call check_gelu\(GELU\)"):
        check_gelu(GELU())


def exported_checks():
    """Every check (a function wrapped by isolated_rng) of every file of course_lib.checks, by name."""
    found = {}
    for info in pkgutil.iter_modules(checks.__path__):
        module = importlib.import_module(f"{checks.__name__}.{info.name}")
        found.update({name: value for name, value in vars(module).items() if name.startswith("check_")
                      and hasattr(value, "__wrapped__") and value.__module__ == module.__name__})
    return found


def test_the_package_exports_the_check_of_every_lesson_file():
    found = exported_checks()
    assert len(found) == 35, sorted(found)
    assert sorted(checks.__all__) == sorted([*found, "CheckFailed", "answer_size"])  # answer_size: worked answers
    assert all(getattr(checks, name) is check for name, check in found.items())
    assert checks.CheckFailed is importlib.import_module("course_lib.checks.core").CheckFailed


def test_planted_bug_count():
    """Every check has planted bugs and correct code in the tables, and no check loses planted bugs."""
    planted = collections.Counter(check.__name__ for check, *_ in PLANTED + LORA_PLANTED + MODERN_PLANTED
                                  + ALIGNMENT_PLANTED + LONG_CONTEXT_PLANTED)
    assert set(planted) == set(FLOORS) == set(exported_checks()), "a check with no planted bug"
    correct = {getattr(row, "values", row)[0].__name__ for row in CORRECT + LORA_CORRECT + MODERN_CORRECT
               + ALIGNMENT_CORRECT + LONG_CONTEXT_CORRECT}
    assert correct == set(FLOORS), "a check with no correct code"
    shrunk = {name: f"{planted[name]} < {floor}" for name, floor in FLOORS.items() if planted[name] < floor}
    assert not shrunk, f"checks lost planted bugs: {shrunk}"
    assert len({(check, code, bug) for check, code, bug, _ in PLANTED}) == len(PLANTED) >= 158
    # bugs that look alike from outside may share a message, but the course names at least 20 different ones
    assert len({match for *_, match in PLANTED}) >= 20
    # the checks' own tables of known mistakes, one per lesson file that keeps one
    for name, table, floor in (("block.BLOCK_BUGS", block_checks.BLOCK_BUGS, 9),
                               ("model.MODEL_BUGS", model_checks.MODEL_BUGS, 5),
                               ("generation.TOP_P_BUGS", generation_checks.TOP_P_BUGS, 5)):
        assert len(table) >= floor, f"course_lib.checks.{name} lost entries: {len(table)} < {floor}"


def test_checks_leave_the_callers_random_state_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    check_layernorm(LayerNorm)
    assert torch.equal(torch.rand(3), expected)

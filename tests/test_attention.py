import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.attention import (CausalAttention, KVCache, MultiHeadAttention, MultiHeadAttentionEinsum,
                                  MultiHeadAttentionWrapper, copy_fused_weights_to_wrapper)

D_IN, D_OUT, CONTEXT, HEADS = 12, 16, 10, 4
VARIANTS = (MultiHeadAttention, MultiHeadAttentionWrapper, MultiHeadAttentionEinsum)


def same_weights(qkv_bias=False, dropout=0.0, d_in=D_IN, seed=0):
    """The three multi-head variants in eval mode, all holding the fused module's weights."""
    torch.manual_seed(seed)
    fused = MultiHeadAttention(d_in, D_OUT, CONTEXT, dropout, HEADS, qkv_bias)
    wrapper = MultiHeadAttentionWrapper(d_in, D_OUT, CONTEXT, dropout, HEADS, qkv_bias)
    named = MultiHeadAttentionEinsum(d_in, D_OUT, CONTEXT, dropout, HEADS, qkv_bias)
    copy_fused_weights_to_wrapper(fused, wrapper)
    named.load_state_dict(fused.state_dict())
    return fused.eval(), wrapper.eval(), named.eval()


def close(a, b):
    return torch.allclose(a, b, atol=1e-5, rtol=0)


# --- every variant computes the same function -------------------------------------------------------------

@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("batch, tokens", [(1, 1), (3, 1), (1, 4), (2, 7), (2, CONTEXT)])
def test_all_variants_agree_on_shared_weights(qkv_bias, batch, tokens):
    fused, wrapper, named = same_weights(qkv_bias)
    x = torch.randn(batch, tokens, D_IN)
    with torch.no_grad():
        fast = fused(x)  # F.scaled_dot_product_attention
        explicit, weights = fused(x, return_weights=True)
        outputs = {"explicit": explicit, "wrapper": wrapper(x), "einsum": named(x)}
    assert fast.shape == (batch, tokens, D_OUT) and weights.shape == (batch, HEADS, tokens, tokens)
    assert not torch.isnan(fast).any()
    for name, out in outputs.items():
        assert close(fast, out), f"{name} differs from the SDPA fast path by {(fast - out).abs().max():.3g}"


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_fused_equals_torch_multihead_attention(qkv_bias):
    """An independent reference: nn.MultiheadAttention with the same weights and a causal mask."""
    fused, _, _ = same_weights(qkv_bias, d_in=D_OUT)  # nn.MultiheadAttention needs d_in == d_out
    reference = nn.MultiheadAttention(D_OUT, HEADS, bias=True, batch_first=True).eval()
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat([fused.W_query.weight, fused.W_key.weight, fused.W_value.weight]))
        reference.in_proj_bias.copy_(torch.cat([fused.W_query.bias, fused.W_key.bias, fused.W_value.bias])
                                     if qkv_bias else torch.zeros(3 * D_OUT))
        reference.out_proj.load_state_dict(fused.out_proj.state_dict())
        x = torch.randn(2, 7, D_OUT)
        future = torch.triu(torch.ones(7, 7, dtype=torch.bool), diagonal=1)
        expected, expected_weights = reference(x, x, x, attn_mask=future, average_attn_weights=False)
        out, weights = fused(x, return_weights=True)
        assert close(fused(x), expected) and close(out, expected) and close(weights, expected_weights)


def test_scale_is_one_over_sqrt_head_dim():
    """Writing the formula out by hand, head by head, catches a wrong scale shared by all variants."""
    fused, _, _ = same_weights()
    x = torch.randn(1, 5, D_IN)
    head_dim = D_OUT // HEADS
    q, k, v = fused.W_query(x)[0], fused.W_key(x)[0], fused.W_value(x)[0]  # (tokens, d_out)
    heads = []
    for h in range(HEADS):
        cols = slice(h * head_dim, (h + 1) * head_dim)
        scores = q[:, cols] @ k[:, cols].T / head_dim**0.5 + torch.triu(torch.full((5, 5), -torch.inf), 1)
        heads.append(torch.softmax(scores, dim=-1) @ v[:, cols])
    expected = fused.out_proj(torch.cat(heads, dim=-1))
    assert close(fused(x)[0], expected)


@pytest.mark.parametrize("cls", VARIANTS + (CausalAttention,))
@pytest.mark.parametrize("training", [False, True])
def test_one_token_and_batch_of_one_give_no_nan(cls, training):
    torch.manual_seed(0)
    module = build(cls, dropout=0.5).train(training)
    for shape in [(1, 1, D_IN), (3, 1, D_IN), (1, 2, D_IN)]:
        out = module(torch.randn(shape))
        assert out.shape == shape[:2] + (D_OUT,) and torch.isfinite(out).all()
    if cls is MultiHeadAttention:
        out, weights = module(torch.randn(1, 1, D_IN), return_weights=True)
        assert torch.isfinite(out).all() and torch.equal(weights, torch.ones(1, HEADS, 1, 1))


def test_float64_layer_takes_float64_input():
    fused, _, _ = same_weights()
    x = torch.randn(2, 5, D_IN)
    as_double = fused.double()(x.double())
    assert as_double.dtype == torch.float64 and fused.future_mask.dtype == torch.bool
    assert torch.allclose(as_double, same_weights()[0](x).double(), atol=1e-5)


# --- causality -------------------------------------------------------------------------------------------

def jacobian_over_positions(module, tokens=6, **kwargs):
    """|d out[t] / d x[s]| summed over features: (tokens, tokens), row t = output position."""
    x = torch.randn(1, tokens, D_IN)
    jac = torch.autograd.functional.jacobian(lambda inp: module(inp, **kwargs), x)  # (1, T, d_out, 1, T, d_in)
    return jac[0, :, :, 0].abs().sum(dim=(1, 3))


@pytest.mark.parametrize("variant", ["fast", "explicit", "wrapper", "einsum", "single head"])
def test_no_position_sees_the_future(variant):
    fused, wrapper, named = same_weights()
    modules = {"fast": fused, "explicit": lambda x: fused(x, return_weights=True)[0], "wrapper": wrapper,
               "einsum": named, "single head": CausalAttention(D_IN, D_OUT, CONTEXT, 0.0).eval()}
    influence = jacobian_over_positions(modules[variant])
    future = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    assert torch.equal(influence[future], torch.zeros(int(future.sum())))  # exactly zero, not merely small
    assert (influence[~future] > 0).all()  # and every allowed position does influence the output


def test_no_position_sees_the_future_with_a_cache():
    fused, _, _ = same_weights()
    cache = KVCache()
    fused(torch.randn(1, 3, D_IN), kv_cache=cache)
    keys, values = cache.keys, cache.values

    def chunk(x):
        fresh = KVCache()
        fresh.append(keys, values)
        return fused(x, kv_cache=fresh)

    influence = jacobian_over_positions(chunk, tokens=4)
    assert torch.equal(torch.triu(influence, diagonal=1), torch.zeros(4, 4))
    assert (torch.tril(influence) + torch.triu(torch.ones(4, 4), diagonal=1) > 0).all()


# --- the attention pattern ------------------------------------------------------------------------------

def test_returned_weights_are_causal_probabilities():
    fused, _, _ = same_weights()
    _, weights = fused(torch.randn(3, 8, D_IN), return_weights=True)  # (batch, heads, tokens, tokens)
    assert close(weights.sum(dim=-1), torch.ones(3, HEADS, 8))
    assert (weights >= 0).all()
    assert torch.equal(torch.triu(weights, diagonal=1), torch.zeros_like(weights))
    assert (torch.tril(weights) > 0).sum() == 3 * HEADS * 8 * 9 // 2  # nothing allowed is masked


def test_state_dict_holds_only_weights():
    """A weight loader maps state dicts by name: no mask buffers, same keys in fused and einsum."""
    for qkv_bias in (False, True):
        fused, _, named = same_weights(qkv_bias)
        keys = ["W_query.weight", "W_key.weight", "W_value.weight", "out_proj.weight", "out_proj.bias"]
        if qkv_bias:
            keys[1:1] = ["W_query.bias"]
            keys[3:3] = ["W_key.bias"]
            keys[5:5] = ["W_value.bias"]
        assert list(fused.state_dict()) == keys
        assert list(named.state_dict()) == keys


# --- incremental mode --------------------------------------------------------------------------------------

@pytest.mark.parametrize("chunks", [[1] * 9, [2, 2, 2, 2, 1], [3, 3, 3], [1, 3, 2, 3], [4, 1, 1, 3]])
@pytest.mark.parametrize("return_weights", [False, True])
def test_incremental_equals_full_pass(chunks, return_weights):
    fused, _, _ = same_weights()
    x = torch.randn(2, sum(chunks), D_IN)
    with torch.no_grad():
        full = fused(x)
        cache, outputs, start = KVCache(), [], 0
        for size in chunks:
            out = fused(x[:, start:start + size], kv_cache=cache, return_weights=return_weights)
            if return_weights:
                out, weights = out
                assert weights.shape == (2, HEADS, size, start + size)
                allowed = torch.ones(size, start + size, dtype=torch.bool).tril(diagonal=start)
                assert torch.equal(weights[..., ~allowed], torch.zeros_like(weights[..., ~allowed]))
                assert close(weights.sum(dim=-1), torch.ones(2, HEADS, size))
            outputs.append(out)
            start += size
            assert len(cache) == start
            assert cache.keys.shape == cache.values.shape == (2, HEADS, start, D_OUT // HEADS)
    assert close(torch.cat(outputs, dim=1), full)


def test_fast_path_calls_sdpa_with_the_right_mask(monkeypatch):
    """No cache: is_causal=True and no mask built; one new token: no mask; a chunk: mask offset by the cache."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((attn_mask, is_causal, dropout_p))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    fused, _, _ = same_weights()
    cache = KVCache()
    fused(torch.randn(1, 3, D_IN), kv_cache=cache)
    fused(torch.randn(1, 1, D_IN), kv_cache=cache)
    fused(torch.randn(1, 2, D_IN), kv_cache=cache)
    fused(torch.randn(1, 2, D_IN), return_weights=True)  # the explicit path does not call it
    assert len(calls) == 3
    assert calls[0] == (None, True, 0.0) and calls[1] == (None, False, 0.0)
    mask, is_causal, _ = calls[2]
    assert not is_causal and torch.equal(mask, torch.tensor([[True, True, True, True, True, False],
                                                             [True, True, True, True, True, True]]))


def test_kv_cache_starts_empty_and_concatenates():
    cache = KVCache()
    assert len(cache) == 0 and cache.keys is None and cache.values is None
    k1, v1 = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    k2, v2 = torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 5)
    assert cache.append(k1, v1) == (k1, v1)
    keys, values = cache.append(k2, v2)
    assert len(cache) == 5 and torch.equal(keys, torch.cat([k1, k2], dim=2))
    assert torch.equal(values, torch.cat([v1, v2], dim=2))


# --- dropout ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["fast", "explicit", "wrapper", "einsum"])
def test_dropout_acts_in_training_only(variant):
    noisy, wrapper, named = same_weights(dropout=0.5)
    clean, _, _ = same_weights(dropout=0.0)
    run = {"fast": noisy, "explicit": lambda x: noisy(x, return_weights=True)[0], "wrapper": wrapper,
           "einsum": named}[variant]
    x = torch.randn(2, 8, D_IN)
    for module in (noisy, wrapper, named):
        module.train()
    first, second = run(x), run(x)
    assert not close(first, second) and not close(first, clean(x))
    for module in (noisy, wrapper, named):
        module.eval()
    assert torch.equal(run(x), run(x)) and close(run(x), clean(x))


def test_returned_weights_are_the_pattern_before_dropout():
    noisy, _, _ = same_weights(dropout=0.5)
    _, weights = noisy.train()(torch.randn(1, 6, D_IN), return_weights=True)
    assert close(weights.sum(dim=-1), torch.ones(1, HEADS, 6))


# --- bad inputs --------------------------------------------------------------------------------------------

def build(cls, d_in=D_IN, d_out=D_OUT, context_length=CONTEXT, dropout=0.0, num_heads=HEADS, qkv_bias=False):
    if cls is CausalAttention:
        return cls(d_in, d_out, context_length, dropout, qkv_bias=qkv_bias)
    return cls(d_in, d_out, context_length, dropout, num_heads, qkv_bias=qkv_bias)


ALL_CLASSES = VARIANTS + (CausalAttention,)


@pytest.mark.parametrize("cls", VARIANTS)
def test_d_out_not_divisible_by_num_heads(cls):
    message = ("d_out 16 is not divisible by num_heads 3: each head gets d_out / num_heads dimensions, "
               "so pick num_heads among the divisors of 16")
    with pytest.raises(ValueError, match=re.escape(message)):
        build(cls, num_heads=3)


@pytest.mark.parametrize("cls", ALL_CLASSES)
@pytest.mark.parametrize("error, message, kwargs", [
    (ValueError, "d_in must be >= 1, got 0", dict(d_in=0)),
    (ValueError, "d_out must be >= 1, got -4", dict(d_out=-4)),
    (ValueError, "context_length must be >= 1, got 0", dict(context_length=0)),
    (TypeError, "d_in must be an int, got 12.0 (float)", dict(d_in=12.0)),
    (TypeError, "context_length must be an int, got True (bool)", dict(context_length=True)),
    (ValueError, "dropout must be in [0, 1), got 1.0: it is the probability of zeroing an attention weight, "
                 "and 1 would zero them all", dict(dropout=1.0)),
    (ValueError, "dropout must be in [0, 1), got -0.1", dict(dropout=-0.1)),
    (TypeError, "dropout must be a float, got '0.1' (str)", dict(dropout="0.1")),
    (TypeError, "qkv_bias must be True or False, got 'yes'", dict(qkv_bias="yes")),
])
def test_bad_constructor_arguments(cls, error, message, kwargs):
    with pytest.raises(error, match=re.escape(message)):
        build(cls, **kwargs)


@pytest.mark.parametrize("cls", VARIANTS)
def test_non_positive_num_heads(cls):
    with pytest.raises(ValueError, match=re.escape("num_heads must be >= 1, got 0")):
        build(cls, num_heads=0)


@pytest.mark.parametrize("cls", ALL_CLASSES)
@pytest.mark.parametrize("error, message, x", [
    (ValueError, "x must be 3-D (batch, tokens, d_in), got shape (4, 12): for a single sequence add a batch "
                 "dimension with x.unsqueeze(0)", torch.randn(4, D_IN)),
    (ValueError, "x must be 3-D (batch, tokens, d_in), got shape (1, 2, 4, 12)", torch.randn(1, 2, 4, D_IN)),
    (TypeError, "x must be a torch.Tensor of shape (batch, tokens, d_in), got list", [[[0.0] * D_IN]]),
    (TypeError, "x has dtype torch.int64, but attention reads embedding vectors: turn token ids into vectors "
                "with an embedding layer first", torch.ones(1, 3, D_IN, dtype=torch.long)),
    (TypeError, "x has dtype torch.float64 but the layer's weights are torch.float32: convert with "
                "x.to(torch.float32)", torch.randn(1, 3, D_IN, dtype=torch.float64)),
    (ValueError, "x has 8 features in its last dimension but the layer expects d_in 12: project the input to "
                 "12 features or build the layer with d_in=8", torch.randn(2, 3, 8)),
    (ValueError, "x has 0 tokens: pass at least one token per sequence", torch.randn(2, 0, D_IN)),
    (ValueError, "x has 11 tokens, more than context_length 10: crop the input to the last 10 tokens",
     torch.randn(1, CONTEXT + 1, D_IN)),
])
def test_bad_inputs(cls, error, message, x):
    with pytest.raises(error, match=re.escape(message)):
        build(cls)(x)


def test_cache_plus_new_tokens_longer_than_context():
    fused = build(MultiHeadAttention)
    cache = KVCache()
    fused(torch.randn(1, 8, D_IN), kv_cache=cache)
    message = ("3 new tokens plus 8 cached tokens = 11, more than context_length 10: crop the input to the "
               "last 10 tokens and start again with an empty KVCache")
    with pytest.raises(ValueError, match=re.escape(message)):
        fused(torch.randn(1, 3, D_IN), kv_cache=cache)
    assert len(cache) == 8  # a refused call leaves the cache as it was
    fused(torch.randn(1, 2, D_IN), kv_cache=cache)  # exactly context_length is fine
    assert len(cache) == CONTEXT


def test_kv_cache_that_does_not_match():
    fused = build(MultiHeadAttention)
    cache = KVCache()
    fused(torch.randn(2, 3, D_IN), kv_cache=cache)
    with pytest.raises(ValueError, match=re.escape(
            "kv_cache holds batch size 2 but the new keys have batch size 3: use a new KVCache() for each "
            "batch of sequences")):
        fused(torch.randn(3, 1, D_IN), kv_cache=cache)
    other = build(MultiHeadAttention, num_heads=2)
    with pytest.raises(ValueError, match=re.escape(
            "kv_cache holds heads 4 but the new keys have heads 2: give each attention layer its own KVCache")):
        other(torch.randn(2, 1, D_IN), kv_cache=cache)
    with pytest.raises(ValueError, match=re.escape("kv_cache holds head_dim 4 but the new keys have head_dim 2")):
        cache.append(torch.randn(2, 4, 1, 2), torch.randn(2, 4, 1, 2))
    assert len(cache) == 3
    with pytest.raises(TypeError, match=re.escape("kv_cache must be a KVCache or None, got dict")):
        fused(torch.randn(2, 1, D_IN), kv_cache={})


def test_kv_cache_append_checks_its_arguments():
    cache = KVCache()
    with pytest.raises(TypeError, match=re.escape("keys and values must be tensors, got Tensor and NoneType")):
        cache.append(torch.randn(1, 2, 3, 4), None)
    with pytest.raises(ValueError, match=re.escape(
            "keys and values must both be (batch, num_heads, tokens, head_dim), got (1, 2, 3, 4) and (1, 2, 3)")):
        cache.append(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3))
    with pytest.raises(ValueError, match=re.escape("got (2, 3, 4) and (2, 3, 4)")):
        cache.append(torch.randn(2, 3, 4), torch.randn(2, 3, 4))
    assert len(cache) == 0


def test_copy_into_a_wrapper_of_another_shape():
    fused = build(MultiHeadAttention)
    message = ("fused has num_heads 4 and W_query weight (16, 12), wrapper has num_heads 2 and needs (16, 12): "
               "build both with the same d_in, d_out and num_heads")
    with pytest.raises(ValueError, match=re.escape(message)):
        copy_fused_weights_to_wrapper(fused, build(MultiHeadAttentionWrapper, num_heads=2))
    with pytest.raises(ValueError, match=re.escape("needs (16, 8)")):
        copy_fused_weights_to_wrapper(fused, build(MultiHeadAttentionWrapper, d_in=8))
    with pytest.raises(ValueError, match=re.escape(
            "fused and wrapper disagree on qkv_bias: build both with the same qkv_bias")):
        copy_fused_weights_to_wrapper(fused, build(MultiHeadAttentionWrapper, qkv_bias=True))

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.attention import (CausalAttention, KVCache, MultiHeadAttention, MultiHeadAttentionEinsum,
                                  MultiHeadAttentionWrapper, copy_fused_weights_to_wrapper)
from course_lib.config import GPTConfig

EMB, CONTEXT, HEADS = 16, 10, 4
HEAD_DIM = EMB // HEADS
SINGLE_HEAD_DIM = 6  # the single head maps EMB -> 6 numbers: a mix-up of its two widths shows in the shapes
VARIANTS = (MultiHeadAttention, MultiHeadAttentionWrapper, MultiHeadAttentionEinsum)
ALL_CLASSES = VARIANTS + (CausalAttention,)


def config(drop_rate=0.0, qkv_bias=False, **changes):
    return GPTConfig(**{**dict(vocab_size=50, context_length=CONTEXT, emb_dim=EMB, n_heads=HEADS, n_layers=1,
                               drop_rate=drop_rate, qkv_bias=qkv_bias), **changes})


def build(cls, drop_rate=0.0, qkv_bias=False, **changes):
    if cls is CausalAttention:
        return cls(EMB, SINGLE_HEAD_DIM, CONTEXT, drop_rate, qkv_bias=qkv_bias)
    return cls(config(drop_rate, qkv_bias, **changes))


def out_width(cls):
    return SINGLE_HEAD_DIM if cls is CausalAttention else EMB


def same_weights(qkv_bias=False, drop_rate=0.0, seed=0):
    """The kernel class, the wrapper and the explicit (einsum) class in eval mode, all holding the kernel
    class's weights."""
    torch.manual_seed(seed)
    cfg = config(drop_rate, qkv_bias)
    kernel, wrapper, explicit = MultiHeadAttention(cfg), MultiHeadAttentionWrapper(cfg), MultiHeadAttentionEinsum(cfg)
    copy_fused_weights_to_wrapper(kernel, wrapper)
    explicit.load_state_dict(kernel.state_dict())
    return kernel.eval(), wrapper.eval(), explicit.eval()


def from_pattern(layer, x):
    """The layer's output rebuilt from its attention_weights: pattern @ values, heads merged, out_proj."""
    return layer.merge_heads(layer.attention_weights(x) @ layer.split_heads(layer.W_value(x)))


def close(a, b):
    return torch.allclose(a, b, atol=1e-5, rtol=0)


# --- every variant computes the same function -------------------------------------------------------------

def test_the_model_class_is_the_explicit_class_with_the_kernel_in_forward():
    assert issubclass(MultiHeadAttention, MultiHeadAttentionEinsum)
    assert MultiHeadAttention.attention_weights is MultiHeadAttentionEinsum.attention_weights
    assert MultiHeadAttention.__init__ is MultiHeadAttentionEinsum.__init__
    assert MultiHeadAttention.forward is not MultiHeadAttentionEinsum.forward


@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("batch, tokens", [(1, 1), (3, 1), (1, 4), (2, 7), (2, CONTEXT)])
def test_all_variants_agree_on_shared_weights(qkv_bias, batch, tokens):
    kernel, wrapper, explicit = same_weights(qkv_bias)
    x = torch.randn(batch, tokens, EMB)
    with torch.no_grad():
        fast = kernel(x)  # F.scaled_dot_product_attention
        weights = kernel.attention_weights(x)
        outputs = {"explicit (einsum)": explicit(x), "wrapper": wrapper(x), "from the pattern": from_pattern(kernel, x)}
    assert fast.shape == (batch, tokens, EMB) and weights.shape == (batch, HEADS, tokens, tokens)
    assert not torch.isnan(fast).any()
    for name, out in outputs.items():
        assert close(fast, out), f"{name} differs from the SDPA kernel by {(fast - out).abs().max():.3g}"


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_kernel_equals_torch_multihead_attention(qkv_bias):
    """An independent reference: nn.MultiheadAttention with the same weights and a causal mask."""
    kernel, _, explicit = same_weights(qkv_bias)
    reference = nn.MultiheadAttention(EMB, HEADS, bias=True, batch_first=True).eval()
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat([kernel.W_query.weight, kernel.W_key.weight,
                                                  kernel.W_value.weight]))
        reference.in_proj_bias.copy_(torch.cat([kernel.W_query.bias, kernel.W_key.bias, kernel.W_value.bias])
                                     if qkv_bias else torch.zeros(3 * EMB))
        reference.out_proj.load_state_dict(kernel.out_proj.state_dict())
        x = torch.randn(2, 7, EMB)
        future = torch.triu(torch.ones(7, 7, dtype=torch.bool), diagonal=1)
        expected, expected_weights = reference(x, x, x, attn_mask=future, average_attn_weights=False)
        assert close(kernel(x), expected) and close(explicit(x), expected)
        assert close(kernel.attention_weights(x), expected_weights)


def test_scale_is_one_over_sqrt_head_dim():
    """Writing the formula out by hand, head by head, catches a wrong scale shared by all variants."""
    kernel, _, _ = same_weights()
    x = torch.randn(1, 5, EMB)
    q, k, v = kernel.W_query(x)[0], kernel.W_key(x)[0], kernel.W_value(x)[0]  # (tokens, emb_dim)
    heads = []
    for h in range(HEADS):
        cols = slice(h * HEAD_DIM, (h + 1) * HEAD_DIM)
        scores = q[:, cols] @ k[:, cols].T / HEAD_DIM**0.5 + torch.triu(torch.full((5, 5), -torch.inf), 1)
        heads.append(torch.softmax(scores, dim=-1) @ v[:, cols])
    expected = kernel.out_proj(torch.cat(heads, dim=-1))
    assert close(kernel(x)[0], expected)


def test_single_head_formula_by_hand():
    torch.manual_seed(0)
    head = build(CausalAttention).eval()
    x = torch.randn(2, 5, EMB)
    scores = head.W_query(x) @ head.W_key(x).transpose(1, 2) / SINGLE_HEAD_DIM**0.5
    weights = torch.softmax(scores + torch.triu(torch.full((5, 5), -torch.inf), 1), dim=-1)
    assert head(x).shape == (2, 5, SINGLE_HEAD_DIM) and close(head(x), weights @ head.W_value(x))


@pytest.mark.parametrize("cls", ALL_CLASSES)
@pytest.mark.parametrize("training", [False, True])
def test_one_token_and_batch_of_one_give_no_nan(cls, training):
    torch.manual_seed(0)
    module = build(cls, drop_rate=0.5).train(training)
    for shape in [(1, 1, EMB), (3, 1, EMB), (1, 2, EMB)]:
        out = module(torch.randn(shape))
        assert out.shape == shape[:2] + (out_width(cls),) and torch.isfinite(out).all()
    if hasattr(module, "attention_weights"):
        assert torch.equal(module.attention_weights(torch.randn(1, 1, EMB)), torch.ones(1, HEADS, 1, 1))


def test_float64_layer_takes_float64_input():
    kernel, _, _ = same_weights()
    x = torch.randn(2, 5, EMB)
    as_double = kernel.double()(x.double())
    assert as_double.dtype == torch.float64 and kernel.future_mask.dtype == torch.bool
    assert torch.allclose(as_double, same_weights()[0](x).double(), atol=1e-5)


# --- causality -------------------------------------------------------------------------------------------

def jacobian_over_positions(module, tokens=6):
    """|d out[t] / d x[s]| summed over features: (tokens, tokens), row t = output position."""
    x = torch.randn(1, tokens, EMB)
    jac = torch.autograd.functional.jacobian(module, x)  # (1, T, out, 1, T, emb_dim)
    return jac[0, :, :, 0].abs().sum(dim=(1, 3))


@pytest.mark.parametrize("variant", ["kernel", "explicit", "from the pattern", "wrapper", "single head"])
def test_no_position_sees_the_future(variant):
    kernel, wrapper, explicit = same_weights()
    modules = {"kernel": kernel, "explicit": explicit, "from the pattern": lambda x: from_pattern(kernel, x),
               "wrapper": wrapper, "single head": build(CausalAttention).eval()}
    influence = jacobian_over_positions(modules[variant])
    future = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    assert torch.equal(influence[future], torch.zeros(int(future.sum())))  # exactly zero, not merely small
    assert (influence[~future] > 0).all()  # and every allowed position does influence the output


def test_no_position_sees_the_future_with_a_cache():
    kernel, _, _ = same_weights()
    cache = KVCache()
    kernel(torch.randn(1, 3, EMB), kv_cache=cache)
    keys, values = cache.keys, cache.values

    def chunk(x):
        fresh = KVCache()
        fresh.append(keys, values)
        return kernel(x, kv_cache=fresh)

    influence = jacobian_over_positions(chunk, tokens=4)
    assert torch.equal(torch.triu(influence, diagonal=1), torch.zeros(4, 4))
    assert (torch.tril(influence) + torch.triu(torch.ones(4, 4), diagonal=1) > 0).all()


# --- the attention pattern ------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [MultiHeadAttention, MultiHeadAttentionEinsum])
def test_attention_weights_are_causal_probabilities(cls):
    torch.manual_seed(0)
    weights = build(cls).attention_weights(torch.randn(3, 8, EMB))  # (batch, heads, tokens, tokens)
    assert close(weights.sum(dim=-1), torch.ones(3, HEADS, 8))
    assert (weights >= 0).all()
    assert torch.equal(torch.triu(weights, diagonal=1), torch.zeros_like(weights))
    assert (torch.tril(weights) > 0).sum() == 3 * HEADS * 8 * 9 // 2  # nothing allowed is masked


def test_state_dict_holds_only_weights():
    """A weight loader maps state dicts by name: no mask buffers, same keys in the kernel and explicit classes."""
    for qkv_bias in (False, True):
        kernel, _, explicit = same_weights(qkv_bias)
        keys = ["W_query.weight", "W_key.weight", "W_value.weight", "out_proj.weight", "out_proj.bias"]
        if qkv_bias:
            keys[1:1] = ["W_query.bias"]
            keys[3:3] = ["W_key.bias"]
            keys[5:5] = ["W_value.bias"]
        assert list(kernel.state_dict()) == keys
        assert list(explicit.state_dict()) == keys


def test_attributes_follow_the_config_names():
    for cls in VARIANTS:
        layer = build(cls, drop_rate=0.25)
        assert (layer.emb_dim, layer.n_heads, layer.head_dim) == (EMB, HEADS, HEAD_DIM)
    for cls in (MultiHeadAttention, MultiHeadAttentionEinsum):
        layer = build(cls, drop_rate=0.25)
        assert (layer.context_length, layer.drop_rate) == (CONTEXT, 0.25)
    head = build(CausalAttention, drop_rate=0.25)
    assert (head.emb_dim, head.head_dim, head.context_length, head.drop_rate) == (EMB, SINGLE_HEAD_DIM, CONTEXT,
                                                                                 0.25)


# --- incremental mode --------------------------------------------------------------------------------------

@pytest.mark.parametrize("chunks", [[1] * 9, [2, 2, 2, 2, 1], [3, 3, 3], [1, 3, 2, 3], [4, 1, 1, 3]])
def test_incremental_equals_full_pass(chunks):
    kernel, _, _ = same_weights()
    x = torch.randn(2, sum(chunks), EMB)
    with torch.no_grad():
        full = kernel(x)
        cache, outputs, start = KVCache(), [], 0
        for size in chunks:
            outputs.append(kernel(x[:, start:start + size], kv_cache=cache))
            start += size
            assert len(cache) == start
            assert cache.keys.shape == cache.values.shape == (2, HEADS, start, HEAD_DIM)
    assert close(torch.cat(outputs, dim=1), full)


@pytest.mark.parametrize("training", [False, True])
def test_forward_is_one_sdpa_call_with_the_mask_offset_by_the_cache(monkeypatch, training):
    """Every forward of the kernel class calls SDPA once, with attn_mask = True where a token may attend
    (offset by the cached positions), never is_causal, and dropout only in training; the explicit class and
    attention_weights never call it."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((attn_mask, is_causal, dropout_p))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    kernel, _, explicit = same_weights(drop_rate=0.25)
    kernel.train(training)
    cache = KVCache()
    kernel(torch.randn(1, 3, EMB), kv_cache=cache)
    kernel(torch.randn(1, 1, EMB), kv_cache=cache)
    kernel(torch.randn(1, 2, EMB), kv_cache=cache)
    kernel(torch.randn(1, 2, EMB))
    explicit(torch.randn(1, 2, EMB))
    kernel.attention_weights(torch.randn(1, 2, EMB))
    assert len(calls) == 4
    T, F_ = True, False
    expected = [[[T, F_, F_], [T, T, F_], [T, T, T]], [[T, T, T, T]],
                [[T, T, T, T, T, F_], [T, T, T, T, T, T]], [[T, F_], [T, T]]]
    for (mask, is_causal, dropout_p), allowed in zip(calls, expected):
        assert not is_causal and torch.equal(mask, torch.tensor(allowed))
        assert dropout_p == (0.25 if training else 0.0)


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

@pytest.mark.parametrize("variant", ["kernel", "explicit", "wrapper", "single head"])
def test_dropout_acts_in_training_only(variant):
    noisy_kernel, noisy_wrapper, noisy_explicit = same_weights(drop_rate=0.5)
    clean_kernel, clean_wrapper, clean_explicit = same_weights(drop_rate=0.0)
    torch.manual_seed(1)
    noisy_head = build(CausalAttention, drop_rate=0.5)
    clean_head = build(CausalAttention)
    clean_head.load_state_dict(noisy_head.state_dict())
    noisy, clean = {"kernel": (noisy_kernel, clean_kernel), "explicit": (noisy_explicit, clean_explicit),
                    "wrapper": (noisy_wrapper, clean_wrapper), "single head": (noisy_head, clean_head)}[variant]
    clean.eval()
    x = torch.randn(2, 8, EMB)
    noisy.train()
    first, second = noisy(x), noisy(x)
    assert not close(first, second) and not close(first, clean(x))
    noisy.eval()
    assert torch.equal(noisy(x), noisy(x)) and close(noisy(x), clean(x))


@pytest.mark.parametrize("cls", [MultiHeadAttention, MultiHeadAttentionEinsum])
def test_attention_weights_are_the_pattern_before_dropout(cls):
    torch.manual_seed(0)
    noisy = build(cls, drop_rate=0.5).train()
    x = torch.randn(1, 6, EMB)
    weights = noisy.attention_weights(x)
    assert close(weights.sum(dim=-1), torch.ones(1, HEADS, 6))
    assert torch.equal(weights, noisy.eval().attention_weights(x))


# --- bad arguments --------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", VARIANTS)
def test_multi_head_classes_take_a_gpt_config(cls):
    message = "cfg must be a GPTConfig, got dict: build one with GPTConfig(...) or take one from GPT2_CONFIGS"
    with pytest.raises(TypeError, match=re.escape(message)):
        cls({"emb_dim": EMB, "n_heads": HEADS})


def test_emb_dim_not_divisible_by_n_heads_is_refused_by_the_config():
    message = ("emb_dim 16 is not divisible by n_heads 3: each head gets emb_dim / n_heads dimensions, "
               "so pick n_heads among the divisors of 16")
    with pytest.raises(ValueError, match=re.escape(message)):
        config(n_heads=3)


@pytest.mark.parametrize("error, message, kwargs", [
    (ValueError, "emb_dim must be >= 1, got 0", dict(emb_dim=0)),
    (ValueError, "head_dim must be >= 1, got -4", dict(head_dim=-4)),
    (ValueError, "context_length must be >= 1, got 0", dict(context_length=0)),
    (TypeError, "emb_dim must be an int, got 12.0 (float)", dict(emb_dim=12.0)),
    (TypeError, "context_length must be an int, got True (bool)", dict(context_length=True)),
    (ValueError, "drop_rate must be in [0, 1), got 1.0: it is the probability of zeroing an attention weight "
                 "(0 turns dropout off, 1 would zero them all)", dict(drop_rate=1.0)),
    (ValueError, "drop_rate must be in [0, 1), got -0.1", dict(drop_rate=-0.1)),
    (TypeError, "drop_rate must be a number, got '0.1' (str)", dict(drop_rate="0.1")),
    (TypeError, "qkv_bias must be True or False, got 'yes'", dict(qkv_bias="yes")),
])
def test_bad_single_head_arguments(error, message, kwargs):
    args = {**dict(emb_dim=EMB, head_dim=SINGLE_HEAD_DIM, context_length=CONTEXT, drop_rate=0.0), **kwargs}
    with pytest.raises(error, match=re.escape(message)):
        CausalAttention(**args)


@pytest.mark.parametrize("cls", ALL_CLASSES)
@pytest.mark.parametrize("error, message, x", [
    (ValueError, "x must be shaped (batch, tokens, 16), got shape (4, 16) (for a single sequence add a batch "
                 "dimension with .unsqueeze(0)): the layer was built for vectors of 16 numbers", torch.randn(4, EMB)),
    (ValueError, "x must be shaped (batch, tokens, 16), got shape (1, 2, 4, 16)", torch.randn(1, 2, 4, EMB)),
    (TypeError, "x must be a floating-point tensor of vectors, got list: token ids become vectors in an embedding "
                "layer; other tensors convert with .float()", [[[0.0] * EMB]]),
    (TypeError, "x must be a floating-point tensor of vectors, got dtype torch.int64",
     torch.ones(1, 3, EMB, dtype=torch.long)),
    (TypeError, "x has dtype torch.float64 but the layer's weights are torch.float32: convert with "
                ".to(torch.float32) or the layer with .to(torch.float64)", torch.randn(1, 3, EMB, dtype=torch.float64)),
    (ValueError, "x must be shaped (batch, tokens, 16), got shape (2, 3, 8): the layer was built for vectors of 16 "
                 "numbers", torch.randn(2, 3, 8)),
    (ValueError, "x has 0 tokens: pass at least one token per sequence", torch.randn(2, 0, EMB)),
    (ValueError, "x has 11 tokens, more than context_length 10: crop the input to the last 10 tokens",
     torch.randn(1, CONTEXT + 1, EMB)),
])
def test_bad_inputs(cls, error, message, x):
    with pytest.raises(error, match=re.escape(message)):
        build(cls)(x)


@pytest.mark.parametrize("cls", [MultiHeadAttention, MultiHeadAttentionEinsum])
def test_bad_inputs_to_attention_weights(cls):
    with pytest.raises(ValueError, match=re.escape("x has 11 tokens, more than context_length 10")):
        build(cls).attention_weights(torch.randn(1, CONTEXT + 1, EMB))
    with pytest.raises(ValueError, match=re.escape("x must be shaped (batch, tokens, 16), got shape (2, 3, 8)")):
        build(cls).attention_weights(torch.randn(2, 3, 8))


def test_cache_plus_new_tokens_longer_than_context():
    kernel = build(MultiHeadAttention)
    cache = KVCache()
    kernel(torch.randn(1, 8, EMB), kv_cache=cache)
    message = ("3 new tokens plus 8 cached tokens = 11, more than context_length 10: crop the input to the "
               "last 10 tokens and start again with an empty KVCache")
    with pytest.raises(ValueError, match=re.escape(message)):
        kernel(torch.randn(1, 3, EMB), kv_cache=cache)
    assert len(cache) == 8  # a refused call leaves the cache as it was
    kernel(torch.randn(1, 2, EMB), kv_cache=cache)  # exactly context_length is fine
    assert len(cache) == CONTEXT


def test_kv_cache_that_does_not_match():
    kernel = build(MultiHeadAttention)
    cache = KVCache()
    kernel(torch.randn(2, 3, EMB), kv_cache=cache)
    with pytest.raises(ValueError, match=re.escape(
            "kv_cache holds batch size 2 but the new keys have batch size 3: use a new KVCache() for each "
            "batch of sequences")):
        kernel(torch.randn(3, 1, EMB), kv_cache=cache)
    other = build(MultiHeadAttention, n_heads=2)
    with pytest.raises(ValueError, match=re.escape(
            "kv_cache holds heads 4 but the new keys have heads 2: give each attention layer its own KVCache")):
        other(torch.randn(2, 1, EMB), kv_cache=cache)
    with pytest.raises(ValueError, match=re.escape("kv_cache holds head_dim 4 but the new keys have head_dim 2")):
        cache.append(torch.randn(2, 4, 1, 2), torch.randn(2, 4, 1, 2))
    assert len(cache) == 3
    with pytest.raises(TypeError, match=re.escape(
            "kv_cache must be a KVCache, got dict: pass KVCache() for incremental mode, or None")):
        kernel(torch.randn(2, 1, EMB), kv_cache={})


def test_kv_cache_append_checks_its_arguments():
    cache = KVCache()
    with pytest.raises(TypeError, match=re.escape("keys and values must be tensors, got Tensor and NoneType")):
        cache.append(torch.randn(1, 2, 3, 4), None)
    with pytest.raises(ValueError, match=re.escape(
            "keys and values must both be (batch, n_heads, tokens, head_dim), got (1, 2, 3, 4) and (1, 2, 3)")):
        cache.append(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3))
    with pytest.raises(ValueError, match=re.escape("got (2, 3, 4) and (2, 3, 4)")):
        cache.append(torch.randn(2, 3, 4), torch.randn(2, 3, 4))
    assert len(cache) == 0


def test_copy_into_a_wrapper_of_another_shape():
    kernel = build(MultiHeadAttention)
    message = ("fused has n_heads 4 and W_query weight (16, 16), wrapper has n_heads 2 and needs (16, 16): "
               "build both from the same GPTConfig")
    with pytest.raises(ValueError, match=re.escape(message)):
        copy_fused_weights_to_wrapper(kernel, build(MultiHeadAttentionWrapper, n_heads=2))
    with pytest.raises(ValueError, match=re.escape("needs (8, 8)")):
        copy_fused_weights_to_wrapper(kernel, build(MultiHeadAttentionWrapper, emb_dim=8))
    with pytest.raises(ValueError, match=re.escape(
            "fused and wrapper disagree on qkv_bias: build both from the same GPTConfig")):
        copy_fused_weights_to_wrapper(kernel, build(MultiHeadAttentionWrapper, qkv_bias=True))


# --- padding: attention_mask hides pads from every real token ------------------------------------------------

def test_an_all_ones_mask_changes_nothing_and_pads_are_invisible_to_real_tokens():
    kernel, _, _ = same_weights()
    x = torch.randn(2, 6, EMB)
    with torch.no_grad():
        assert torch.equal(kernel(x, attention_mask=torch.ones(2, 6, dtype=torch.bool)), kernel(x))
        mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
        padded = kernel(x, attention_mask=mask)
        assert close(padded[1, 2:], kernel(x[1:, 2:])[0])  # the real tokens of row 1 as if alone
        noise = x.clone()
        noise[1, :2] = torch.randn(2, EMB) * 100  # anything at all in the pads
        assert close(kernel(noise, attention_mask=mask)[1, 2:], padded[1, 2:])
        assert torch.isfinite(padded).all()  # a pad's own row is never empty, so never NaN


def test_the_mask_covers_the_cache():
    kernel, _, _ = same_weights()
    x = torch.randn(1, 5, EMB)
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    cache = KVCache()
    with torch.no_grad():
        kernel(x[:, :3], kv_cache=cache, attention_mask=mask[:, :3])
        stepped = kernel(x[:, 3:], kv_cache=cache, attention_mask=mask)
        assert close(stepped, kernel(x, attention_mask=mask)[:, 3:])
        with pytest.raises(ValueError, match=r"attention_mask must be shaped \(batch, tokens so far\) = \(1, 6\)"):
            kernel(x[:, :1], kv_cache=cache, attention_mask=mask)  # 5 cached + 1 new need 6 entries


def test_kv_cache_select_and_crop():
    cache = KVCache()
    cache.select(torch.tensor([0]))  # an empty cache stays empty
    cache.crop(3)
    assert len(cache) == 0
    keys, values = torch.randn(2, HEADS, 5, HEAD_DIM), torch.randn(2, HEADS, 5, HEAD_DIM)
    cache.append(keys, values)
    cache.select(torch.tensor([1, 1, 0]))  # copy row 1, keep row 0 after it
    assert torch.equal(cache.keys, keys[[1, 1, 0]]) and torch.equal(cache.values, values[[1, 1, 0]])
    cache.crop(7)  # longer than the cache: nothing to forget
    assert len(cache) == 5
    cache.crop(2)
    assert len(cache) == 2 and torch.equal(cache.keys, keys[[1, 1, 0], :, :2])
    with pytest.raises(ValueError, match="length must be >= 0"):
        cache.crop(-1)

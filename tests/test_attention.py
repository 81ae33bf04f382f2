import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.attention import (CausalAttention, KVCache, MultiHeadAttention, MultiHeadAttentionEinsum,
                                  MultiHeadAttentionWrapper, copy_fused_weights_to_wrapper)
from course_lib.config import GPTConfig
from course_lib.model import padding_may_attend

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
def test_forward_is_one_sdpa_call_causal_by_flag_or_by_the_mask_offset_by_the_cache(monkeypatch, training):
    """Every forward of the kernel class calls SDPA once (notebook 05, sections 5 and 8): with nothing cached and no
    may_attend, is_causal=True and no mask; with a non-empty cache, attn_mask = True where a token may attend (offset
    by the cached positions) and is_causal=False; a caller's may_attend replaces the rule as it is; dropout only in
    training. The explicit class and attention_weights never call it."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((attn_mask, is_causal, dropout_p))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    kernel, _, explicit = same_weights(drop_rate=0.25)
    kernel.train(training)
    cache = KVCache()
    kernel(torch.randn(1, 3, EMB), kv_cache=cache)  # an empty cache: the causal flag, as without one
    kernel(torch.randn(1, 1, EMB), kv_cache=cache)
    kernel(torch.randn(1, 2, EMB), kv_cache=cache)
    kernel(torch.randn(1, 2, EMB))
    own = torch.tensor([[True, False], [False, True]])  # a caller's rule: each token sees only itself
    kernel(torch.randn(1, 2, EMB), may_attend=own)
    explicit(torch.randn(1, 2, EMB))
    kernel.attention_weights(torch.randn(1, 2, EMB))
    assert len(calls) == 5
    T, F_ = True, False
    expected = [None, [[T, T, T, T]], [[T, T, T, T, T, F_], [T, T, T, T, T, T]], None, own.tolist()]
    for (mask, is_causal, dropout_p), allowed in zip(calls, expected):
        if allowed is None:
            assert is_causal and mask is None
        else:
            assert not is_causal and torch.equal(mask, torch.tensor(allowed))
        assert dropout_p == (0.25 if training else 0.0)
    assert calls[4][0] is own  # passed on as it is


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


# --- bad arguments ----------------------------------------------------------------------------------------
# Issue 29: the attention layers check nothing per call and their constructors nothing either; the model checks its
# token ids once, at its door (test_model.py), and GPTConfig its sizes (test_config.py). What reaches a layer directly
# still fails loudly, with PyTorch's (or Python's) own error, and these tests hold it to that.

@pytest.mark.parametrize("cls", VARIANTS)
def test_multi_head_classes_fail_loudly_on_a_dict_config(cls):
    # was: "cfg must be a GPTConfig, got dict" from each layer; GPTModel(cfg) still says it (test_model.py)
    with pytest.raises(AttributeError, match=re.escape("'dict' object has no attribute 'emb_dim'")):
        cls({"emb_dim": EMB, "n_heads": HEADS})


def test_emb_dim_not_divisible_by_n_heads_is_refused_by_the_config():
    message = ("emb_dim 16 is not divisible by n_heads 3: each head gets emb_dim / n_heads dimensions, "
               "so pick n_heads among the divisors of 16")
    with pytest.raises(ValueError, match=re.escape(message)):
        config(n_heads=3)


# was: CausalAttention's own checks of its sizes, drop_rate and qkv_bias. The values PyTorch accepts without a word
# (emb_dim 0, context_length True, drop_rate 1.0, qkv_bias "yes") are refused where a GPT's sizes come from,
# GPTConfig (test_config.py); the rest still stop, in the constructor or in the first forward.
@pytest.mark.parametrize("error, fragment, kwargs", [
    (RuntimeError, "Trying to create tensor with negative dimension -4", dict(head_dim=-4)),
    (TypeError, "tuple of ints", dict(emb_dim=12.0)),
    (ValueError, "dropout probability has to be between 0 and 1, but got -0.1", dict(drop_rate=-0.1)),
    (TypeError, "'<' not supported between instances of 'str' and 'float'", dict(drop_rate="0.1")),
    (RuntimeError, "The size of tensor a (0) must match the size of tensor b (3)", dict(context_length=0)),
])
def test_bad_single_head_arguments_fail_loudly(error, fragment, kwargs):
    args = {**dict(emb_dim=EMB, head_dim=SINGLE_HEAD_DIM, context_length=CONTEXT, drop_rate=0.0), **kwargs}
    with pytest.raises(error, match=re.escape(fragment)):
        CausalAttention(**args).train()(torch.randn(1, 3, EMB))


# was: check_attention_input's messages. Each bad x now stops in the first PyTorch (or einops) call that cannot take
# it; the fragment below is that call's own message. Two cases left for the door: x with 0 tokens (an empty output,
# no error: GPTModel refuses empty token_ids) and x longer than context_length (MultiHeadAttention's is_causal needs
# no mask table, so it computes; GPTModel refuses more tokens than positions left, test_model.py).
EINOPS = re.escape('pattern "batch pos (head head_dim) -> batch head pos head_dim"')  # split_heads' rearrange
WRONG_RANK = {  # what the first call to meet a 2-D or 4-D x says (einops' EinopsError is a RuntimeError)
    MultiHeadAttention: (RuntimeError, EINOPS),
    MultiHeadAttentionEinsum: (RuntimeError, EINOPS),
    MultiHeadAttentionWrapper: ((IndexError, RuntimeError), "Dimension out of range|must match the size of tensor"),
    CausalAttention: ((IndexError, RuntimeError), "Dimension out of range|must match the size of tensor"),
}


@pytest.mark.parametrize("cls", ALL_CLASSES)
@pytest.mark.parametrize("error, fragment, x", [
    ((TypeError, AttributeError), "must be Tensor, not list|'list' object has no attribute 'shape'",
     [[[0.0] * EMB]]),
    (RuntimeError, re.escape("have the same dtype, but got: long int != float"),
     torch.ones(1, 3, EMB, dtype=torch.long)),
    (RuntimeError, re.escape("have the same dtype, but got: double != float"),
     torch.randn(1, 3, EMB, dtype=torch.float64)),
    (RuntimeError, re.escape("mat1 and mat2 shapes cannot be multiplied (6x8 and 16x"), torch.randn(2, 3, 8)),
])
def test_bad_inputs_fail_loudly_in_pytorch(cls, error, fragment, x):
    with pytest.raises(error, match=fragment):
        build(cls)(x)


@pytest.mark.parametrize("cls", ALL_CLASSES)
@pytest.mark.parametrize("x", [torch.randn(4, EMB), torch.randn(1, 2, 4, EMB)], ids=["2-D", "4-D"])
def test_x_of_the_wrong_rank_fails_loudly(cls, x):
    error, pattern = WRONG_RANK[cls]
    with pytest.raises(error, match=pattern):
        build(cls)(x)


@pytest.mark.parametrize("cls", [MultiHeadAttentionWrapper, MultiHeadAttentionEinsum, CausalAttention])
def test_layers_that_read_the_mask_table_fail_loudly_past_context_length(cls):
    with pytest.raises(RuntimeError, match=re.escape("The size of tensor a (10) must match the size of tensor b (11)")):
        build(cls)(torch.randn(1, CONTEXT + 1, EMB))


@pytest.mark.parametrize("cls", [MultiHeadAttention, MultiHeadAttentionEinsum])
def test_bad_inputs_to_attention_weights_fail_loudly(cls):
    with pytest.raises(RuntimeError, match=re.escape("The size of tensor a (10) must match the size of tensor b (11)")):
        build(cls).attention_weights(torch.randn(1, CONTEXT + 1, EMB))
    with pytest.raises(RuntimeError, match=re.escape("mat1 and mat2 shapes cannot be multiplied (6x8 and 16x16)")):
        build(cls).attention_weights(torch.randn(2, 3, 8))


def test_cache_plus_new_tokens_longer_than_context_fails_loudly():
    # was: a named ValueError that left the cache as it was. The layer now stops in SDPA, after its cache has taken
    # the new keys; GPTModel refuses the same call at its door, caches untouched (test_model.py).
    kernel = build(MultiHeadAttention)
    cache = KVCache()
    kernel(torch.randn(1, 8, EMB), kv_cache=cache)
    with pytest.raises(RuntimeError, match=re.escape("The size of tensor a (11) must match the size of tensor b (10)")):
        kernel(torch.randn(1, 3, EMB), kv_cache=cache)
    fresh = KVCache()
    kernel(torch.randn(1, 8, EMB), kv_cache=fresh)
    kernel(torch.randn(1, 2, EMB), kv_cache=fresh)  # exactly context_length is fine
    assert len(fresh) == CONTEXT


def test_kv_cache_that_does_not_match_fails_loudly_in_cat():
    # was: KVCache.check_new's messages; now torch.cat refuses, before the cache changes
    kernel = build(MultiHeadAttention)
    cache = KVCache()
    kernel(torch.randn(2, 3, EMB), kv_cache=cache)
    with pytest.raises(RuntimeError, match=re.escape(
            "Sizes of tensors must match except in dimension 2. Expected size 2 but got size 3")):
        kernel(torch.randn(3, 1, EMB), kv_cache=cache)  # another batch size
    other = build(MultiHeadAttention, n_heads=2)
    with pytest.raises(RuntimeError, match=re.escape(
            "Sizes of tensors must match except in dimension 2. Expected size 4 but got size 2")):
        other(torch.randn(2, 1, EMB), kv_cache=cache)  # another layer's heads
    with pytest.raises(RuntimeError, match=re.escape(
            "Sizes of tensors must match except in dimension 2. Expected size 4 but got size 2")):
        cache.append(torch.randn(2, 4, 1, 2), torch.randn(2, 4, 1, 2))  # another head_dim
    assert len(cache) == 3
    with pytest.raises(AttributeError, match=re.escape("'dict' object has no attribute 'append'")):
        kernel(torch.randn(2, 1, EMB), kv_cache={})


# test_kv_cache_append_checks_its_arguments is gone with KVCache.check_new: append trusts its one caller, the
# attention layer, which always hands it two (batch, n_heads, tokens, head_dim) tensors of one dtype.


def test_copy_into_a_wrapper_of_another_shape_is_refused_before_anything_is_copied():
    # was: load_state_dict's RuntimeError, raised after it had copied every tensor that fit; the door compares the
    # two layouts first, so a refused copy leaves the wrapper as it was
    kernel = build(MultiHeadAttention)
    cases = [(kernel, build(MultiHeadAttentionWrapper, emb_dim=8),
              "wrapper's heads.0.W_key.weight is (2, 8), fused gives it (2, 16): build both from one GPTConfig"),
             (kernel, build(MultiHeadAttentionWrapper, qkv_bias=True),
              "wrapper's heads.0.W_key.bias is (4,), fused gives it nothing"),
             (build(MultiHeadAttention, qkv_bias=True), build(MultiHeadAttentionWrapper),
              "wrapper's heads.0.W_key.bias is missing, fused gives it (4,)")]
    for fused, wrapper, message in cases:
        before = {name: t.clone() for name, t in wrapper.state_dict().items()}
        with pytest.raises(ValueError, match=re.escape(message)):
            copy_fused_weights_to_wrapper(fused, wrapper)
        assert all(torch.equal(before[name], t) for name, t in wrapper.state_dict().items()), "nothing copied"


def test_copy_into_a_wrapper_with_other_heads_is_refused():
    """4 heads into 2 heads of the same emb_dim: the row blocks have the shapes load_state_dict expects, so the one
    check of n_heads is what stops a wrapper that would compute another function."""
    kernel, wrapper = build(MultiHeadAttention).eval(), build(MultiHeadAttentionWrapper, n_heads=2).eval()
    before = {name: t.clone() for name, t in wrapper.state_dict().items()}
    with pytest.raises(ValueError, match=re.escape("fused has 4 heads, wrapper 2: build both from one GPTConfig")):
        copy_fused_weights_to_wrapper(kernel, wrapper)
    assert all(torch.equal(before[name], t) for name, t in wrapper.state_dict().items()), "nothing copied"


# --- padding: may_attend (notebook 07's padding_may_attend) hides pads from every real token ------------------------

def test_padding_may_attend_is_causal_and_hides_the_pads():
    T, F_ = True, False
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    allowed = padding_may_attend(mask, 3)
    assert allowed.dtype == torch.bool and allowed.shape == (2, 1, 3, 3)
    assert allowed[0, 0].tolist() == [[T, F_, F_], [T, T, F_], [T, T, T]]  # no pad: plain causal
    assert allowed[1, 0].tolist() == [[T, F_, F_], [F_, T, F_], [F_, T, T]]  # the pad keeps its own row, unread
    everything = torch.ones(2, 6, dtype=torch.long)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.equal(padding_may_attend(everything, 6)[:, 0], causal.expand(2, 6, 6))
    kernel = build(MultiHeadAttention)  # with 4 cached columns: the rows of the cache's offset mask
    assert torch.equal(padding_may_attend(everything, 2)[0, 0], ~kernel.future_mask[4:6, :6])


def test_an_all_ones_mask_changes_nothing_and_pads_are_invisible_to_real_tokens():
    kernel, _, _ = same_weights()
    x = torch.randn(2, 6, EMB)
    with torch.no_grad():
        # is_causal=True and the same rule as a mask may run different SDPA kernels: equal within rounding
        assert close(kernel(x, may_attend=padding_may_attend(torch.ones(2, 6, dtype=torch.bool), 6)), kernel(x))
        mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
        padded = kernel(x, may_attend=padding_may_attend(mask, 6))
        assert close(padded[1, 2:], kernel(x[1:, 2:])[0])  # the real tokens of row 1 as if alone
        noise = x.clone()
        noise[1, :2] = torch.randn(2, EMB) * 100  # anything at all in the pads
        assert close(kernel(noise, may_attend=padding_may_attend(mask, 6))[1, 2:], padded[1, 2:])
        assert torch.isfinite(padded).all()  # a pad's own row is never empty, so never NaN
        assert not close(kernel(x)[1, 2:], padded[1, 2:])  # without the mask, the pads are read


def test_the_mask_covers_the_cache():
    kernel, _, _ = same_weights()
    x = torch.randn(1, 5, EMB)
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    cache = KVCache()
    with torch.no_grad():
        kernel(x[:, :3], kv_cache=cache, may_attend=padding_may_attend(mask[:, :3], 3))
        stepped = kernel(x[:, 3:], kv_cache=cache, may_attend=padding_may_attend(mask, 2))
        assert close(stepped, kernel(x, may_attend=padding_may_attend(mask, 5))[:, 3:])
        assert close(stepped, kernel(x[:, 2:])[:, 1:])  # = the 3 real tokens alone
        # was: require_attention_mask in the layer; the shape of attention_mask is now checked at GPTModel's door
        # (test_decoding.py, test_padding_errors_are_named), and a may_attend one column short stops in SDPA
        with pytest.raises(RuntimeError, match="must match the size of tensor"):
            kernel(x[:, :1], kv_cache=cache, may_attend=padding_may_attend(mask, 1))  # 5 cached + 1 new need 6


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

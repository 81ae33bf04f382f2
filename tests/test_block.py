import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.attention import KVCache, MultiHeadAttention
from course_lib.block import TransformerBlock
from course_lib.config import GPT2_CONFIGS, GPTConfig

SMALL = GPTConfig(vocab_size=100, context_length=16, emb_dim=32, n_heads=4, n_layers=1, drop_rate=0.0)


def small_block(seed=0, **changes):
    torch.manual_seed(seed)
    block = TransformerBlock(GPTConfig(**{**SMALL.__dict__, **changes})).eval()
    with torch.no_grad():  # non-trivial LayerNorm parameters, so a swapped norm1/norm2 would show
        for norm in (block.norm1, block.norm2):
            norm.scale.uniform_(0.5, 1.5)
            norm.shift.normal_(0.0, 0.1)
    return block


class Zero(nn.Module):
    def forward(self, x, *args):
        return torch.zeros_like(x)


def test_gpt2_block_keeps_the_shape_and_has_the_hand_counted_parameters():
    torch.manual_seed(0)
    block = TransformerBlock(GPT2_CONFIGS["gpt2"]).eval()
    x = torch.randn(2, 4, 768)
    assert block(x).shape == (2, 4, 768)
    d = 768
    attention, feed_forward, norms = 4 * (d * d + d), 8 * d * d + 5 * d, 2 * 2 * d
    counts = {name: sum(p.numel() for p in getattr(block, name).parameters())
              for name in ("att", "ff", "norm1", "norm2")}
    assert counts == {"att": attention, "ff": feed_forward, "norm1": 2 * d, "norm2": 2 * d}
    assert sum(p.numel() for p in block.parameters()) == attention + feed_forward + norms == 7_087_872


@pytest.mark.parametrize("emb_dim,n_heads,qkv_bias", [(32, 4, True), (48, 3, False), (64, 8, True)])
def test_parameter_count_follows_12d2_plus_13d(emb_dim, n_heads, qkv_bias):
    block = TransformerBlock(GPTConfig(emb_dim=emb_dim, n_heads=n_heads, context_length=8, qkv_bias=qkv_bias))
    d = emb_dim
    assert sum(p.numel() for p in block.parameters()) == 12 * d * d + 13 * d - (0 if qkv_bias else 3 * d)


def test_attention_is_built_from_the_config():
    block = TransformerBlock(GPTConfig(emb_dim=48, n_heads=3, context_length=8, drop_rate=0.25, qkv_bias=False))
    att = block.att
    assert type(att) is MultiHeadAttention and att.W_query.bias is None
    assert (att.emb_dim, att.n_heads, att.head_dim, att.context_length, att.drop_rate) == (48, 3, 16, 8, 0.25)


def test_block_with_zero_sublayers_is_the_identity():
    block = small_block()
    block.att, block.ff = Zero(), Zero()
    x = torch.randn(2, 5, 32)
    assert torch.equal(block(x), x)  # pre-LN: the shortcut path is never normalised


def test_block_equals_the_hand_written_pre_ln_composition():
    block = small_block()
    x = torch.randn(2, 7, 32)
    h = x + block.att(block.norm1(x))
    expected = h + block.ff(block.norm2(h))
    assert torch.allclose(block(x), expected, atol=1e-6)
    swapped = x + block.att(block.norm2(x))
    swapped = swapped + block.ff(block.norm1(swapped))
    assert not torch.allclose(block(x), swapped, atol=1e-3)  # the order of the norms matters


def test_block_equals_pytorch_pre_ln_encoder_layer_with_a_causal_mask():
    block = small_block()
    d = SMALL.emb_dim
    ref = nn.TransformerEncoderLayer(d, SMALL.n_heads, dim_feedforward=4 * d, dropout=0.0,
                                     activation=lambda t: F.gelu(t, approximate="tanh"),
                                     batch_first=True, norm_first=True, layer_norm_eps=1e-5).eval()
    with torch.no_grad():
        att = block.att
        ref.self_attn.in_proj_weight.copy_(torch.cat([att.W_query.weight, att.W_key.weight, att.W_value.weight]))
        ref.self_attn.in_proj_bias.copy_(torch.cat([att.W_query.bias, att.W_key.bias, att.W_value.bias]))
        ref.self_attn.out_proj.load_state_dict(att.out_proj.state_dict())
        ref.linear1.load_state_dict(block.ff.fc.state_dict())
        ref.linear2.load_state_dict(block.ff.proj.state_dict())
        for theirs, ours in ((ref.norm1, block.norm1), (ref.norm2, block.norm2)):
            theirs.weight.copy_(ours.scale)
            theirs.bias.copy_(ours.shift)
        x = torch.randn(3, 9, d)
        mask = nn.Transformer.generate_square_subsequent_mask(9)
        assert torch.allclose(block(x), ref(x, src_mask=mask, is_causal=True), atol=1e-5)


def test_kv_cache_token_by_token_equals_the_full_pass():
    block = small_block()
    x = torch.randn(2, 9, 32)
    full = block(x)
    cache = KVCache()
    pieces = [block(x[:, :4], cache)] + [block(x[:, i:i + 1], cache) for i in range(4, 9)]
    assert len(cache) == 9
    assert torch.allclose(torch.cat(pieces, dim=1), full, atol=1e-5)


def test_dropout_is_active_in_training_and_off_in_eval():
    block = small_block(drop_rate=0.5)
    x = torch.randn(2, 6, 32)
    assert torch.equal(block(x), block(x))
    block.train()
    assert not torch.equal(block(x), block(x))


def test_may_attend_reaches_the_attention_layer():
    """forward(x, kv_cache, may_attend) hands may_attend to the attention (notebook 05, section 8): a rule where each
    token sees only itself makes the attention output its own value, position by position."""
    block = small_block()
    x = torch.randn(2, 5, 32)
    alone = torch.eye(5, dtype=torch.bool)
    together = block(x, None, alone)
    assert torch.allclose(together[:, 3:4], block(x[:, 3:4]), atol=1e-5)  # as if each token were alone
    assert not torch.allclose(block(x)[:, 3:4], together[:, 3:4], atol=1e-3)  # causal: it reads tokens 0..2 too
    assert torch.allclose(block(x, None, torch.ones(5, 5, dtype=torch.bool).tril()), block(x), atol=1e-5)


# --- bad arguments ------------------------------------------------------------------------------------------------
# Issue 29: the block checks nothing (GPTModel checks its config and its token ids at its door); what reaches it
# directly still fails loudly, in PyTorch or Python.

def test_a_dict_config_fails_loudly():
    # was: "cfg must be a GPTConfig, got dict"; GPTModel(cfg) still says it (test_model.py)
    with pytest.raises(AttributeError, match=re.escape("'dict' object has no attribute 'emb_dim'")):
        TransformerBlock({"emb_dim": 768})


def test_bad_inputs_fail_loudly_in_the_layers():
    block = small_block()
    with pytest.raises(RuntimeError, match=re.escape("Given normalized_shape=[32], expected input with shape [*, 32], "
                                                     "but got input of size[2, 4, 16]")):
        block(torch.randn(2, 4, 16))  # norm1 is the first to meet x
    with pytest.raises(TypeError, match=re.escape("list.append() takes exactly one argument (2 given)")):
        block(torch.randn(1, 3, 32), [])  # a list is not a KVCache
    # was also: 17 tokens > context_length 16. SDPA's causal flag needs no mask table, so the block computes them;
    # GPTModel refuses more tokens than positions (test_model.py, test_bad_token_ids_are_refused_at_the_model_door).

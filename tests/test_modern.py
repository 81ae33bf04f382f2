"""course_lib.modern (notebook 16, from GPT-2 to a modern LLM) against its references, offline and on random
weights: RMSNorm, rotary, SwiGLU and grouped-query attention against Hugging Face's Llama pieces; load_modern of
random LlamaForCausalLM and Qwen3ForCausalLM checkpoints (logits, greedy tokens, attention patterns, left-padded
batches); every switch at GPT-2 against GPTModel; Muon against torch.optim.Muon and AdamW; kv_cache_bytes against
the bytes the caches hold; and the errors of its doors, each checked by its message."""

import json
import math
from dataclasses import fields

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.llama.modeling_llama import (LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding,
                                                      apply_rotary_pos_emb)

from course_lib.config import GPTConfig
from course_lib.decoding import generate_tokens, left_pad
from course_lib.generation import generate
from course_lib.interpretability import run_with_cache
from course_lib.model import GPTModel
from course_lib.modern import (GroupedQueryAttention, ModernConfig, ModernGPT, Muon, RMSNorm, Rotary, SwiGLU,
                               kv_cache_bytes, load_modern, make_muon, modern_config_from_hf, orthogonalize, rotate,
                               train_variant)
from course_lib.normalization import LayerNorm
from course_lib.training import TrainConfig

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

VOCAB = 101
# Hugging Face checkpoints, small. initializer_range 0.2 (not 0.02) gives sharp next-token choices, so 20 greedy
# tokens vary and a wrong mapping cannot hide behind a flat softmax. No bos/eos: hf.generate must not stop early.
COMMON = dict(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, rms_norm_eps=1e-6, initializer_range=0.2, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)
VARIANTS = {
    "llama": (LlamaForCausalLM, LlamaConfig, dict(COMMON, intermediate_size=128, tie_word_embeddings=False,
                                                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "llama_tied_mqa": (LlamaForCausalLM, LlamaConfig, dict(COMMON, intermediate_size=80, num_key_value_heads=1,
                                                           tie_word_embeddings=True,
                                                           rope_parameters={"rope_type": "default",
                                                                            "rope_theta": 500000.0})),
    # head_dim 16 while hidden 48 / 4 heads = 12: q_proj is 48 -> 64, o_proj 64 -> 48
    "qwen3": (Qwen3ForCausalLM, Qwen3Config, dict(COMMON, intermediate_size=96, head_dim=16, tie_word_embeddings=False,
                                                  rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
}


def hf_model(variant: str, seed: int = 0):
    model_class, config_class, config = VARIANTS[variant]
    torch.manual_seed(seed)
    hf = model_class(config_class(**config, attn_implementation="eager")).eval()
    with torch.no_grad():  # norm weights start at 1: make them differ, so that swapping two norms shows
        for p in hf.parameters():
            if p.dim() == 1:
                p.normal_(1.0, 0.3)
    return hf


@pytest.fixture(scope="module", params=list(VARIANTS))
def loaded(request, tmp_path_factory):
    """(variant, Hugging Face model, load_modern of its save_pretrained folder)."""
    hf = hf_model(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    return request.param, hf, load_modern(folder)


def ids_for(batch: int = 2, tokens: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, tokens), generator=torch.Generator().manual_seed(seed))


def small(**switches) -> ModernConfig:
    return ModernConfig(vocab_size=VOCAB, context_length=32, emb_dim=48, n_heads=4, n_layers=2, drop_rate=0.0,
                        **switches)


MODERN = dict(norm="rms", positions="rotary", ffn="swiglu", qk_norm=True, bias=False, qkv_bias=False,
              tie_weights=False)

# %% 1. RMSNorm


def test_rmsnorm_equals_llama_rmsnorm_in_float32():
    torch.manual_seed(0)
    ours, theirs = RMSNorm(48, eps=1e-6), LlamaRMSNorm(48, eps=1e-6)
    with torch.no_grad():
        theirs.weight.normal_(1.0, 0.5)
        ours.scale.copy_(theirs.weight)
    x = torch.randn(3, 7, 48) * 3 + 2  # a mean far from 0: LayerNorm would subtract it
    got, expected = ours(x), theirs(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    # the same numbers are not LayerNorm without the shift: a norm that subtracted the mean would fail above
    no_shift = LayerNorm(48, eps=1e-6)
    with torch.no_grad():
        no_shift.scale.copy_(theirs.weight)
    assert (no_shift(x) - expected).abs().max() > 0.1


def test_rmsnorm_equals_llama_rmsnorm_in_bfloat16():
    torch.manual_seed(0)
    ours, theirs = RMSNorm(48, eps=1e-6), LlamaRMSNorm(48, eps=1e-6)
    with torch.no_grad():
        theirs.weight.normal_(1.0, 0.5)
        ours.scale.copy_(theirs.weight)
    x = (torch.randn(3, 7, 48) * 300).bfloat16()  # squares overflow bfloat16's precision if summed in bfloat16
    # float32 weights, bfloat16 input: the dtype Hugging Face returns, and its numbers
    got, expected = ours(x), theirs(x)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, atol=1e-2, rtol=1e-2)
    # everything in bfloat16: bfloat16 out (the house rule), equal to Hugging Face's and close to float32's
    ours, theirs = ours.bfloat16(), theirs.bfloat16()
    got, expected = ours(x), theirs(x)
    assert got.dtype == torch.bfloat16 and expected.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, atol=1e-2, rtol=1e-2)
    exact = RMSNorm(48, eps=1e-6)
    with torch.no_grad():
        exact.scale.copy_(ours.scale.float())
    torch.testing.assert_close(got.float(), exact(x.float()), atol=3e-2, rtol=2e-2)

# %% 2. Rotary


def rotary_reference(head_dim: int, theta: float):
    config = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                         rope_parameters={"rope_type": "default", "rope_theta": theta})
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
@pytest.mark.parametrize("where", ["from_0", "from_7", "per_row"])
def test_rotary_equals_llama_rotary(where, theta):
    head_dim, tokens = 16, 9
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, tokens, head_dim), torch.randn(2, 2, tokens, head_dim)
    positions = {"from_0": torch.arange(tokens), "from_7": torch.arange(7, 7 + tokens),  # after 7 cached tokens
                 "per_row": torch.stack([torch.arange(tokens), (torch.arange(tokens) - 3).clamp(min=0)])}[where]
    cos, sin = Rotary(head_dim, theta)(positions)
    hf_positions = positions if positions.dim() == 2 else positions.expand(2, tokens)  # (batch, tokens)
    hf_cos, hf_sin = rotary_reference(head_dim, theta)(q, hf_positions)
    torch.testing.assert_close(cos.expand_as(hf_cos), hf_cos, atol=1e-6, rtol=0)
    torch.testing.assert_close(sin.expand_as(hf_sin), hf_sin, atol=1e-6, rtol=0)
    hf_q, hf_k = apply_rotary_pos_emb(q, k, hf_cos, hf_sin)
    torch.testing.assert_close(rotate(q, cos, sin), hf_q, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(rotate(k, cos, sin), hf_k, atol=1e-6, rtol=1e-6)
    if where != "from_0":  # the positions matter: rotating from 0 gives other numbers
        cos0, sin0 = Rotary(head_dim, theta)(torch.arange(tokens))
        assert (rotate(q, cos0, sin0) - hf_q).abs().max() > 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_rotary_angles_stay_float32_in_a_half_precision_model(dtype):
    # model.to(dtype) must not round the frequencies: at position 4000 a bfloat16 frequency is off by radians
    model = ModernGPT(small(**MODERN)).to(dtype)
    positions = torch.arange(4096)
    cos, sin = model.trf_blocks[0].att.rotary(positions)
    expected_cos, expected_sin = Rotary(12)(positions)
    assert cos.dtype == torch.float32
    assert torch.equal(cos, expected_cos) and torch.equal(sin, expected_sin)


TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 6e-2}  # as tests/test_dtypes.py


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=["float32", "float16", "bfloat16"])
def test_modern_gpt_keeps_the_dtype_and_matches_float64(dtype):
    cfg = ModernConfig(vocab_size=VOCAB, context_length=600, emb_dim=48, n_heads=4, n_layers=2, drop_rate=0.0,
                       **MODERN, n_kv_heads=2)
    torch.manual_seed(0)
    model = ModernGPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10)  # sharp attention: positions 500 apart must be told apart
    ids = ids_for(tokens=520)
    reference = ModernGPT(cfg).double().eval()
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected = reference(ids)
        got = model.to(dtype)(ids)
    assert got.dtype == dtype
    error = ((got.double() - expected).abs().max() / expected.abs().max()).item()
    assert error < TOLERANCE[dtype], f"{dtype}: relative error {error:.2e}"


def test_rotary_theta_changes_the_angles():
    positions = torch.arange(5, 12)
    cos_a, _ = Rotary(16, 10000.0)(positions)
    cos_b, _ = Rotary(16, 500000.0)(positions)
    assert (cos_a - cos_b).abs().max() > 1e-2  # a theta that were ignored would give the same angles

# %% 3. SwiGLU


def test_swiglu_equals_llama_mlp():
    cfg = small(ffn="swiglu", hidden_dim=80, bias=False)
    torch.manual_seed(0)
    theirs = LlamaMLP(LlamaConfig(hidden_size=48, num_attention_heads=4, intermediate_size=80, hidden_act="silu",
                                 mlp_bias=False))
    ours = SwiGLU(cfg)
    ours.fc_gate.weight.data.copy_(theirs.gate_proj.weight)
    ours.fc.weight.data.copy_(theirs.up_proj.weight)
    ours.proj.weight.data.copy_(theirs.down_proj.weight)
    assert ours.fc.bias is None and ours.fc_gate.bias is None and ours.proj.bias is None
    x = torch.randn(2, 5, 48)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=1e-6)
    # gate and value swapped is another function: the test sees which matrix is the gate
    swapped = SwiGLU(cfg)
    swapped.load_state_dict({"fc_gate.weight": theirs.up_proj.weight, "fc.weight": theirs.gate_proj.weight,
                             "proj.weight": theirs.down_proj.weight})
    assert (swapped(x) - theirs(x)).abs().max() > 1e-3


def test_swiglu_default_width_matches_gelu_parameters():
    cfg = small(ffn="swiglu")
    assert cfg.ffn_dim == 8 * 48 // 3
    assert sum(p.numel() for p in SwiGLU(cfg).parameters() if p.dim() == 2) == 3 * 48 * 128

# %% 4. Loading Llama and Qwen3: logits, greedy tokens, attention patterns


def test_load_modern_reads_the_shape(loaded):
    variant, hf, model = loaded
    c = hf.config
    cfg = model.cfg
    assert isinstance(model, ModernGPT) and not model.training
    assert (cfg.vocab_size, cfg.emb_dim, cfg.n_heads, cfg.n_layers) == (VOCAB, 48, 4, 2)
    assert cfg.kv_heads == c.num_key_value_heads < cfg.n_heads
    assert cfg.dim_per_head == (16 if variant == "qwen3" else 12)
    assert cfg.qk_norm == (variant == "qwen3")
    assert cfg.rope_theta == c.rope_parameters["rope_theta"]
    assert cfg.ffn_dim == c.intermediate_size
    assert cfg.tie_weights == c.tie_word_embeddings
    assert (model.out_head.weight is model.embedding.tok_emb.weight) == c.tie_word_embeddings


def test_load_modern_gives_hugging_faces_logits(loaded):
    _, hf, model = loaded
    ids = ids_for()
    with torch.no_grad():
        expected = hf(ids).logits
        got = model(ids)
    assert got.shape == expected.shape == (2, 12, VOCAB)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_load_modern_attention_is_hugging_faces(loaded):
    _, hf, model = loaded
    ids = ids_for()
    hidden = torch.randn(2, 12, 48, generator=torch.Generator().manual_seed(3))
    positions = torch.arange(12)
    layer = hf.model.layers[0].self_attn
    cos, sin = hf.model.rotary_emb(hidden, positions.expand(2, 12))
    causal = torch.full((12, 12), float("-inf")).triu(1)
    with torch.no_grad():
        expected, _ = layer(hidden, (cos, sin), attention_mask=causal[None, None].expand(2, 1, 12, 12))
        got = model.trf_blocks[0].att(hidden, positions)
    assert isinstance(model.trf_blocks[0].att, GroupedQueryAttention)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        expected = hf(ids, output_attentions=True).attentions
    _, cache = run_with_cache(model, ids)
    for i, pattern in enumerate(expected):
        got = cache[f"blocks.{i}.attn.pattern"]
        assert got.shape == pattern.shape == (2, 4, 12, 12)
        torch.testing.assert_close(got, pattern, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no_cache"])
def test_load_modern_greedy_tokens_equal_hugging_faces(loaded, use_cache):
    _, hf, model = loaded
    ids = ids_for(batch=2, tokens=6, seed=4)
    with torch.no_grad():
        expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False)
    got = generate(model, ids, 20, use_cache=use_cache)
    assert expected.shape == (2, 26)
    assert got.tolist() == expected.tolist()
    assert len(set(got[0, 6:].tolist())) > 3  # varied tokens: a mapping error would show


# %% 5. Left-padded batches


def test_left_padded_batch_generates_what_each_prompt_generates_alone(loaded):
    _, _, model = loaded
    prompts = [[5, 6, 7, 8, 9, 10, 11], [40, 41, 42], [77]]
    ids, mask = left_pad(prompts, pad_id=0)
    batch = generate_tokens(model, ids, 10, attention_mask=mask)
    assert batch.shape == (3, 17)
    alone = [generate_tokens(model, torch.tensor([p]), 10)[0, -10:].tolist() for p in prompts]
    assert batch[:, -10:].tolist() == alone
    assert len({tuple(row) for row in alone}) == 3  # three different continuations: rows cannot be mixed up


def test_left_padded_logits_equal_unpadded_logits(loaded):
    _, _, model = loaded
    prompts = [[5, 6, 7, 8, 9, 10, 11], [40, 41, 42]]
    ids, mask = left_pad(prompts, pad_id=0)
    with torch.no_grad():
        padded = model(ids, attention_mask=mask)
        short = model(torch.tensor([prompts[1]]))
    torch.testing.assert_close(padded[1, -3:], short[0], atol=1e-5, rtol=1e-5)

# %% 6. Every switch at GPT-2 is GPT-2


def test_modern_config_defaults_are_gpt2():
    modern, gpt2 = ModernConfig(), GPTConfig()
    for field in fields(GPTConfig):
        assert getattr(modern, field.name) == getattr(gpt2, field.name), field.name
    assert (modern.norm, modern.positions, modern.ffn, modern.qk_norm, modern.bias) == (
        "layer", "learned", "gelu", False, True)
    assert (modern.kv_heads, modern.dim_per_head, modern.ffn_dim) == (12, 64, 3072)
    assert isinstance(modern, GPTConfig)


@pytest.mark.parametrize("shape", [dict(), dict(tie_weights=False, qkv_bias=False)], ids=["gpt2", "untied_no_qkv_bias"])
def test_modern_gpt_with_gpt2_switches_loads_gpt_model(shape):
    kw = dict(vocab_size=VOCAB, context_length=32, emb_dim=48, n_heads=4, n_layers=2, drop_rate=0.0, **shape)
    torch.manual_seed(0)
    gpt = GPTModel(GPTConfig(**kw)).eval()
    with torch.no_grad():  # LayerNorm scales and shifts away from 1 and 0, so a misplaced norm shows
        for p in gpt.parameters():
            if p.dim() == 1:
                p.normal_(0.5, 0.3)
    modern = ModernGPT(ModernConfig(**kw)).eval()
    assert set(modern.state_dict()) == set(gpt.state_dict())
    modern.load_state_dict(gpt.state_dict(), strict=True)
    ids = ids_for()
    with torch.no_grad():
        torch.testing.assert_close(modern(ids), gpt(ids), atol=1e-6, rtol=1e-6)
        prompts = [[5, 6, 7, 8, 9], [40, 41]]
        padded, mask = left_pad(prompts, pad_id=0)
        torch.testing.assert_close(modern(padded, attention_mask=mask), gpt(padded, attention_mask=mask),
                                   atol=1e-6, rtol=1e-6)
    assert generate(modern, ids, 8).tolist() == generate(gpt, ids, 8).tolist()

# %% 7. Muon


def grads_for(shape, steps: int = 3):
    generator = torch.Generator().manual_seed(7)
    return [torch.randn(*shape, generator=generator) for _ in range(steps)]


@pytest.mark.parametrize("shape", [(16, 40), (40, 16)], ids=["wide", "tall"])
def test_muon_group_equals_torch_muon(shape):
    torch.manual_seed(0)
    start = torch.randn(*shape)
    ours_p, ref_p = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    ours = Muon([{"params": [ours_p], "muon": True}], lr=0.02, weight_decay=0.1)
    ref = torch.optim.Muon([ref_p], lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True,
                           adjust_lr_fn="match_rms_adamw")
    for grad in grads_for(shape):
        ours_p.grad, ref_p.grad = grad.clone(), grad.clone()
        ours.step()
        ref.step()
        assert torch.equal(ours_p, ref_p)
    assert (ours_p - start).abs().max() > 1e-2  # it moved


def test_muon_other_groups_equal_adamw():
    torch.manual_seed(0)
    w, b = torch.randn(12, 20), torch.randn(20)
    ours_w, ours_b, ref_w, ref_b = (torch.nn.Parameter(t.clone()) for t in (w, b, w, b))
    idle = torch.nn.Parameter(torch.zeros(2, 2))  # a Muon group is required; without a gradient it is skipped
    ours = Muon([{"params": [idle], "muon": True}, {"params": [ours_w]}, {"params": [ours_b], "weight_decay": 0.0}],
                lr=0.01, weight_decay=0.1)
    ref = torch.optim.AdamW([{"params": [ref_w]}, {"params": [ref_b], "weight_decay": 0.0}], lr=0.01,
                            betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, foreach=False)
    for gw, gb in zip(grads_for(w.shape), grads_for(b.shape)):
        ours_w.grad, ref_w.grad, ours_b.grad, ref_b.grad = gw.clone(), gw.clone(), gb.clone(), gb.clone()
        ours.step()
        ref.step()
        assert torch.equal(ours_w, ref_w) and torch.equal(ours_b, ref_b)
    assert (ours_w - w).abs().max() > 1e-2


@pytest.mark.parametrize("switches", [dict(), dict(MODERN, n_kv_heads=2)], ids=["gpt2", "modern"])
def test_make_muon_puts_the_block_matrices_under_muon(switches):
    torch.manual_seed(0)
    model = ModernGPT(small(**switches))
    opt = make_muon(model, TrainConfig(max_lr=3e-3, weight_decay=0.05))
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [{names[id(p)] for p in g["params"]} for g in opt.param_groups]
    block_matrices = {n for n, p in model.named_parameters() if n.startswith("trf_blocks.") and p.dim() == 2}
    assert [g["muon"] for g in opt.param_groups] == [True, False, False]
    assert groups[0] == block_matrices
    assert "embedding.tok_emb.weight" in groups[1] and "final_norm.scale" in groups[2]
    if switches:
        assert "out_head.weight" in groups[1] and "trf_blocks.0.att.q_norm.scale" in groups[2]
    else:
        assert "embedding.pos_emb.weight" in groups[1] and "trf_blocks.0.att.W_query.bias" in groups[2]
    assert set().union(*groups) == set(names.values()) and sum(map(len, groups)) == len(names)  # each once
    assert all(p.dim() >= 2 for p in opt.param_groups[1]["params"])
    assert all(p.dim() < 2 for p in opt.param_groups[2]["params"])
    assert [g["weight_decay"] for g in opt.param_groups] == [0.05, 0.05, 0.0]
    assert all(g["lr"] == 3e-3 for g in opt.param_groups)


@pytest.mark.parametrize("shape", [(32, 64), (64, 32), (48, 48)])
def test_orthogonalize_pushes_singular_values_towards_one(shape):
    generator = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(shape[0], min(shape), generator=generator))  # random singular vectors
    v, _ = torch.linalg.qr(torch.randn(shape[1], min(shape), generator=generator))
    matrix = u @ torch.diag(5 * torch.logspace(0, -1.5, min(shape))) @ v.T  # singular values 5 .. 0.16
    out = orthogonalize(matrix)
    assert out.shape == matrix.shape
    singular = torch.linalg.svdvals(out.float())
    assert singular.min() > 0.5 and singular.max() < 1.5, singular
    # and the singular vectors stay: out is close to U V^T
    polar = u @ v.T
    cosine = (out.float() * polar).sum() / (out.float().norm() * polar.norm())
    assert cosine > 0.95

# %% 8. kv_cache_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_kv_cache_bytes_is_what_the_caches_hold(n_kv_heads, dtype):
    cfg = small(**MODERN, n_kv_heads=n_kv_heads, head_dim=16)  # head_dim 16, not 48 / 4
    torch.manual_seed(0)
    model = ModernGPT(cfg).to(dtype)
    caches = model.new_kv_caches()
    with torch.no_grad():
        model(ids_for(batch=3, tokens=10), kv_caches=caches)
    held = sum(c.keys.nbytes + c.values.nbytes for c in caches)
    assert kv_cache_bytes(cfg, 10, batch=3, bytes_per_number=dtype.itemsize) == held
    assert held == 2 * 2 * 3 * 10 * n_kv_heads * 16 * dtype.itemsize


def test_kv_cache_bytes_halves_with_the_kv_heads():
    sizes = [kv_cache_bytes(small(**MODERN, n_kv_heads=k), 100, batch=2) for k in (4, 2, 1)]
    assert sizes[0] == 2 * sizes[1] == 4 * sizes[2]
    assert kv_cache_bytes(ModernConfig(), 1024) == 2 * 12 * 1024 * 12 * 64 * 2  # GPT-2: 36 MiB per sequence

# %% 9. Doors


@pytest.mark.parametrize("kwargs, error, fragment", [
    (dict(norm="batch"), ValueError, "norm must be one of"),
    (dict(positions="alibi"), ValueError, "positions must be one of"),
    (dict(ffn="relu"), ValueError, "ffn must be one of"),
    (dict(n_kv_heads=3), ValueError, "n_kv_heads 3 does not divide n_heads 4"),
    (dict(positions="rotary", head_dim=15), ValueError, "head_dim 15 is odd"),
    (dict(positions="rotary", emb_dim=36), ValueError, "head_dim 9 is odd"),  # 36 / 4 = 9 per head
    (dict(n_kv_heads=8), ValueError, "n_kv_heads 8 does not divide n_heads 4"),  # more kv heads than heads
    (dict(hidden_dim=100), ValueError, "hidden_dim 100 with ffn 'gelu'"),
    (dict(n_kv_heads=0), ValueError, "n_kv_heads"),
    (dict(head_dim=0), ValueError, "head_dim"),
    (dict(hidden_dim=0, ffn="swiglu"), ValueError, "hidden_dim"),
    (dict(rope_theta=0.5), ValueError, "rope_theta"),
    (dict(norm_eps=0.0), ValueError, "norm_eps"),
    (dict(qk_norm="yes"), TypeError, "qk_norm"),
    (dict(bias=1), TypeError, "bias"),
], ids=lambda v: str(v) if isinstance(v, dict) else None)
def test_modern_config_rejects(kwargs, error, fragment):
    kw = dict(vocab_size=VOCAB, context_length=32, emb_dim=48, n_heads=4, n_layers=2)
    with pytest.raises(error, match=fragment):
        ModernConfig(**(kw | kwargs))


def test_modern_gpt_rejects_a_gpt_config():
    with pytest.raises(TypeError, match="cfg must be a ModernConfig, got GPTConfig"):
        ModernGPT(GPTConfig(vocab_size=VOCAB, context_length=32, emb_dim=48, n_heads=4, n_layers=2))


@pytest.fixture(scope="module")
def llama_files(tmp_path_factory):
    """The config.json (a dict) and weights of a small random Llama, to edit into checkpoints it cannot read."""
    folder = tmp_path_factory.mktemp("llama_files")
    hf_model("llama").save_pretrained(folder)
    return json.loads((folder / "config.json").read_text()), (folder / "model.safetensors").read_bytes()


def checkpoint(folder, config: dict, weights: bytes):
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(weights)
    return folder


@pytest.mark.parametrize("edit, fragment", [
    (dict(model_type="gpt2"), "model_type 'gpt2'"),
    (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}), "rope_type 'llama3'"),
    (dict(rope_parameters=None, rope_theta=500000.0,  # a file written by transformers 4
          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}), "rope_type 'llama3'"),
    (dict(rope_parameters=None, rope_scaling={"type": "linear", "factor": 2.0}), "rope_type 'linear'"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(mlp_bias=True), "mlp_bias"),
    (dict(hidden_act="gelu"), "hidden_act 'gelu'"),
    (dict(model_type="qwen3", use_sliding_window=True), "sliding"),
], ids=["gpt2", "rope_llama3", "rope_scaling_v4", "rope_linear", "attention_bias", "mlp_bias", "gelu",
        "sliding_window"])
def test_load_modern_rejects_what_it_does_not_build(tmp_path, llama_files, edit, fragment):
    config, weights = llama_files
    folder = checkpoint(tmp_path, config | edit, weights)
    with pytest.raises(ValueError, match=fragment):
        load_modern(folder)
    with pytest.raises(ValueError, match=fragment):
        modern_config_from_hf(config | edit)


def test_load_modern_reads_a_transformers_4_config(tmp_path, llama_files):
    config, weights = llama_files
    old = {k: v for k, v in config.items() if k != "rope_parameters"} | dict(rope_theta=250000.0, rope_scaling=None)
    model = load_modern(checkpoint(tmp_path, old, weights))
    assert model.cfg.rope_theta == 250000.0


def test_load_modern_names_missing_and_unexpected_tensors(tmp_path, llama_files):
    config, weights = llama_files
    folder = checkpoint(tmp_path, config, weights)
    state = load_file(folder / "model.safetensors")
    state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(48)
    del state["model.norm.weight"]
    save_file(state, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]") as error:
        load_modern(folder)
    assert "['model.layers.0.self_attn.q_proj.bias']" in str(error.value)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_load_modern_refuses_non_finite_weights_naming_the_tensor(tmp_path, llama_files, value):
    """As notebook 10's load_gpt2: a NaN or infinite weight is refused at the loader, named, before a model is built."""
    config, weights = llama_files
    folder = checkpoint(tmp_path, config, weights)
    state = load_file(folder / "model.safetensors")
    state["model.layers.1.mlp.down_proj.weight"][0, 0] = value
    save_file(state, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.down_proj.weight holds NaN or infinite values"):
        load_modern(folder)


def test_load_modern_names_gpt2s_loader(tmp_path):
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=16)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="model_type 'gpt2'.*load_gpt2"):
        load_modern(tmp_path)


def test_modern_config_from_hf_names_a_missing_key(llama_files):
    config, _ = llama_files
    with pytest.raises(ValueError, match="no 'intermediate_size'"):
        modern_config_from_hf({k: v for k, v in config.items() if k != "intermediate_size"})


def test_modern_config_from_hf_rejects_a_non_dict():
    with pytest.raises(TypeError, match="hf must be a dict"):
        modern_config_from_hf("config.json")


def test_load_modern_names_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json does not exist"):
        load_modern(tmp_path)


def test_muon_rejects_a_vector_in_a_muon_group():
    with pytest.raises(ValueError, match="not a matrix"):
        Muon([{"params": [torch.nn.Parameter(torch.zeros(5))], "muon": True}], lr=0.01)


def test_train_variant_rejects_an_unknown_optimizer():
    with pytest.raises(ValueError, match="optimizer must be 'adamw' or 'muon', got 'sgd'"):
        train_variant(small(), torch.zeros(100, dtype=torch.long), torch.zeros(100, dtype=torch.long), TrainConfig(),
                      optimizer="sgd")


def test_kv_cache_bytes_rejects_a_gpt_config():
    with pytest.raises(TypeError, match="cfg must be a ModernConfig"):
        kv_cache_bytes(GPTConfig(), 10)


# %% Added after the review of issue 34: the pattern hook, Muon's groups and closure, a tied head stored twice


@pytest.mark.parametrize("kind", ["gpt2", "modern"])
def test_the_pattern_hook_refuses_a_cache_or_a_padding_mask(kind):
    """attention_weights sees only x: under a cache or a mask it would record a pattern the layer did not use."""
    from course_lib.interpretability import hooked
    torch.manual_seed(0)
    cfg = small(**(MODERN if kind == "modern" else {}))
    model = (ModernGPT(cfg) if kind == "modern" else GPTModel(GPTConfig(**{f.name: getattr(cfg, f.name)
                                                                          for f in fields(GPTConfig)}))).eval()
    ids, mask = left_pad([[1, 2, 3], [4, 5]], pad_id=0)
    for call in (lambda: model(ids, attention_mask=mask), lambda: model(ids[:, :2], kv_caches=model.new_kv_caches())):
        with hooked(model, ["blocks.0.attn.pattern"], lambda name, a: a), torch.no_grad():
            with pytest.raises(ValueError, match="KV cache or a padding mask"):
                call()
    with hooked(model, ["blocks.0.attn.pattern"], lambda name, a: a), torch.no_grad():
        model(ids)  # a plain pass is recorded as before


def test_muon_refuses_groups_without_a_muon_group():
    params = [torch.nn.Parameter(torch.zeros(3, 4))]
    with pytest.raises(ValueError, match="at least one of them with muon=True"):
        Muon([{"params": params}], lr=0.01)
    with pytest.raises(ValueError, match="list of parameter groups"):
        Muon(params, lr=0.01)


def test_muon_step_calls_and_returns_the_closure():
    weight = torch.nn.Parameter(torch.randn(4, 6))
    optimizer = Muon([{"params": [weight], "muon": True}], lr=0.01)

    def closure():
        optimizer.zero_grad()
        loss = (weight ** 2).sum()
        loss.backward()
        return loss

    before = weight.detach().clone()
    loss = optimizer.step(closure)
    assert torch.equal(loss, (before ** 2).sum()) and not torch.equal(weight, before)


def test_load_modern_takes_a_tied_head_stored_twice_only_when_equal(tmp_path):
    hf = hf_model("llama_tied_mqa")
    hf.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, tmp_path / "model.safetensors")
    ids = ids_for()
    with torch.no_grad():
        assert (load_modern(tmp_path)(ids) - hf(ids).logits).abs().max() < 1e-5
    state["lm_head.weight"] = state["lm_head.weight"] + 1
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="tie_word_embeddings, but lm_head.weight differs from the embedding"):
        load_modern(tmp_path)


def test_modern_gpt_shares_gpt_models_new_kv_caches():
    """ModernGPT and ModernBlock extend the GPT-2 classes: the forward and new_kv_caches are GPTModel's, inherited,
    and the modern classes override only the methods that build the parts (and the block's attention call)."""
    from course_lib import modern
    from course_lib.block import TransformerBlock
    assert issubclass(ModernGPT, GPTModel) and issubclass(modern.ModernBlock, TransformerBlock)
    assert {"forward", "new_kv_caches"}.isdisjoint(vars(ModernGPT))
    assert ModernGPT.forward is GPTModel.forward and ModernGPT.new_kv_caches is GPTModel.new_kv_caches
    caches = ModernGPT(small()).new_kv_caches()
    assert len(caches) == 2 and all(len(cache) == 0 for cache in caches)


# %% On a GPU (skipped without one): the same model, loader, generation and optimizer on CUDA

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@CUDA
@pytest.mark.parametrize("variant", ["llama", "qwen3"])
def test_cuda_load_modern_equals_hugging_face_and_generates_its_tokens(tmp_path, variant):
    hf = hf_model(variant)
    hf.save_pretrained(tmp_path)
    hf = hf.to("cuda")
    model = load_modern(tmp_path, device="cuda")
    assert model.out_head.weight.is_cuda
    ids = ids_for().to("cuda")
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() < 1e-4
    prompt = ids[:1, :5]
    assert torch.equal(generate(model, prompt, 20), hf.generate(prompt, max_new_tokens=20, do_sample=False))
    half = model.to(torch.bfloat16)
    with torch.no_grad():
        assert half(ids).dtype == torch.bfloat16


@CUDA
def test_cuda_left_padding_and_muon():
    torch.manual_seed(0)
    model = ModernGPT(small(**MODERN, n_kv_heads=2)).to("cuda").eval()
    prompts = [[1, 2, 3, 4], [5, 6]]
    ids, mask = left_pad(prompts, pad_id=0, device="cuda")
    batched = generate_tokens(model, ids, 8, attention_mask=mask)[:, ids.shape[1]:]
    for row, prompt in zip(batched, prompts):
        assert torch.equal(row, generate_tokens(model, torch.tensor([prompt], device="cuda"), 8)[0, len(prompt):])
    weight = torch.randn(16, 40, device="cuda")
    ours, theirs = torch.nn.Parameter(weight.clone()), torch.nn.Parameter(weight.clone())
    mine = Muon([{"params": [ours], "muon": True}], lr=0.01)
    reference = torch.optim.Muon([theirs], lr=0.01, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for grad in grads_for((16, 40)):
        ours.grad, theirs.grad = grad.to("cuda"), grad.to("cuda").clone()
        mine.step()
        reference.step()
    assert torch.allclose(ours, theirs, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_train_variant_is_reproducible_and_learns(optimizer):
    """The ablation's unit: the same seed gives the same model and loss; training lowers the loss from ln(vocab)."""
    data = torch.randint(0, 20, (2000,), generator=torch.Generator().manual_seed(0)) % 7  # ids 0..6 of 20: ln 7 < ln 20
    tcfg = TrainConfig(total_steps=30, batch_size=4, max_lr=1e-2, min_lr=1e-3, warmup_steps=3, eval_every=30,
                       eval_batches=1)
    cfg = ModernConfig(vocab_size=20, context_length=16, emb_dim=32, n_heads=4, n_layers=1, drop_rate=0.0, **MODERN)
    runs = [train_variant(cfg, data[:1500], data[1500:], tcfg, seed=3, optimizer=optimizer, val_batches=2)
            for _ in range(2)]
    (first, a), (second, b) = runs
    assert a["val_loss"] == b["val_loss"] and all(torch.equal(p, q) for p, q in zip(first.parameters(),
                                                                                  second.parameters()))
    assert a["val_loss"] < math.log(20) - 0.5 and a["parameters"] == sum(p.numel() for p in first.parameters())


@pytest.mark.parametrize("variant", ["llama", "qwen3"])
def test_transformer_lens_reads_the_same_folder_and_records_the_same_patterns(tmp_path, variant):
    """TransformerLens 4 wraps Hugging Face's Llama and Qwen3 classes, not ours: booted from the same folder, its bridge
    gives ModernGPT's logits, and its hook_pattern equals the pattern the course's hooks record."""
    from transformer_lens.model_bridge import TransformerBridge

    from course_lib.interpretability import hf_tokenizer_for
    from course_lib.tokenization import CharTokenizer
    hf_model(variant).save_pretrained(tmp_path)
    ours = load_modern(tmp_path)
    chars = CharTokenizer([chr(c) for c in range(32, 127)] + list("\n\téàüç"))  # one per id: 95 + 6 = VOCAB
    bridge = TransformerBridge.boot_transformers(str(tmp_path), device="cpu", tokenizer=hf_tokenizer_for(chars)).eval()
    ids = ids_for(batch=1)
    with torch.no_grad():
        logits, theirs = bridge.run_with_cache(ids)
        assert (logits - ours(ids)).abs().max() < 1e-5
    _, mine = run_with_cache(ours, ids)
    for i in range(ours.cfg.n_layers):
        assert (theirs[f"blocks.{i}.attn.hook_pattern"] - mine[f"blocks.{i}.attn.pattern"]).abs().max() < 1e-5


def test_load_modern_names_an_unreadable_config_or_weights_file(tmp_path, llama_files):
    """notebook 10's reader, shared: the file that cannot be read is named, with the fix."""
    config, weights = llama_files
    folder = checkpoint(tmp_path, config, weights[: len(weights) // 2])  # a truncated download
    with pytest.raises(ValueError, match=r"model.safetensors is not a readable safetensors file .*truncated"):
        load_modern(folder)
    (folder / "config.json").write_text("{oops")
    with pytest.raises(ValueError, match=r"config.json is not valid JSON"):
        load_modern(folder)


def test_graphed_greedy_decoder_refuses_a_modern_model_with_a_clear_error():
    """ModernGPT is a GPTModel, so the type check alone lets it in; the fixed-shape step feeds GPT-2's blocks only."""
    from course_lib.generation import GraphedGreedyDecoder
    model = ModernGPT(ModernConfig(vocab_size=32, context_length=16, emb_dim=16, n_heads=2, n_layers=1,
                                   drop_rate=0.0, positions="rotary"))
    with pytest.raises(TypeError, match=r"GroupedQueryAttention \(notebooks 16 and 17\): decode it with generate\(\)"):
        GraphedGreedyDecoder(model, capacity=8)

"""course_lib.long_context (notebook 17, long context and local attention) against its references, offline and on
random weights: ScaledRotary's stretched speeds against transformers' ROPE_INIT_FUNCTIONS (linear, llama3, yarn);
load_long of random Llama 3.2-style, Llama-YaRN, Mistral, Gemma 2 and Gemma 3 checkpoints (logits, greedy tokens,
token-by-token stepping through the ring caches, Hugging Face's own cache); the ring cache's flat memory, prefill,
crop and beam reordering; LongConfig's defaults as notebook 16's network; the window mask and the hooks' pattern;
left padding through a window; the dtype; and the errors of its doors, each checked by its message."""

import json
import math
from dataclasses import fields

import pytest
import torch
import transformers
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen3Config, Qwen3ForCausalLM)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from course_lib.attention import KVCache
from course_lib.decoding import beam_search, generate_tokens, left_pad, speculative_generate
from course_lib.generation import generate
from course_lib.interpretability import run_with_cache
from course_lib.long_context import (LongConfig, LongGPT, RingKVCache, ScaledRotary, hf_layer_types, llama3_inv_freq,
                                     load_long, ring_cache_bytes, window_may_attend, yarn_attention_factor)
from course_lib.modern import ModernConfig, ModernGPT, load_modern

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

VOCAB, WINDOW, TOKENS, NEW = 101, 8, 40, 30  # 40 tokens: past the window (8) and every original context (16, 32)


def report(name: str, value: float) -> None:
    """The worst difference of an equality, shown with `pytest -s`."""
    print(f"\n[worst difference] {name}: {value:.3g}")


# %% 1. The stretched rotation speeds against transformers


def hf_inv_freq(rope: dict, head_dim: int):
    """transformers' (inv_freq, attention_factor) for these rope_parameters and head_dim."""
    config = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim, rope_parameters=rope,
                         max_position_embeddings=4 * rope.get("original_max_position_embeddings", 64))
    return ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, None)


def long_rope(rope: dict) -> LongConfig:
    """The LongConfig with the same rope_parameters (a small rotary model around them)."""
    return LongConfig(vocab_size=VOCAB, context_length=64, emb_dim=64, n_heads=4, n_layers=1, norm="rms",
                      positions="rotary", ffn="swiglu", rope_theta=rope["rope_theta"], rope_type=rope["rope_type"],
                      rope_factor=rope["factor"], original_context=rope.get("original_max_position_embeddings"),
                      low_freq_factor=rope.get("low_freq_factor", 1.0),
                      high_freq_factor=rope.get("high_freq_factor", 4.0),
                      beta_fast=rope.get("beta_fast", 32.0), beta_slow=rope.get("beta_slow", 1.0),
                      attention_factor=rope.get("attention_factor"))


ROPES = {
    "llama3_2": (64, dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=8192)),  # Llama 3.2's numbers
    "llama3_other": (32, dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=2.0,
                              high_freq_factor=6.0, original_max_position_embeddings=256)),
    "yarn": (64, dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=32)),
    "yarn_other": (32, dict(rope_type="yarn", rope_theta=1e6, factor=16.0, original_max_position_embeddings=4096,
                            beta_fast=16.0, beta_slow=2.0)),
    "yarn_attention_factor": (64, dict(rope_type="yarn", rope_theta=10000.0, factor=8.0,
                                       original_max_position_embeddings=128, attention_factor=1.5)),
    "linear": (64, dict(rope_type="linear", rope_theta=10000.0, factor=8.0)),
}


@pytest.mark.parametrize("name", list(ROPES))
def test_scaled_rotary_speeds_equal_transformers(name):
    """inv_freq() within rtol 1e-6 of ROPE_INIT_FUNCTIONS (it is in fact bitwise equal, see the report), and YaRN's
    attention factor, the default 0.1 ln(factor) + 1 or an explicit one, equal to transformers'."""
    head_dim, rope = ROPES[name]
    cfg = long_rope(rope)
    ours = ScaledRotary(head_dim, rope["rope_theta"], cfg).inv_freq()
    theirs, attention_factor = hf_inv_freq(rope, head_dim)
    report(f"inv_freq {name} (relative)", ((ours - theirs).abs() / theirs).max().item())
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-6, atol=0)
    unscaled = ScaledRotary(head_dim, rope["rope_theta"], LongConfig()).inv_freq()
    assert not torch.allclose(ours, unscaled)  # a stretch that were ignored would fail here
    if rope["rope_type"] == "yarn":
        assert yarn_attention_factor(cfg) == pytest.approx(attention_factor, rel=1e-12)
        cos, _ = ScaledRotary(head_dim, rope["rope_theta"], cfg)(torch.zeros(1))
        assert torch.allclose(cos, torch.full_like(cos, attention_factor))  # cos(0) = 1, times the factor
    if name == "yarn_attention_factor":
        assert attention_factor == 1.5


@pytest.mark.parametrize("name", ["llama3_2", "llama3_other"])
def test_llama3_keeps_fast_pairs_and_divides_slow_ones_exactly(name):
    head_dim, rope = ROPES[name]
    cfg = long_rope(rope)
    plain = ScaledRotary(head_dim, rope["rope_theta"], LongConfig()).inv_freq()
    stretched = llama3_inv_freq(plain, cfg)
    turns = cfg.original_context * plain / (2 * math.pi)
    slow, fast = turns < cfg.low_freq_factor, turns > cfg.high_freq_factor
    assert slow.any() and fast.any() and (~slow & ~fast).any()  # all three regimes present
    assert torch.equal(stretched[slow], plain[slow] / cfg.rope_factor)
    assert torch.equal(stretched[fast], plain[fast])
    between = ~slow & ~fast
    assert ((stretched[between] < plain[between]) & (stretched[between] > plain[between] / cfg.rope_factor)).all()


# %% 2. load_long against transformers

# initializer_range 0.15: logits of std about 1.3, greedy tokens that vary, and float32 noise between a cached and an
# uncached forward about 7e-6 (at 0.2 it reaches 1.5e-5, in transformers' own cache stepping too). Gemma untied:
# with a tied head and sqrt(emb_dim) on the embedding these random models only repeat the last token.
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, rms_norm_eps=1e-6, initializer_range=0.15, max_position_embeddings=128,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)
CASES = {
    # Llama 3.2's layout: llama3 rope, tied head; 40 tokens run past original_max_position_embeddings 16
    "llama3_2": (LlamaForCausalLM, lambda: LlamaConfig(**COMMON, tie_word_embeddings=True, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16))),
    "llama_yarn": (LlamaForCausalLM, lambda: LlamaConfig(**COMMON, rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16))),
    "mistral": (MistralForCausalLM, lambda: MistralConfig(**COMMON, sliding_window=WINDOW)),
    # local and global layers alternating; scores scaled by 24 ** -0.5 with head_dim 16; both soft caps
    "gemma2": (Gemma2ForCausalLM, lambda: Gemma2Config(
        **COMMON, head_dim=16, tie_word_embeddings=False, sliding_window=WINDOW, query_pre_attn_scalar=24,
        attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
    # sliding_window_pattern 2: local, global; linear scaling on the global layers only; q and k norms
    "gemma3": (Gemma3ForCausalLM, lambda: Gemma3TextConfig(
        **COMMON, head_dim=16, tie_word_embeddings=False, sliding_window=WINDOW, query_pre_attn_scalar=24,
        sliding_window_pattern=2, rope_parameters={
            "full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1e6),
            "sliding_attention": dict(rope_type="default", rope_theta=10000.0)})),
    # Qwen3 with its sliding window switched on from layer max_window_layers = 1: global, local
    "qwen3_sliding": (Qwen3ForCausalLM, lambda: Qwen3Config(
        **COMMON, head_dim=16, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
}


def hf_model(name: str):
    model_class, make_config = CASES[name]
    config = make_config()
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = model_class(config).eval()
    with torch.no_grad():  # norm weights away from their start, so a swapped norm or a missed 1 + w shows
        for p_name, p in hf.named_parameters():
            if "norm" in p_name:
                p.normal_(0.0 if name.startswith("gemma") else 1.0, 0.3)
    return hf


BUILT = {}  # name -> (name, Hugging Face model, load_long of its folder, the folder): each built once per run
WINDOWED = ["mistral", "gemma2", "gemma3", "qwen3_sliding"]  # the checkpoints with sliding-window layers


def built(name: str, tmp_path_factory):
    if name not in BUILT:
        hf = hf_model(name)
        folder = tmp_path_factory.mktemp(name)
        hf.save_pretrained(folder)
        BUILT[name] = name, hf, load_long(folder), folder
    return BUILT[name]


@pytest.fixture(scope="module", params=list(CASES))
def loaded(request, tmp_path_factory):
    """(name, Hugging Face model, load_long of its save_pretrained folder, the folder)."""
    return built(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=WINDOWED)
def windowed(request, tmp_path_factory):
    """The same, for the checkpoints with local layers only."""
    return built(request.param, tmp_path_factory)


def ids_for(batch: int = 2, tokens: int = TOKENS, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, tokens), generator=torch.Generator().manual_seed(seed))


def test_load_long_reads_each_familys_switches(loaded):
    name, hf, model, _ = loaded
    cfg = model.cfg
    expected_types = {"llama3_2": [False, False], "llama_yarn": [False, False], "mistral": [True, True],
                      "gemma2": [True, False], "gemma3": [True, False], "qwen3_sliding": [False, True]}[name]
    assert [cfg.is_local(i) for i in range(cfg.n_layers)] == expected_types
    assert [block.att.window for block in model.trf_blocks] == [WINDOW if local else None for local in expected_types]
    assert cfg.rope_type == {"llama3_2": "llama3", "llama_yarn": "yarn", "gemma3": "linear"}.get(name, "default")
    assert cfg.tie_weights == hf.config.tie_word_embeddings
    if name.startswith("gemma"):
        assert (cfg.gate_act, cfg.post_norms, cfg.embed_scale, cfg.query_scale) == ("gelu_tanh", True, True, 24)
    if name == "gemma3":
        assert cfg.qk_norm and cfg.local_rope_theta == 10000.0 and cfg.rope_theta == 1e6


def test_load_long_gives_hugging_faces_logits(loaded):
    """Logits within 1e-5 of transformers (eager) on 40 tokens, and 30 greedy tokens that are not a constant."""
    name, hf, model, _ = loaded
    ids = ids_for()
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
    report(f"logits {name}", (ours - theirs).abs().max().item())
    assert 0.3 < theirs.std().item() < 30  # O(1) logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    greedy = generate(model, ids[:, :10], NEW)[:, 10:]
    assert all(len(set(row.tolist())) >= 3 for row in greedy), greedy


def test_greedy_tokens_with_and_without_cache_equal_hugging_faces(loaded):
    """10 prompt tokens and 30 new: past the window and every original context."""
    name, hf, model, _ = loaded
    prompt = ids_for()[:, :10]
    cached = generate(model, prompt, NEW, use_cache=True)
    uncached = generate(model, prompt, NEW, use_cache=False)
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW, do_sample=False,
                         pad_token_id=0)
    assert cached.tolist() == uncached.tolist() == theirs.tolist()
    stepped = generate_tokens(model, prompt, NEW)  # notebook 11's loop
    assert stepped.tolist() == theirs.tolist()


def test_stepping_through_new_kv_caches_equals_the_uncached_forward(loaded):
    """A 3-token prefill, then one token at a time through model.new_kv_caches() (ring caches on the local layers):
    the logits of the uncached forward, and transformers' own cache stepping too."""
    name, hf, model, _ = loaded
    ids = ids_for()
    caches = model.new_kv_caches()
    assert [type(c) for c in caches] == [RingKVCache if b.att.window else KVCache for b in model.trf_blocks]
    with torch.no_grad():
        full = model(ids)
        steps = [model(ids[:, :3], kv_caches=caches)]
        steps += [model(ids[:, t:t + 1], kv_caches=caches) for t in range(3, TOKENS)]
        out = hf(ids[:, :3], use_cache=True)
        hf_steps, past = [out.logits], out.past_key_values
        for t in range(3, TOKENS):
            out = hf(ids[:, t:t + 1], past_key_values=past, use_cache=True)
            hf_steps.append(out.logits)
            past = out.past_key_values
    stepped, hf_stepped = torch.cat(steps, 1), torch.cat(hf_steps, 1)
    report(f"ring stepping {name}", (stepped - full).abs().max().item())
    report(f"ring stepping vs HF cache {name}", (stepped - hf_stepped).abs().max().item())
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=0)
    torch.testing.assert_close(stepped, hf_stepped, atol=1e-5, rtol=0)
    assert [len(c) for c in caches] == [TOKENS] * len(caches)


# %% 3. The ring cache

def small_long(**switches) -> LongConfig:
    """A small Gemma-like LongConfig: a local and a global layer by default."""
    kw = dict(vocab_size=VOCAB, context_length=64, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0, norm="rms",
              positions="rotary", ffn="swiglu", n_kv_heads=2, bias=False, qkv_bias=False, tie_weights=False,
              sliding_window=4, layer_types=("local", "global"))
    return LongConfig(**(kw | switches))


def sharp(model: torch.nn.Module, times: float = 10.0) -> torch.nn.Module:
    with torch.no_grad():  # sharper attention and logits than GPT-2's 0.02: the window's edge changes the output
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(times)
    return model.eval()


@pytest.mark.parametrize("spare", [0, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("layer_types", [("local", "global"), ("local", "local")], ids=["mixed", "all_local"])
def test_ring_memory_stays_flat_and_ring_cache_bytes_counts_it(dtype, layer_types, spare):
    cfg = small_long(layer_types=layer_types)
    torch.manual_seed(0)
    model = sharp(LongGPT(cfg)).to(dtype)
    batch, window = 3, cfg.sliding_window
    ids = ids_for(batch, 3 * window)
    caches = model.new_kv_caches(spare=spare)
    held = []
    with torch.no_grad():
        for t in range(3 * window):
            model(ids[:, t:t + 1], kv_caches=caches)
            held.append(sum(c.keys.numel() * c.keys.element_size() + c.values.numel() * c.values.element_size()
                            for c in caches))
            assert held[-1] == ring_cache_bytes(cfg, t + 1, batch, dtype.itemsize, spare), t  # all slots at once
    for cache, kind in zip(caches, layer_types):
        if kind == "local":
            slots = window + spare
            assert isinstance(cache, RingKVCache) and cache.keys.shape == (batch, 2, slots, 8)
            assert cache.values.shape == (batch, 2, slots, 8) and len(cache) == 3 * window
        else:
            assert type(cache) is KVCache and cache.keys.shape[2] == 3 * window  # the plain cache grows
    if layer_types == ("local", "local"):
        assert held[0] == held[-1]  # flat from the first token on
    else:
        assert held[-1] - held[-2] == held[-2] - held[-3] > 0  # the global layer's share grows by a token each step


def test_a_prefill_longer_than_the_window_then_steps_equals_the_uncached_forward():
    cfg = small_long()
    torch.manual_seed(0)
    model = sharp(LongGPT(cfg))
    ids = ids_for(2, 20)
    caches = model.new_kv_caches(spare=0)
    with torch.no_grad():
        full = model(ids)
        out = torch.cat([model(ids[:, :11], kv_caches=caches)]
                        + [model(ids[:, t:t + 1], kv_caches=caches) for t in range(11, 20)], 1)
        plain = ModernGPT.new_kv_caches(model)  # every layer a KVCache: no window dropped from memory
        out_plain = torch.cat([model(ids[:, :11], kv_caches=plain)]
                              + [model(ids[:, t:t + 1], kv_caches=plain) for t in range(11, 20)], 1)
    report("prefill 11 > window 4, then steps", (out - full).abs().max().item())
    torch.testing.assert_close(out, full, atol=1e-5, rtol=0)
    torch.testing.assert_close(out_plain, full, atol=1e-5, rtol=0)
    assert caches[0].keys.shape[2] == 4
    with torch.no_grad():  # the window matters: a global layer in its place gives other logits
        unwindowed = LongGPT(small_long(layer_types=("global", "global")))
        unwindowed.load_state_dict(model.state_dict())
        assert (unwindowed.eval()(ids) - full).abs().max() > 1e-2


def test_ring_crop_takes_back_at_most_its_spare_slots_and_resets_at_zero():
    """crop at or past the length forgets nothing; back by at most `spare` positions it forgets them, and the same
    tokens fed again give the same logits (the window before them is still held); further back it is refused, the
    ring unchanged; crop(0) empties it."""
    cfg = small_long()
    torch.manual_seed(0)
    model = sharp(LongGPT(cfg))
    ids = ids_for(2, 10)
    with torch.no_grad():
        exact = model.new_kv_caches(spare=0)
        first = model(ids, kv_caches=exact)
        ring = exact[0]
        for length in (10, 12):
            ring.crop(length)
            assert len(ring) == 10
        with pytest.raises(ValueError, match="cannot crop to 9: it can take back at most 0 positions"):
            ring.crop(9)
        assert len(ring) == 10
        roomy = model.new_kv_caches(spare=3)
        model(ids, kv_caches=roomy)
        for cache in roomy:
            cache.crop(7)
        again = model(ids[:, 7:], kv_caches=roomy)
        torch.testing.assert_close(again, first[:, 7:], atol=1e-5, rtol=0)
        with pytest.raises(ValueError, match="cannot crop to 6: it can take back at most 3"):
            roomy[0].crop(6)  # 10 held: back 4 > 3
        for cache in exact:
            cache.crop(0)
        assert len(ring) == 0 and ring.keys is None
        refilled = model(ids, kv_caches=exact)
    torch.testing.assert_close(refilled, first, atol=0, rtol=0)


def test_speculative_decoding_through_ring_caches_gives_the_targets_greedy_tokens(windowed):
    """speculative_generate (notebook 11) crops the target's caches after every rejected draft: through ring caches
    with new_kv_caches' spare slots, at temperature 0 it returns the target's greedy tokens."""
    _, _, model, _ = windowed
    torch.manual_seed(7)  # a small random draft: it disagrees with the target, so drafts are rejected
    draft = LongGPT(LongConfig(vocab_size=VOCAB, context_length=128, emb_dim=32, n_heads=2, n_layers=1,
                               positions="rotary", drop_rate=0.0)).eval()
    prompt = ids_for(1, 6, seed=5)
    result = speculative_generate(model, draft, prompt, 24, num_draft=4)
    assert torch.equal(result.tokens, generate(model, prompt, 24))
    assert result.drafted > result.accepted  # drafts were rejected: the rings were cropped back


HUB_FORMS = {  # config.json as files written before transformers 5 listed layer_types
    "gemma2": (Gemma2Config, dict(model_type="gemma2", num_hidden_layers=6, sliding_window=8)),
    "gemma3_text": (Gemma3TextConfig, dict(model_type="gemma3_text", num_hidden_layers=13, sliding_window=8,
                                           sliding_window_pattern=6)),
    "qwen3": (Qwen3Config, dict(model_type="qwen3", num_hidden_layers=5, sliding_window=8, use_sliding_window=True,
                                max_window_layers=2)),
    "qwen3_off": (Qwen3Config, dict(model_type="qwen3", num_hidden_layers=5, sliding_window=4096,
                                    use_sliding_window=False, max_window_layers=2)),
    "mistral": (MistralConfig, dict(model_type="mistral", num_hidden_layers=3, sliding_window=8)),
}


@pytest.mark.parametrize("name", list(HUB_FORMS))
def test_hf_layer_types_of_older_files_are_what_transformers_derives(name):
    config_class, hub = HUB_FORMS[name]
    theirs = config_class(**{k: v for k, v in hub.items() if k != "model_type"}, hidden_size=64,
                          num_attention_heads=4, head_dim=16)
    theirs_types = getattr(theirs, "layer_types", None)
    if theirs_types is None:  # Mistral's config lists none: every layer slides when there is a window
        theirs_types = ["sliding_attention"] * hub["num_hidden_layers"]
    expected = tuple("local" if t == "sliding_attention" else "global" for t in theirs_types)
    ours = hf_layer_types(hub)
    assert ours == (expected if "local" in expected else None), (ours, expected)
    assert hf_layer_types(hub | {"layer_types": list(theirs_types)}) == ours  # the listed form reads the same


def test_ring_select_and_beam_search_through_local_layers(windowed):
    """beam_search (it uses new_kv_caches, so ring caches reordered by select) on a sliding-window model: with one
    beam it is greedy; with three, the same as with plain caches that keep every position, and as transformers'."""
    name, hf, model, folder = windowed
    prompt = ids_for(1, 6, seed=3)
    greedy = generate(model, prompt, 20)
    assert torch.equal(beam_search(model, prompt, 1, 20).tokens, greedy)
    ringed = beam_search(model, prompt, 3, 20)
    assert any(len(set(step["parent"])) < len(step["parent"]) or step["parent"] != sorted(step["parent"])
               for step in ringed.steps)  # the beams were copied or reordered: select did work
    plain_model = load_long(folder)
    plain_model.new_kv_caches = lambda: [KVCache() for _ in plain_model.trf_blocks]
    plain = beam_search(plain_model, prompt, 3, 20)
    assert torch.equal(ringed.tokens, plain.tokens) and ringed.score == pytest.approx(plain.score, abs=1e-5)
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), num_beams=3, max_new_tokens=20,
                         do_sample=False, early_stopping=False, length_penalty=1.0, pad_token_id=0,
                         output_scores=True, return_dict_in_generate=True)
    assert torch.equal(ringed.tokens, theirs.sequences)
    report(f"beam score {name}", abs(ringed.score - theirs.sequences_scores.item()))
    assert abs(ringed.score - theirs.sequences_scores.item()) < 1e-4


# %% 4. The defaults are notebook 16's network

SWITCHES = {"gpt2": dict(),
            "llama": dict(norm="rms", norm_eps=1e-6, positions="rotary", ffn="swiglu", n_kv_heads=2, qk_norm=True,
                          bias=False, qkv_bias=False, tie_weights=False, rope_theta=500000.0)}


def test_long_config_defaults_are_modern_configs():
    long, modern = LongConfig(), ModernConfig()
    for field in fields(ModernConfig):
        assert getattr(long, field.name) == getattr(modern, field.name), field.name
    assert not any(long.is_local(i) for i in range(long.n_layers))
    assert (long.rope_type, long.sliding_window, long.gate_act, long.post_norms, long.embed_scale,
            long.query_scale, long.attn_softcap, long.final_softcap) == ("default", None, "silu", False, False,
                                                                      None, None, None)


@pytest.mark.parametrize("switches", list(SWITCHES))
def test_long_gpt_with_notebook_16s_switches_is_modern_gpt(switches):
    kw = dict(vocab_size=VOCAB, context_length=32, emb_dim=48, n_heads=4, n_layers=2, drop_rate=0.0,
              **SWITCHES[switches])
    torch.manual_seed(0)
    modern = ModernGPT(ModernConfig(**kw)).eval()
    torch.manual_seed(0)
    long = LongGPT(LongConfig(**kw)).eval()
    ours, theirs = long.state_dict(), modern.state_dict()
    assert list(ours) == list(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    ids = ids_for(2, 20)
    with torch.no_grad():
        torch.testing.assert_close(long(ids), modern(ids), atol=0, rtol=0)
    assert generate(long, ids, 8).tolist() == generate(modern, ids, 8).tolist()


# %% 5. The window mask and the hooks' pattern


@pytest.mark.parametrize("window", [None, 1, 3, 7, 50])
def test_window_may_attend_is_the_rule_written_as_a_loop(window):
    queries, keys = torch.arange(5, 12), torch.arange(2, 12)
    expected = torch.tensor([[j <= i and (window is None or i - j < window) for j in keys.tolist()]
                             for i in queries.tolist()])
    assert torch.equal(window_may_attend(queries, keys, window), expected)
    if window is None:
        causal = torch.ones(10, 10, dtype=torch.bool).tril()
        assert torch.equal(window_may_attend(torch.arange(10), torch.arange(10), None), causal)


def test_the_hooks_pattern_of_a_local_layer_is_a_band(windowed):
    """run_with_cache's attn.pattern: zero outside the window's band, rows summing to 1; for Gemma 2 (window,
    scale, soft cap), Gemma 3 and Mistral, transformers' own attention weights."""
    name, hf, model, _ = windowed
    ids = ids_for(1, 20)
    _, cache = run_with_cache(model, ids)
    with torch.no_grad():
        hf_patterns = hf(ids, output_attentions=True).attentions
    rows, cols = torch.arange(20)[:, None], torch.arange(20)[None, :]
    for i, block in enumerate(model.trf_blocks):
        pattern = cache[f"blocks.{i}.attn.pattern"][0]  # (heads, tokens, tokens)
        band = (cols <= rows) & ((rows - cols < WINDOW) if block.att.window else True)
        assert (pattern[:, ~band] == 0).all()
        torch.testing.assert_close(pattern.sum(-1), torch.ones(4, 20), atol=1e-6, rtol=0)
        report(f"pattern {name} layer {i}", (pattern - hf_patterns[i][0]).abs().max().item())
        torch.testing.assert_close(pattern, hf_patterns[i][0], atol=1e-5, rtol=0)
    assert any(block.att.window == WINDOW for block in model.trf_blocks)


# %% 6. Left padding through a window


def test_left_padded_batch_generates_what_each_prompt_generates_alone(windowed):
    name, hf, model, _ = windowed
    prompts = [list(range(5, 19)), [40, 41, 42], [77]]  # 14 tokens: past the window of 8 before any is generated
    ids, mask = left_pad(prompts, pad_id=0)
    batch = generate_tokens(model, ids, 12, attention_mask=mask)
    alone = [generate_tokens(model, torch.tensor([p]), 12)[0, -12:].tolist() for p in prompts]
    assert batch[:, -12:].tolist() == alone
    assert len({tuple(row) for row in alone}) == 3  # three different continuations: rows cannot be mixed up
    theirs = hf.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert batch.tolist() == theirs.tolist()


def test_left_padded_stepping_through_ring_caches_equals_the_padded_forward(windowed):
    """Padding and ring caches together (generate_tokens steps through its own caches, not new_kv_caches): a padded
    prefill, then 12 tokens one at a time with the mask grown, gives the uncached padded forward's logits, and each
    row's last logits are those of its tokens alone."""
    name, _, model, _ = windowed
    prompts = [list(range(5, 19)), [40, 41, 42], [77]]
    ids, mask = left_pad(prompts, pad_id=0)
    extra = ids_for(3, 12, seed=5)
    all_ids, all_mask = torch.cat([ids, extra], 1), torch.cat([mask, torch.ones_like(extra)], 1)
    caches = model.new_kv_caches()
    width = ids.shape[1]
    with torch.no_grad():
        full = model(all_ids, attention_mask=all_mask)
        steps = [model(ids, kv_caches=caches, attention_mask=mask)]
        steps += [model(all_ids[:, t:t + 1], kv_caches=caches, attention_mask=all_mask[:, :t + 1])
                  for t in range(width, all_ids.shape[1])]
        alone = [model(torch.cat([torch.tensor([p]), extra[row:row + 1]], 1))[0, -1] for row, p in enumerate(prompts)]
    stepped = torch.cat(steps, 1)
    real = all_mask.bool()
    report(f"padded ring stepping {name}", (stepped - full)[real].abs().max().item())
    torch.testing.assert_close(stepped[real], full[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(stepped[:, -1], torch.stack(alone), atol=1e-5, rtol=0)


# %% 7. The dtype


def test_bfloat16_logits_and_float64_matches_float32():
    cfg = small_long(attn_softcap=5.0, final_softcap=3.0, gate_act="gelu_tanh", post_norms=True, embed_scale=True,
                     query_scale=12, local_rope_theta=10000.0, rope_theta=1e6, rope_type="yarn", rope_factor=4.0,
                     original_context=8)
    torch.manual_seed(0)
    model = sharp(LongGPT(cfg), 5.0)
    ids = ids_for(2, 24)
    reference = LongGPT(cfg).double().eval()
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected = reference(ids)
        got32 = model(ids)
        got16 = LongGPT(cfg).bfloat16().eval()
        got16.load_state_dict(model.state_dict())
        got16 = got16(ids)
    assert expected.dtype == torch.float64 and got32.dtype == torch.float32 and got16.dtype == torch.bfloat16
    report("float32 vs float64", (got32.double() - expected).abs().max().item())
    torch.testing.assert_close(got32.double(), expected, atol=1e-5, rtol=0)
    assert torch.isfinite(got16).all() and (got16.double() - expected).abs().max() < 0.2


# %% 8. Errors, by their message


def cfg_kw(**kwargs) -> dict:
    return dict(vocab_size=VOCAB, context_length=32, emb_dim=48, n_heads=4, n_layers=2, norm="rms",
                positions="rotary", ffn="swiglu") | kwargs


@pytest.mark.parametrize("kwargs, error, fragment", [
    (dict(rope_type="ntk"), ValueError, "rope_type must be one of"),
    (dict(rope_type="llama3", rope_factor=8.0), ValueError, "rope_type 'llama3' needs original_context"),
    (dict(rope_type="llama3", rope_factor=8.0, original_context=64, low_freq_factor=4.0, high_freq_factor=4.0),
     ValueError, "high_freq_factor 4.0 must be above low_freq_factor 4.0"),
    (dict(rope_type="yarn", rope_factor=4.0, original_context=64, beta_fast=1.0, beta_slow=1.0), ValueError,
     "beta_fast 1.0 must be above beta_slow 1.0"),
    (dict(sliding_window=4, layer_types=("local",)), ValueError, "layer_types must be a tuple of n_layers=2"),
    (dict(sliding_window=4, layer_types=("local", "sliding")), ValueError, r"layer_types holds \['sliding'\]"),
    (dict(layer_types=("local", "global")), ValueError, "local layers but sliding_window is None"),
    (dict(ffn="gelu", gate_act="gelu_tanh"), ValueError, "gate_act 'gelu_tanh' with ffn 'gelu'.*set ffn='swiglu'"),
    (dict(gate_act="relu"), ValueError, "gate_act must be one of"),
    (dict(sliding_window=0), ValueError, "sliding_window"),
], ids=["rope_type", "llama3_no_original", "high_le_low", "beta", "types_length", "types_entry", "no_window",
        "gate_with_gelu", "gate_unknown", "window_zero"])
def test_long_config_rejects(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        LongConfig(**cfg_kw(**kwargs))


@pytest.fixture(scope="module")
def llama3_files(tmp_path_factory):
    """The config.json (a dict) and weights of the Llama 3.2-style checkpoint, to edit into ones it cannot read."""
    folder = tmp_path_factory.mktemp("llama3_files")
    hf_model("llama3_2").save_pretrained(folder)
    return folder, json.loads((folder / "config.json").read_text()), (folder / "model.safetensors").read_bytes()


def checkpoint(folder, config: dict, weights: bytes):
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(weights)
    return folder


YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16)


@pytest.mark.parametrize("edit, fragment", [
    (dict(rope_parameters=YARN | dict(mscale=1.0, mscale_all_dim=1.0)), "mscale"),
    (dict(rope_parameters=YARN | dict(partial_rotary_factor=0.5)), "partial_rotary_factor"),
    (dict(rope_parameters=YARN | dict(truncate=False)), "truncate: false"),
    (dict(model_type="phi3"), "model_type 'phi3'; load_long reads"),
], ids=["yarn_mscale", "partial_rotary", "yarn_untruncated", "unknown_type"])
def test_load_long_rejects_what_it_does_not_build(tmp_path, llama3_files, edit, fragment):
    _, config, weights = llama3_files
    folder = checkpoint(tmp_path, config | edit, weights)
    with pytest.raises(ValueError, match=fragment):
        load_long(folder)


def test_load_modern_sends_a_llama3_folder_to_load_long(llama3_files):
    """Notebook 16's loader refuses rope_type llama3 and names the loader that reads it."""
    folder, _, _ = llama3_files
    with pytest.raises(ValueError, match="rope_type 'llama3'"):
        load_modern(folder)
    with pytest.raises(ValueError, match="load_long"):
        load_modern(folder)

"""Issue 47: every public function and class of course_lib.long_context (notebook 17), called as a user who has not
read the code might call it: LongConfig's new fields, the stretched rotation speeds (llama3, YaRN) and ScaledRotary,
the window mask, softcap, LocalAttention, the ring cache and its crop, ring_cache_bytes, LongGPT and its forward, and
the Hugging Face loader with bad configs, tensors and folders. Each case is a call and its expected outcome: ("error",
type, a fragment of our message that names the argument) or ("result", check). `python tests/test_doors_long_context.py`
counts the outcomes as clear / correct / unclear / silent. A refused load leaves the folder and the random generator
as they were; a refused state conversion leaves the caller's dict as it was."""

import hashlib
import json
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM)

from course_lib.attention import KVCache
from course_lib.long_context import (
    HF_LONG_TYPES, GeGLU, LocalAttention, LongBlock, LongConfig, LongGPT, RingKVCache, ScaledEmbedding, ScaledRotary,
    hf_rope, llama3_inv_freq, load_long, long_config_from_hf, long_state_from_hf, ring_cache_bytes, softcap,
    window_may_attend, yarn_attention_factor, yarn_inv_freq, yarn_ramp,
)
from course_lib.modern import ModernConfig, ModernGPT, Rotary, SwiGLU

from doors import door_tests, report

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

SHAPE = dict(vocab_size=32, context_length=24, emb_dim=16, n_heads=4, n_layers=2, drop_rate=0.0, norm="rms",
             positions="rotary", ffn="swiglu", n_kv_heads=2, bias=False, qkv_bias=False)
MODERN = ModernConfig(**SHAPE)
LLAMA3 = LongConfig(**SHAPE, rope_type="llama3", rope_factor=8.0, original_context=16)
YARN = LongConfig(**SHAPE, rope_type="yarn", rope_factor=4.0, original_context=16)
WINDOWED = LongConfig(**SHAPE, sliding_window=4, layer_types=("local", "global"), attn_softcap=5.0,
                      final_softcap=3.0, post_norms=True, embed_scale=True, gate_act="gelu_tanh")
torch.manual_seed(0)
MODEL = LongGPT(WINDOWED).eval()
IDS = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
FULL = MODEL(IDS).detach()
X = torch.randn(2, 6, 16)
PLAIN = Rotary(4, 10000.0).inv_freq()  # (2,): the speeds of a head of 4
FAST_SLOW = Rotary(16, 500000.0).inv_freq()  # in 8192 positions the first pair turns 1304 times, the last 0.013
LLAMA3_8192 = LongConfig(**SHAPE, rope_type="llama3", rope_factor=8.0, original_context=8192)


def config(**changes):
    return lambda: LongConfig(**(SHAPE | changes))


def has(**expected):
    return lambda cfg: all(getattr(cfg, name) == value for name, value in expected.items())


def close(expected, atol=1e-5):
    return lambda out: out.shape == expected.shape and torch.allclose(out, expected, atol=atol)


def loop_rule(queries, keys, window):
    """window_may_attend written as a loop over every pair."""
    return torch.tensor([[j <= i and (window is None or i - j < window) for j in keys.tolist()]
                         for i in queries.tolist()])


# %% the ring cache and the model's forward

def ring_stepped():
    """Token by token through new_kv_caches (a RingKVCache of 4 slots for the local layer) = the full forward."""
    caches = MODEL.new_kv_caches()
    outs = [MODEL(IDS[:, :3], kv_caches=caches)] + [MODEL(IDS[:, t:t + 1], kv_caches=caches) for t in range(3, 10)]
    return torch.cat(outs, 1)


def plain_caches_stepped():
    """The same through plain KVCaches on every layer (ModernGPT's caches): the window is kept by the columns."""
    caches = [KVCache(), KVCache()]
    outs = [MODEL(IDS[:, :6], kv_caches=caches)] + [MODEL(IDS[:, t:t + 1], kv_caches=caches) for t in range(6, 10)]
    return torch.cat(outs, 1)


def wrong_ring_stepped(caches):
    outs = [MODEL(IDS[:, :6], kv_caches=caches)] + [MODEL(IDS[:, t:t + 1], kv_caches=caches) for t in range(6, 10)]
    return torch.cat(outs, 1)


def ring(window=4, tokens=6, spare=0):
    cache = RingKVCache(window, spare)
    cache.append(torch.randn(1, 2, tokens, 4), torch.randn(1, 2, tokens, 4))
    return cache


def cropped(cache, length):
    before = (len(cache), cache.keys.clone())
    try:
        return cache.crop(length)
    finally:
        assert (len(cache), cache.keys.tolist()) == (before[0], before[1].tolist()), "a refused crop changed the ring"


def ring_append_order():
    """Six columns appended one by one to a 4-slot ring: the last append returns the 4 held, columns 1..4, oldest
    first, then the new column 5."""
    cache = RingKVCache(4)
    for c in range(6):
        keys, _ = cache.append(torch.full((1, 1, 1, 2), float(c)), torch.full((1, 1, 1, 2), float(c)))
    return keys[0, 0, :, 0].tolist()


def forward_refused(then, **kwargs):
    """A cached forward refused: the caches hold what they held before."""
    caches = MODEL.new_kv_caches()
    MODEL(IDS[:, :4], kv_caches=caches)
    try:
        return MODEL(then, kv_caches=caches, **kwargs)
    finally:
        assert all(len(cache) == 4 for cache in caches), "a refused forward changed the caches"


# %% Hugging Face folders, written once by transformers, copied and edited per case

HF_SHAPE = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-6, bos_token_id=None,
                eos_token_id=None, pad_token_id=None)
HF_DIR = Path(tempfile.mkdtemp())


def hf_folder(name, model_class, config):
    config._attn_implementation = "eager"
    torch.manual_seed(1)
    model = model_class(config).eval()
    with torch.no_grad():  # norm weights away from their start, so a missed 1 + w shows in the logits
        for p_name, p in model.named_parameters():
            if "norm" in p_name:
                p.normal_(0.0, 0.3)
    model.save_pretrained(HF_DIR / name)
    return HF_DIR / name, model


LLAMA3_DIR, LLAMA3_HF = hf_folder("llama3", LlamaForCausalLM, LlamaConfig(**HF_SHAPE, rope_parameters=dict(
    rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
    original_max_position_embeddings=8)))
MISTRAL_DIR, MISTRAL_HF = hf_folder("mistral", MistralForCausalLM, MistralConfig(**HF_SHAPE, sliding_window=4))
GEMMA2_DIR, GEMMA2_HF = hf_folder("gemma2", Gemma2ForCausalLM, Gemma2Config(
    **HF_SHAPE, head_dim=8, sliding_window=4, query_pre_attn_scalar=12, attn_logit_softcapping=5.0,
    final_logit_softcapping=3.0, tie_word_embeddings=False))
GEMMA3_DIR, GEMMA3_HF = hf_folder("gemma3", Gemma3ForCausalLM, Gemma3TextConfig(
    **HF_SHAPE, head_dim=8, sliding_window=4, query_pre_attn_scalar=12, sliding_window_pattern=2,
    tie_word_embeddings=False, rope_parameters={"full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1e6),
                                                "sliding_attention": dict(rope_type="default", rope_theta=10000.0)}))
HF_CONFIG = json.loads((LLAMA3_DIR / "config.json").read_text())
GEMMA2_CONFIG = json.loads((GEMMA2_DIR / "config.json").read_text())
GEMMA3_CONFIG = json.loads((GEMMA3_DIR / "config.json").read_text())
HF_STATE = load_file(LLAMA3_DIR / "model.safetensors")
GEMMA2_STATE = load_file(GEMMA2_DIR / "model.safetensors")
HF_CFG = long_config_from_hf(HF_CONFIG)
GEMMA2_CFG = long_config_from_hf(GEMMA2_CONFIG)
HF_IDS = torch.arange(20).view(1, 20) % 32  # 20 tokens: past the window (4) and the original context (8)


def edited(config_changes=None, drop=(), source=LLAMA3_DIR, **tensors):
    """A copy of a folder with config.json's keys changed (None: removed) and tensors replaced or dropped."""
    folder = Path(tempfile.mkdtemp()) / "model"
    shutil.copytree(source, folder)
    if config_changes is not None:
        cfg = json.loads((folder / "config.json").read_text())
        cfg = {k: v for k, v in (cfg | config_changes).items() if k not in config_changes or v is not None}
        (folder / "config.json").write_text(json.dumps(cfg))
    if tensors or drop:
        state = load_file(folder / "model.safetensors")
        state = {k: v for k, v in (state | {k.replace("__", "."): v for k, v in tensors.items()}).items()
                 if k not in drop}
        save_file(state, folder / "model.safetensors")
    return folder


def fingerprint(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).iterdir())}


def load_refused(folder, device=None):
    """load_long refused: its error, after checking that the folder and the random generator are unchanged."""
    is_folder = isinstance(folder, (str, Path)) and Path(folder).is_dir()
    before, rng = fingerprint(folder) if is_folder else None, torch.random.get_rng_state()
    try:
        return load_long(folder, device)
    finally:
        assert (fingerprint(folder) if is_folder else None) == before, "a refused load changed the folder"
        assert torch.equal(rng, torch.random.get_rng_state()), "a refused load drew from the random generator"


def same_as_hf(hf_model):
    def check(model):
        with torch.no_grad():
            return (model(HF_IDS) - hf_model(HF_IDS).logits).abs().max() < 1e-4
    return check


def hf(base=HF_CONFIG, **changes):
    """long_config_from_hf of a config.json with keys changed (None: removed)."""
    return lambda: long_config_from_hf({k: v for k, v in (base | changes).items() if v is not None})


def rope(**changes):
    """The Llama 3 config with its rope_parameters changed (None: removed)."""
    parameters = {k: v for k, v in (HF_CONFIG["rope_parameters"] | changes).items() if v is not None}
    return hf(rope_parameters=parameters)


def state_refused(state, cfg=HF_CFG, gemma=False):
    """long_state_from_hf refused: its error, after checking that the caller's dict holds what it held."""
    before = {k: (v, v.clone() if isinstance(v, torch.Tensor) and not v.is_meta else None)
              for k, v in state.items()} if isinstance(state, dict) else None
    try:
        return long_state_from_hf(state, cfg, gemma, source="ckpt")
    finally:
        if before is not None:
            assert before.keys() == state.keys() and all(state[k] is v for k, (v, _) in before.items())
            assert all(bool(((c == v) | ((c != c) & (v != v))).all()) for v, c in before.values() if c is not None)


def with_value(state, key, value):
    tensor = state[key].clone()
    tensor.view(-1)[1] = value
    return state | {key: tensor}


CASES = [
    # LongConfig and its fields
    ("config default = ModernConfig default", lambda: LongConfig(),
     ("result", lambda c: isinstance(c, ModernConfig) and (c.rope_type, c.sliding_window) == ("default", None)
      and not c.is_local(0))),
    ("config windowed", lambda: WINDOWED, ("result", lambda c: (c.is_local(0), c.is_local(1)) == (True, False))),
    ("config window, no types: all local", config(sliding_window=4),
     ("result", lambda c: c.is_local(0) and c.is_local(1))),
    ("config rope_type 'Llama3'", config(rope_type="Llama3"), ("error", ValueError, "rope_type must be one of")),
    ("config rope_type 'ntk'", config(rope_type="ntk"), ("error", ValueError, "got 'ntk'")),
    ("config rope_type None", config(rope_type=None), ("error", ValueError, "rope_type must be one of")),
    ("config linear learned", config(rope_type="linear", rope_factor=2.0, positions="learned"),
     ("error", ValueError, "set positions='rotary'")),
    ("config linear factor 0", config(rope_type="linear", rope_factor=0.0),
     ("error", ValueError, "rope_factor must be")),
    ("config linear factor '8'", config(rope_type="linear", rope_factor="8"),
     ("error", TypeError, "rope_factor must be a number")),
    ("config linear factor nan", config(rope_type="linear", rope_factor=math.nan),
     ("error", ValueError, "rope_factor must be in")),
    ("config factor without rope_type", config(rope_factor=8.0), ("error", ValueError, "rope_factor 8.0")),
    ("config llama3 no original", config(rope_type="llama3", rope_factor=8.0),
     ("error", ValueError, "needs original_context")),
    ("config llama3 original 16.0", config(rope_type="llama3", rope_factor=8.0, original_context=16.0),
     ("error", TypeError, "original_context must be an int")),
    ("config llama3 original 0", config(rope_type="llama3", rope_factor=8.0, original_context=0),
     ("error", ValueError, "original_context must be >= 1")),
    ("config llama3 high = low", config(rope_type="llama3", rope_factor=8.0, original_context=16, low_freq_factor=4.0),
     ("error", ValueError, "high_freq_factor 4.0 must be above low_freq_factor 4.0")),
    ("config llama3 high '4'", config(rope_type="llama3", rope_factor=8.0, original_context=16, high_freq_factor="4"),
     ("error", TypeError, "high_freq_factor must be a number")),
    ("config llama3 low -1", config(rope_type="llama3", rope_factor=8.0, original_context=16, low_freq_factor=-1.0),
     ("error", ValueError, "low_freq_factor must be in")),
    ("config yarn beta_fast = slow", config(rope_type="yarn", rope_factor=4.0, original_context=16, beta_fast=1.0),
     ("error", ValueError, "beta_fast 1.0 must be above beta_slow 1.0")),
    ("config yarn beta_fast '32'", config(rope_type="yarn", rope_factor=4.0, original_context=16, beta_fast="32"),
     ("error", TypeError, "beta_fast must be a number")),
    ("config yarn attention_factor 0", config(rope_type="yarn", rope_factor=4.0, original_context=16,
                                              attention_factor=0.0), ("error", ValueError, "attention_factor must be")),
    ("config window 0", config(sliding_window=0), ("error", ValueError, "sliding_window must be >= 1")),
    ("config window '8'", config(sliding_window="8"), ("error", TypeError, "sliding_window must be an int")),
    ("config window 8.0", config(sliding_window=8.0), ("error", TypeError, "sliding_window must be an int")),
    ("config window True", config(sliding_window=True), ("error", TypeError, "sliding_window must be an int")),
    ("config types list", config(sliding_window=4, layer_types=["local", "global"]),
     ("error", ValueError, "layer_types must be a tuple")),
    ("config types too short", config(sliding_window=4, layer_types=("local",)),
     ("error", ValueError, "n_layers=2")),
    ("config types str", config(sliding_window=4, layer_types="local"), ("error", ValueError, "layer_types must be")),
    ("config types HF names", config(sliding_window=4, layer_types=("sliding_attention", "full_attention")),
     ("error", ValueError, "layer_types holds ['full_attention', 'sliding_attention']")),
    ("config types local, no window", config(layer_types=("local", "global")),
     ("error", ValueError, "sliding_window is None")),
    ("config types all global + window", config(sliding_window=4, layer_types=("global", "global")),
     ("result", lambda c: not c.is_local(0) and not c.is_local(1))),
    ("config gate 'gelu'", config(gate_act="gelu"), ("error", ValueError, "gate_act must be one of")),
    ("config gate gelu_tanh, ffn gelu", config(gate_act="gelu_tanh", ffn="gelu"),
     ("error", ValueError, "ffn='swiglu'")),
    ("config post_norms 1", config(post_norms=1), ("error", TypeError, "post_norms must be True or False")),
    ("config embed_scale 'yes'", config(embed_scale="yes"), ("error", TypeError, "embed_scale must be True or False")),
    ("config embed_scale learned", config(embed_scale=True, positions="learned"),
     ("error", ValueError, "set positions='rotary'")),
    ("config softcap 0", config(attn_softcap=0.0), ("error", ValueError, "attn_softcap must be in (0, inf)")),
    ("config softcap -30", config(final_softcap=-30.0), ("error", ValueError, "final_softcap must be in")),
    ("config softcap '50'", config(attn_softcap="50"), ("error", TypeError, "attn_softcap must be a number")),
    ("config query_scale 0", config(query_scale=0), ("error", ValueError, "query_scale must be in")),
    ("config local theta 1", config(local_rope_theta=1.0),
     ("error", ValueError, "local_rope_theta 1.0 must be above 1")),
    ("config local theta inf", config(local_rope_theta=math.inf), ("error", ValueError, "local_rope_theta must be in")),
    ("config is_local(2) of 2 layers", lambda: WINDOWED.is_local(2), ("error", ValueError, "layer")),
    # llama3_inv_freq, yarn_ramp, yarn_inv_freq, yarn_attention_factor
    ("llama3 keeps fast, divides slow", lambda: llama3_inv_freq(FAST_SLOW, LLAMA3_8192),
     ("result", lambda f: f[0] == FAST_SLOW[0] and torch.allclose(f[-1], FAST_SLOW[-1] / 8))),
    ("llama3 cfg yarn", lambda: llama3_inv_freq(PLAIN, YARN), ("error", ValueError, "cfg.rope_type is 'yarn'")),
    ("llama3 cfg default", lambda: llama3_inv_freq(PLAIN, LongConfig(**SHAPE)),
     ("error", ValueError, "rope_type='llama3'")),
    ("llama3 cfg ModernConfig", lambda: llama3_inv_freq(PLAIN, MODERN),
     ("error", TypeError, "cfg must be a LongConfig, got ModernConfig")),
    ("llama3 cfg dict", lambda: llama3_inv_freq(PLAIN, {"rope_type": "llama3"}), ("error", TypeError, "cfg must be")),
    ("llama3 inv_freq list", lambda: llama3_inv_freq(PLAIN.tolist(), LLAMA3),
     ("error", TypeError, "inv_freq must be a 1-D float tensor")),
    ("llama3 inv_freq 2-D", lambda: llama3_inv_freq(PLAIN[None], LLAMA3), ("error", TypeError, "inv_freq must be")),
    ("llama3 inv_freq int", lambda: llama3_inv_freq(torch.arange(4), LLAMA3), ("error", TypeError, "inv_freq must be")),
    ("llama3 inv_freq head_dim", lambda: llama3_inv_freq(Rotary(8).inv_freq(), LLAMA3),  # not the config's 4
     ("result", lambda f: f.shape == (4,))),
    ("yarn ramp 0 .. 1", lambda: yarn_ramp(YARN, 10000.0, 8),
     ("result", lambda r: r.shape == (8,) and r[0] == 0 and r[-1] == 1 and bool((r.diff() >= 0).all()))),
    ("yarn ramp theta 1", lambda: yarn_ramp(YARN, 1.0, 8), ("error", ValueError, "theta must be in (1, inf)")),
    ("yarn ramp theta '1e4'", lambda: yarn_ramp(YARN, "1e4", 8), ("error", TypeError, "theta must be a number")),
    ("yarn ramp pairs 0", lambda: yarn_ramp(YARN, 10000.0, 0), ("error", ValueError, "pairs must be >= 1")),
    ("yarn ramp pairs 8.0", lambda: yarn_ramp(YARN, 10000.0, 8.0), ("error", TypeError, "pairs must be an int")),
    ("yarn ramp cfg llama3", lambda: yarn_ramp(LLAMA3, 10000.0, 8), ("error", ValueError, "cfg.rope_type is 'llama3'")),
    ("yarn ramp cfg ModernConfig", lambda: yarn_ramp(MODERN, 10000.0, 8), ("error", TypeError, "cfg must be")),
    ("yarn inv_freq ends", lambda: yarn_inv_freq(Rotary(16).inv_freq(), YARN, 10000.0),
     ("result", lambda f: f[0] == Rotary(16).inv_freq()[0] and torch.allclose(f[-1], Rotary(16).inv_freq()[-1] / 4))),
    ("yarn inv_freq cfg llama3", lambda: yarn_inv_freq(PLAIN, LLAMA3, 10000.0),
     ("error", ValueError, "cfg.rope_type is 'llama3'")),
    ("yarn inv_freq theta 0", lambda: yarn_inv_freq(PLAIN, YARN, 0.0), ("error", ValueError, "theta must be in")),
    ("yarn inv_freq list", lambda: yarn_inv_freq(PLAIN.tolist(), YARN, 10000.0),
     ("error", TypeError, "inv_freq must be a 1-D float tensor")),
    ("yarn inv_freq 2-D", lambda: yarn_inv_freq(PLAIN.repeat(3, 1), YARN, 10000.0),
     ("error", TypeError, "inv_freq must be a 1-D float tensor")),
    ("yarn factor default", lambda: yarn_attention_factor(YARN),
     ("result", lambda a: math.isclose(a, 0.1 * math.log(4.0) + 1))),
    ("yarn factor no stretch", lambda: yarn_attention_factor(LongConfig()), ("result", lambda a: a == 1.0)),
    ("yarn factor ModernConfig", lambda: yarn_attention_factor(MODERN), ("error", TypeError, "cfg must be")),
    # ScaledRotary
    ("rotary default = Rotary", lambda: ScaledRotary(4, 10000.0, LongConfig(**SHAPE))(torch.arange(6)),
     ("result", lambda cs: all(torch.equal(a, b) for a, b in zip(cs, Rotary(4, 10000.0)(torch.arange(6)))))),
    ("rotary linear = positions / factor", lambda: ScaledRotary(4, 10000.0, config(
        rope_type="linear", rope_factor=2.0)())(torch.arange(0, 12, 2)),
     ("result", lambda cs: all(torch.allclose(a, b) for a, b in zip(cs, Rotary(4, 10000.0)(torch.arange(6)))))),
    ("rotary yarn scales cos", lambda: ScaledRotary(4, 10000.0, YARN)(torch.zeros(1, dtype=torch.long))[0],
     ("result", lambda c: torch.allclose(c, torch.full((1, 4), 0.1 * math.log(4.0) + 1)))),
    ("rotary head_dim odd", lambda: ScaledRotary(5, 10000.0, YARN), ("error", ValueError, "head_dim 5 is odd")),
    ("rotary theta 1", lambda: ScaledRotary(4, 1.0, YARN), ("error", ValueError, "theta must be in (1, inf)")),
    ("rotary cfg None", lambda: ScaledRotary(4, 10000.0, None), ("error", TypeError, "cfg must be a LongConfig")),
    ("rotary cfg ModernConfig", lambda: ScaledRotary(4, 10000.0, MODERN), ("error", TypeError, "cfg must be")),
    # window_may_attend
    ("window = loop rule", lambda: window_may_attend(torch.arange(3, 9), torch.arange(9), 4),
     ("result", lambda m: torch.equal(m, loop_rule(torch.arange(3, 9), torch.arange(9), 4)))),
    ("window None = causal", lambda: window_may_attend(torch.arange(5), torch.arange(5), None),
     ("result", lambda m: torch.equal(m, torch.ones(5, 5, dtype=torch.bool).tril()))),
    ("window 1 = itself", lambda: window_may_attend(torch.arange(5), torch.arange(5), 1),
     ("result", lambda m: torch.equal(m, torch.eye(5, dtype=torch.bool)))),
    ("window int32 columns", lambda: window_may_attend(torch.arange(5, dtype=torch.int32), torch.arange(5), 2),
     ("result", lambda m: torch.equal(m, loop_rule(torch.arange(5), torch.arange(5), 2)))),
    ("window 0", lambda: window_may_attend(torch.arange(5), torch.arange(5), 0),
     ("error", ValueError, "window must be >= 1")),
    ("window '8'", lambda: window_may_attend(torch.arange(5), torch.arange(5), "8"),
     ("error", TypeError, "window must be an int")),
    ("window 4.0", lambda: window_may_attend(torch.arange(5), torch.arange(5), 4.0),
     ("error", TypeError, "window must be an int")),
    ("window tensor", lambda: window_may_attend(torch.arange(5), torch.arange(5), torch.tensor(4)),
     ("error", TypeError, "window must be an int")),
    ("window float columns", lambda: window_may_attend(torch.arange(5.0), torch.arange(5), 4),
     ("error", TypeError, "query_columns must be a 1-D integer tensor")),
    ("window bool columns", lambda: window_may_attend(torch.ones(5, dtype=torch.bool), torch.arange(5), 4),
     ("error", TypeError, "query_columns must be a 1-D integer tensor")),
    ("window 2-D keys", lambda: window_may_attend(torch.arange(5), torch.arange(5)[None], 4),
     ("error", TypeError, "key_columns must be a 1-D integer tensor")),
    ("window list keys", lambda: window_may_attend(torch.arange(5), list(range(5)), 4),
     ("error", TypeError, "key_columns must be")),
    ("window devices differ", lambda: window_may_attend(torch.arange(5), torch.arange(5, device="meta"), 4),
     ("error", ValueError, "query_columns are on cpu, key_columns on meta")),
    # softcap
    ("softcap within the cap", lambda: softcap(torch.tensor([-1e6, -1.0, 0.0, 1e-3, 1e6]), 5.0),
     ("result", lambda y: bool((y.abs() <= 5).all()) and y[2] == 0 and math.isclose(y[3], 1e-3, rel_tol=1e-6)
      and math.isclose(y[-1], 5.0))),
    ("softcap cap 0", lambda: softcap(torch.tensor([0.0, 1.0]), 0.0), ("error", ValueError, "cap must be in (0, inf)")),
    ("softcap cap -5", lambda: softcap(torch.tensor([1.0]), -5.0), ("error", ValueError, "cap must be in (0, inf)")),
    ("softcap cap None", lambda: softcap(torch.tensor([1.0]), None), ("error", TypeError, "cap must be a number")),
    ("softcap list", lambda: softcap([1.0, 2.0], 5.0), ("error", TypeError, "x must be a Tensor")),
    # LocalAttention, LongBlock, GeGLU, ScaledEmbedding
    ("attention local window", lambda: LocalAttention(WINDOWED, local=True),
     ("result", lambda a: a.window == 4 and a.softcap == 5.0 and math.isclose(a.scale, 4 ** -0.5))),
    ("attention global", lambda: LocalAttention(WINDOWED, local=False), ("result", lambda a: a.window is None)),
    ("attention pattern is a band", lambda: LocalAttention(WINDOWED, local=True).attention_weights(X),
     ("result", lambda p: p.shape == (2, 4, 6, 6) and torch.equal(p[0, 0] > 0, loop_rule(torch.arange(6),
                                                                                         torch.arange(6), 4)))),
    ("attention local theta", lambda: LocalAttention(config(sliding_window=4, local_rope_theta=100.0,
                                                            rope_theta=1e6)(), True).rotary.theta,
     ("result", lambda t: t == 100.0)),
    ("attention ModernConfig", lambda: LocalAttention(MODERN, True), ("error", TypeError, "cfg must be a LongConfig")),
    ("attention local 'yes'", lambda: LocalAttention(WINDOWED, "yes"), ("error", TypeError, "local must be True")),
    ("attention local, no window", lambda: LocalAttention(LongConfig(**SHAPE), True),
     ("error", ValueError, "sliding_window")),
    ("block post norms", lambda: LongBlock(WINDOWED, local=True),
     ("result", lambda b: isinstance(b.ff, GeGLU) and b.att.window == 4 and hasattr(b.post_att_norm, "scale"))),
    ("GeGLU is a SwiGLU", lambda: GeGLU(WINDOWED)(X).shape, ("result", lambda s: s == X.shape)),
    ("GeGLU gelu gate", lambda: (g := GeGLU(WINDOWED), g(X) - g.proj(torch.nn.functional.gelu(
        g.fc_gate(X), approximate="tanh") * g.fc(X)))[1], ("result", lambda d: d.abs().max() == 0)),
    ("embedding * sqrt(16)", lambda: (e := ScaledEmbedding(WINDOWED))(IDS)[0, 0] / e.tok_emb.weight[1],
     ("result", lambda r: torch.allclose(r, torch.full((16,), 4.0)))),
    ("SwiGLU kept for silu", lambda: type(LongBlock(LLAMA3, local=False).ff), ("result", lambda t: t is SwiGLU)),
    # RingKVCache and its crop
    ("ring window 4 holds 4 slots", lambda: ring(4, 6).keys.shape, ("result", lambda s: s == (1, 2, 4, 4))),
    ("ring len counts every position", lambda: len(ring(4, 6)), ("result", lambda n: n == 6)),
    ("ring append oldest first", ring_append_order, ("result", lambda cols: cols == [1.0, 2.0, 3.0, 4.0, 5.0])),
    ("ring window 0", lambda: RingKVCache(0), ("error", ValueError, "window must be >= 1")),
    ("ring window '4'", lambda: RingKVCache("4"), ("error", TypeError, "window must be an int")),
    ("ring window 4.0", lambda: RingKVCache(4.0), ("error", TypeError, "window must be an int")),
    ("ring window None", lambda: RingKVCache(None), ("error", TypeError, "window must be an int")),
    ("ring crop 0 empties", lambda: (c := ring(), c.crop(0), c)[2],
     ("result", lambda c: len(c) == 0 and c.keys is None)),
    ("ring crop to its length", lambda: (c := ring(), c.crop(6), c)[2], ("result", lambda c: len(c) == 6)),
    ("ring crop to the middle", lambda: cropped(ring(), 3), ("error", ValueError, "cannot crop to 3")),
    ("ring crop inside the window", lambda: cropped(ring(8, 6), 5), ("error", ValueError, "cannot crop to 5")),
    ("ring crop -1", lambda: cropped(ring(), -1), ("error", ValueError, "length must be >= 0")),
    ("ring crop past its length", lambda: (c := ring(), c.crop(9), c)[2], ("result", lambda c: len(c) == 6)),
    ("ring crop back within spare", lambda: (c := ring(spare=2), c.crop(4), c)[2],
     ("result", lambda c: len(c) == 4 and c.keys.shape[2] == 6)),
    ("ring crop back past spare", lambda: cropped(ring(spare=2), 3),
     ("error", ValueError, "can take back at most 2 positions")),
    ("ring spare -1", lambda: RingKVCache(4, -1), ("error", ValueError, "spare must be >= 0")),
    ("ring spare '2'", lambda: RingKVCache(4, "2"), ("error", TypeError, "spare must be an int")),
    ("ring crop 3.0", lambda: cropped(ring(), 3.0), ("error", TypeError, "length must be an int")),
    # ring_cache_bytes
    ("bytes windowed", lambda: ring_cache_bytes(WINDOWED, 100),
     ("result", lambda n: n == 2 * 1 * (4 + 100) * 2 * 4 * 2)),
    ("bytes no window = kv_cache_bytes", lambda: ring_cache_bytes(LLAMA3, 100, batch=3, bytes_per_number=4),
     ("result", lambda n: n == 2 * 3 * 200 * 2 * 4 * 4)),
    ("bytes 0 tokens", lambda: ring_cache_bytes(WINDOWED, 0), ("result", lambda n: n == 0)),
    ("bytes ModernConfig", lambda: ring_cache_bytes(MODERN, 100),
     ("error", TypeError, "cfg must be a LongConfig, got ModernConfig: pass the model's LongConfig")),
    ("bytes tokens -1", lambda: ring_cache_bytes(WINDOWED, -1), ("error", ValueError, "tokens must be >= 0")),
    ("bytes tokens 1e3", lambda: ring_cache_bytes(WINDOWED, 1e3), ("error", TypeError, "tokens must be an int")),
    ("bytes batch 0", lambda: ring_cache_bytes(WINDOWED, 10, batch=0), ("error", ValueError, "batch must be >= 1")),
    ("bytes bytes '2'", lambda: ring_cache_bytes(WINDOWED, 10, bytes_per_number="2"),
     ("error", TypeError, "bytes_per_number must be an int")),
    # LongGPT and its forward
    ("gpt notebook 16 switches = ModernGPT", lambda: LongGPT(LongConfig(**SHAPE)).state_dict().keys(),
     ("result", lambda keys: keys == ModernGPT(MODERN).state_dict().keys())),
    ("gpt caches: ring for local", lambda: [type(c) for c in MODEL.new_kv_caches()],
     ("result", lambda t: t == [RingKVCache, KVCache])),
    ("gpt ModernConfig", lambda: LongGPT(MODERN), ("error", TypeError, "cfg must be a LongConfig, got ModernConfig")),
    ("gpt dict", lambda: LongGPT(dict(SHAPE)), ("error", TypeError, "cfg must be a LongConfig, got dict")),
    ("gpt None", lambda: LongGPT(None), ("error", TypeError, "cfg must be a LongConfig, got NoneType")),
    ("forward logits capped", lambda: FULL, ("result", lambda y: y.shape == (1, 10, 32) and bool((y.abs() < 3).all()))),
    ("forward ring stepping = full", ring_stepped, ("result", close(FULL))),
    ("forward plain caches = full", plain_caches_stepped, ("result", close(FULL))),
    ("forward last_only", lambda: MODEL(IDS, last_only=True), ("result", close(FULL[:, -1:]))),
    ("forward left padding",
     lambda: MODEL(torch.tensor([[0, 0, *range(1, 11)]]), attention_mask=torch.tensor([[0, 0] + [1] * 10]))[:, 2:],
     ("result", close(FULL))),
    ("forward id = vocab", lambda: MODEL(torch.tensor([[32]])), ("error", ValueError, "token id 32 >= vocab_size 32")),
    ("forward id -1", lambda: MODEL(torch.tensor([[-1]])), ("error", ValueError, "token id -1 < 0")),
    ("forward float ids", lambda: MODEL(IDS.float()), ("error", TypeError, "token_ids must hold integer token ids")),
    ("forward 1-D", lambda: MODEL(IDS[0]), ("error", ValueError, "token_ids must be 2-D")),
    ("forward list", lambda: MODEL([[1, 2]]), ("error", TypeError, "token_ids must be a torch.Tensor")),
    ("forward too long", lambda: MODEL(torch.zeros(1, 25, dtype=torch.long)), ("error", ValueError, "25 tokens")),
    ("forward past cache", lambda: forward_refused(torch.zeros(1, 21, dtype=torch.long)),
     ("error", ValueError, "21 tokens")),
    ("forward cache other batch", lambda: forward_refused(torch.zeros(2, 1, dtype=torch.long)),
     ("error", ValueError, "kv_caches hold 1 rows")),
    ("forward caches 1 of 2", lambda: MODEL(IDS, kv_caches=MODEL.new_kv_caches()[:1]),
     ("error", ValueError, "kv_caches")),
    ("forward ring too small", lambda: wrong_ring_stepped([RingKVCache(2), KVCache()]),
     ("error", ValueError, "kv_caches")),
    ("forward ring on global layer", lambda: wrong_ring_stepped([RingKVCache(4), RingKVCache(4)]),
     ("error", ValueError, "kv_caches")),
    # long_config_from_hf and hf_rope
    ("hf rope llama3", lambda: hf_rope(HF_CONFIG),
     ("result", lambda r: r[0]["rope_type"] == "llama3" and r[0]["factor"] == 8.0 and r[1] is None)),
    ("hf rope gemma3", lambda: hf_rope(GEMMA3_CONFIG),
     ("result", lambda r: (r[0]["rope_type"], r[0]["rope_theta"], r[1]) == ("linear", 1e6, 10000.0))),
    ("hf rope v4 rope_scaling", lambda: hf_rope({"model_type": "llama", "rope_theta": 5e5, "rope_scaling": {
        "type": "linear", "factor": 2.0}})[0], ("result", lambda r: r == {"rope_type": "linear", "type": "linear",
                                                                          "factor": 2.0, "rope_theta": 5e5})),
    ("hf config llama3", hf(), ("result", has(rope_type="llama3", rope_factor=8.0, original_context=8,
                                              rope_theta=500000.0, sliding_window=None))),
    ("hf config gemma2", lambda: GEMMA2_CFG,
     ("result", has(sliding_window=4, layer_types=("local", "global"), gate_act="gelu_tanh", post_norms=True,
                    embed_scale=True, query_scale=12, attn_softcap=5.0, final_softcap=3.0))),
    ("hf config gemma3 local theta", hf(GEMMA3_CONFIG),
     ("result", has(rope_type="linear", rope_factor=8.0, local_rope_theta=10000.0, rope_theta=1e6))),
    ("hf config v4 rope_scaling", hf(rope_parameters=None, rope_theta=5e5, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8}), ("result", has(rope_type="llama3", rope_theta=5e5))),
    ("hf config str", lambda: long_config_from_hf("config.json"), ("error", TypeError, "hf must be a dict")),
    ("hf config path", lambda: long_config_from_hf(LLAMA3_DIR / "config.json"), ("error", TypeError, "hf must be")),
    ("hf config no model_type", hf(model_type=None), ("error", ValueError, "model_type None; load_long reads")),
    ("hf config phi3", hf(model_type="phi3"), ("error", ValueError, "model_type 'phi3'")),
    ("hf config gemma (v1)", hf(model_type="gemma"), ("error", ValueError, "model_type 'gemma'")),
    ("hf config gpt2", hf(model_type="gpt2"), ("error", ValueError, "load_gpt2")),
    ("hf config rope 'dynamic'", rope(rope_type="dynamic"), ("error", ValueError, "rope_type 'dynamic'")),
    ("hf config rope longrope", rope(rope_type="longrope"), ("error", ValueError, "not built in LongGPT")),
    ("hf config llama3 no original", rope(original_max_position_embeddings=None),
     ("error", ValueError, "without original_max_position_embeddings")),
    ("hf config llama3 no factor", rope(factor=None), ("error", ValueError, "without its factor")),
    ("hf config factor '8'", rope(factor="8"), ("error", TypeError, "rope_parameters.factor must be a number")),
    ("hf config original '8'", rope(original_max_position_embeddings="8"),
     ("error", TypeError, "rope_parameters.original_max_position_embeddings must be an int")),
    ("hf config low_freq_factor None", rope(low_freq_factor=None), ("result", has(low_freq_factor=1.0))),
    ("hf config rope str", hf(rope_parameters="llama3"), ("error", ValueError, "rope_parameters")),
    ("hf config theta str", rope(rope_theta="5e5"), ("error", TypeError, "rope_theta must be a number")),
    ("hf config mscale", rope(rope_type="yarn", mscale=1.0), ("error", ValueError, "mscale")),
    ("hf config attention_bias", hf(attention_bias=True), ("error", ValueError, "attention_bias")),
    ("hf config gelu llama", hf(hidden_act="gelu"), ("error", ValueError, "hidden activation 'gelu'")),
    ("hf config no hidden_size", hf(hidden_size=None), ("error", ValueError, "no 'hidden_size'")),
    ("hf config hidden str", hf(hidden_size="16"), ("error", TypeError, "hidden_size must be an int")),
    ("hf config window '4'", hf(MISTRAL_CONFIG := json.loads((MISTRAL_DIR / "config.json").read_text()),
                                sliding_window="4"), ("error", TypeError, "sliding_window must be an int")),
    ("hf config window 0", hf(MISTRAL_CONFIG, sliding_window=0), ("error", ValueError, "sliding_window")),
    ("hf config mistral window null", hf(MISTRAL_CONFIG, sliding_window=None), ("result", has(sliding_window=None))),
    ("hf config types unknown", hf(GEMMA2_CONFIG, layer_types=["sliding_attention", "chunked_attention"]),
     ("error", ValueError, "layer_types must list ('sliding_attention', 'full_attention')")),
    ("hf config types str", hf(GEMMA2_CONFIG, layer_types="sliding_attention"),
     ("error", ValueError, "layer_types must list")),
    ("hf config types too short", hf(GEMMA2_CONFIG, layer_types=["sliding_attention"]),
     ("error", ValueError, "n_layers=2")),
    ("hf config types, no window", hf(GEMMA2_CONFIG, sliding_window=None), ("error", ValueError,
                                                                           "sliding_window is None")),
    ("hf config softcap '50'", hf(GEMMA2_CONFIG, attn_logit_softcapping="50"),
     ("error", TypeError, "attn_softcap must be a number")),
    ("hf config gemma gelu", hf(GEMMA2_CONFIG, hidden_activation="gelu"),
     ("error", ValueError, "hidden activation 'gelu'")),
    ("hf config query scalar 0", hf(GEMMA2_CONFIG, query_pre_attn_scalar=0), ("error", ValueError, "query_scale")),
    # long_state_from_hf
    ("state ok", lambda: LongGPT(HF_CFG).load_state_dict(long_state_from_hf(HF_STATE, HF_CFG, False)),
     ("result", lambda r: not r.missing_keys and not r.unexpected_keys)),
    ("state gemma 1 + w", lambda: long_state_from_hf(GEMMA2_STATE, GEMMA2_CFG, gemma=True)["final_norm.scale"],
     ("result", lambda s: torch.equal(s, 1.0 + GEMMA2_STATE["model.norm.weight"]))),
    ("state list", lambda: state_refused(list(HF_STATE.values())), ("error", TypeError, "hf_state must be a dict")),
    ("state missing", lambda: state_refused({k: v for k, v in HF_STATE.items() if k != "model.norm.weight"}),
     ("error", ValueError, "missing ['model.norm.weight']")),
    ("state extra", lambda: state_refused(HF_STATE | {"model.layers.0.mlp.up_proj.bias": torch.zeros(24)}),
     ("error", ValueError, "not expected ['model.layers.0.mlp.up_proj.bias']")),
    ("state gemma without post norms", lambda: state_refused(GEMMA2_STATE, HF_CFG),
     ("error", ValueError, "not expected")),
    ("state shape", lambda: state_refused(HF_STATE | {"model.norm.weight": torch.ones(8)}),
     ("error", ValueError, "model.norm.weight is torch.float32 (8,), expected a floating-point tensor of shape (16,)")),
    ("state int", lambda: state_refused(HF_STATE | {"model.norm.weight": torch.ones(16, dtype=torch.long)}),
     ("error", ValueError, "model.norm.weight is torch.int64")),
    ("state numpy", lambda: state_refused(HF_STATE | {"model.norm.weight": np.ones(16)}),
     ("error", ValueError, "model.norm.weight is ndarray")),
    ("state NaN", lambda: state_refused(with_value(HF_STATE, "model.layers.1.self_attn.q_proj.weight", math.nan)),
     ("error", ValueError, "ckpt: model.layers.1.self_attn.q_proj.weight holds NaN or infinite values")),
    ("state inf", lambda: state_refused(with_value(GEMMA2_STATE, "model.layers.0.post_feedforward_layernorm.weight",
                                                   math.inf), GEMMA2_CFG, True),
     ("error", ValueError, "post_feedforward_layernorm.weight holds NaN")),
    ("state cfg ModernConfig", lambda: state_refused(HF_STATE, MODERN),
     ("error", TypeError, "cfg must be a LongConfig")),
    ("state cfg dict", lambda: state_refused(HF_STATE, {}), ("error", TypeError, "cfg must be")),
    ("state gemma 'yes'", lambda: state_refused(GEMMA2_STATE, GEMMA2_CFG, "yes"),
     ("error", TypeError, "gemma must be True or False")),
    # load_long: folders, devices, configs, weights
    ("load llama3", lambda: load_long(LLAMA3_DIR), ("result", same_as_hf(LLAMA3_HF))),
    ("load mistral", lambda: load_long(str(MISTRAL_DIR)), ("result", same_as_hf(MISTRAL_HF))),
    ("load gemma2", lambda: load_long(GEMMA2_DIR), ("result", same_as_hf(GEMMA2_HF))),
    ("load gemma3", lambda: load_long(GEMMA3_DIR), ("result", same_as_hf(GEMMA3_HF))),
    ("load eval mode", lambda: load_long(MISTRAL_DIR).training, ("result", lambda t: t is False)),
    ("load path int", lambda: load_refused(3), ("error", TypeError, "path must be a folder")),
    ("load path None", lambda: load_refused(None), ("error", TypeError, "path must be a folder")),
    ("load path bytes", lambda: load_refused(str(LLAMA3_DIR).encode()), ("error", TypeError, "path must be a folder")),
    ("load missing folder", lambda: load_refused(HF_DIR / "nowhere"),
     ("error", FileNotFoundError, "config.json does not exist")),
    ("load the weights file", lambda: load_refused(LLAMA3_DIR / "model.safetensors"),
     ("error", FileNotFoundError, "does not exist")),
    ("load device gpu", lambda: load_refused(LLAMA3_DIR, "gpu"), ("error", ValueError, "device must be None")),
    ("load device meta", lambda: load_refused(LLAMA3_DIR, "meta"), ("error", ValueError, "no numbers")),
    ("load config gpt2", lambda: load_refused(edited({"model_type": "gpt2"})), ("error", ValueError, "load_gpt2")),
    ("load config phi3", lambda: load_refused(edited({"model_type": "phi3"})),
     ("error", ValueError, "model_type 'phi3'; load_long reads")),
    ("load config yarn, no original", lambda: load_refused(edited({"rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}})),
     ("error", ValueError, "without original_max_position_embeddings")),
    ("load config hidden str", lambda: load_refused(edited({"hidden_size": "16"})),
     ("error", TypeError, "hidden_size must be an int")),
    ("load config types unknown", lambda: load_refused(edited({"layer_types": ["sliding_attention", "x"]},
                                                              source=GEMMA2_DIR)),
     ("error", ValueError, "layer_types must list")),
    ("load gemma2 as llama", lambda: load_refused(edited({"model_type": "llama"}, source=GEMMA2_DIR)),
     ("error", ValueError, "hidden activation")),
    ("load missing tensor", lambda: load_refused(edited(drop=("model.layers.0.post_feedforward_layernorm.weight",),
                                                        source=GEMMA2_DIR)),
     ("error", ValueError, "missing ['model.layers.0.post_feedforward_layernorm.weight']")),
    ("load NaN weight", lambda: load_refused(edited(**{"model__embed_tokens__weight": with_value(
        HF_STATE, "model.embed_tokens.weight", math.nan)["model.embed_tokens.weight"]})),
     ("error", ValueError, "model.embed_tokens.weight holds NaN or infinite values")),
    ("load config not json", lambda: load_refused(broken_config()), ("error", ValueError, "is not valid JSON")),
    # the constants
    ("HF_LONG_TYPES", lambda: HF_LONG_TYPES,
     ("result", lambda t: t == ("llama", "qwen3", "mistral", "gemma2", "gemma3_text"))),
]


def broken_config():
    folder = edited()
    (folder / "config.json").write_text("{oops")
    return folder


test_door = door_tests(CASES)


if __name__ == "__main__":  # the counts of issue 47's closing note
    report(CASES)

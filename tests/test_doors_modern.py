"""Issue 41: every public function and class of course_lib.modern (notebook 16), called as a user who has not read
the code might call it: ModernConfig and its fields, the parts (RMSNorm, Rotary and rotate, SwiGLU, the attention,
the block, the embedding), ModernGPT and its forward, kv_cache_bytes, the Hugging Face loader with bad folders,
configs and weights, orthogonalize, Muon's arguments and groups, make_muon and train_variant. Each case is a call and
its expected outcome: ("error", type, a fragment of our message that names the argument) or ("result", check).
`python tests/test_doors_modern.py` counts the outcomes as clear / correct / unclear / silent. A refused load or
training run leaves nothing changed: the folder's files, the random generator, the caches."""

import dataclasses
import hashlib
import json
import math
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from course_lib.config import GPTConfig
from course_lib.doors import modern as modern_door
from course_lib.feedforward import FeedForward
from course_lib.model import GPTModel
from course_lib.modern import (
    HF_MODEL_TYPES, NEWTON_SCHULZ, GroupedQueryAttention, ModernBlock, ModernConfig, ModernGPT, Muon, RMSNorm, Rotary,
    SwiGLU, TokenEmbedding, drop_biases, kv_cache_bytes, load_modern, make_feedforward, make_muon, make_norm,
    modern_config_from_hf, modern_name_map, modern_state_from_hf, orthogonalize, rotate, train_variant,
)
from course_lib.normalization import LayerNorm
from course_lib.training import TrainConfig

from doors import door_tests, report

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

SHAPE = dict(vocab_size=32, context_length=16, emb_dim=16, n_heads=4, n_layers=2, drop_rate=0.0)
LLAMA = dict(norm="rms", positions="rotary", ffn="swiglu", n_kv_heads=2, qk_norm=True, qkv_bias=False, bias=False,
             tie_weights=False)
CFG = ModernConfig(**SHAPE, **LLAMA)
GPT_CFG = GPTConfig(**SHAPE)
torch.manual_seed(0)
MODEL = ModernGPT(CFG).eval()
IDS = torch.tensor([[1, 2, 3, 4]])
FULL = MODEL(IDS).detach()
TCFG = TrainConfig(total_steps=2, batch_size=2, warmup_steps=1, eval_every=2, eval_batches=1)
DATA = torch.arange(200) % 32
X = torch.randn(2, 5, 16)


def config(**changes):
    return lambda: ModernConfig(**(SHAPE | changes))


def has(**expected):
    return lambda cfg: all(getattr(cfg, name) == value for name, value in expected.items())


def close(expected, atol=1e-5):
    return lambda out: out.shape == expected.shape and torch.allclose(out, expected, atol=atol)


# %% Hugging Face folders, written once by transformers, copied and edited per case

HF_SHAPE = dict(vocab_size=32, hidden_size=16, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=16, rms_norm_eps=1e-6, bos_token_id=None,
                eos_token_id=None, pad_token_id=None)
HF_DIR = Path(tempfile.mkdtemp())


def hf_folder(name, model_class, config_class, **config):
    torch.manual_seed(1)
    model = model_class(config_class(**(HF_SHAPE | config))).eval()
    model.save_pretrained(HF_DIR / name)
    return HF_DIR / name, model


LLAMA_DIR, LLAMA_HF = hf_folder("llama", LlamaForCausalLM, LlamaConfig)
TIED_DIR, _ = hf_folder("tied", LlamaForCausalLM, LlamaConfig, tie_word_embeddings=True)
QWEN_DIR, QWEN_HF = hf_folder("qwen3", Qwen3ForCausalLM, Qwen3Config, head_dim=8)
SHARDED_DIR = HF_DIR / "sharded"
LLAMA_HF.save_pretrained(SHARDED_DIR, max_shard_size="20KB")
HF_CONFIG = json.loads((LLAMA_DIR / "config.json").read_text())
HF_STATE = load_file(LLAMA_DIR / "model.safetensors")
HF_CFG = modern_config_from_hf(HF_CONFIG)
TIED_CFG = modern_config_from_hf(json.loads((TIED_DIR / "config.json").read_text()))
TIED_STATE = load_file(TIED_DIR / "model.safetensors")


def edited(config_changes=None, drop=(), source=LLAMA_DIR, **tensors):
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
    """load_modern refused: its error, after checking that the folder and the random generator are unchanged."""
    is_folder = isinstance(folder, (str, Path)) and Path(folder).is_dir()
    before, rng = fingerprint(folder) if is_folder else None, torch.random.get_rng_state()
    try:
        return load_modern(folder, device)
    finally:
        assert (fingerprint(folder) if is_folder else None) == before, "a refused load changed the folder"
        assert torch.equal(rng, torch.random.get_rng_state()), "a refused load drew from the random generator"


def same_as_hf(hf_model):
    def check(model):
        with torch.no_grad():
            logits = model(IDS)
            return (logits - hf_model(IDS).logits).abs().max() < 1e-5 and model.out_head.weight.dtype == torch.float32
    return check


def nan_at(key, value=math.nan):
    tensor = HF_STATE[key].clone()
    tensor.view(-1)[3] = value
    return {key.replace(".", "__"): tensor}


def without_weights():
    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    return folder


def with_bin_only():
    folder = without_weights()
    (folder / "pytorch_model.bin").write_bytes(b"")
    return folder


def hf(**changes):
    """modern_config_from_hf of the Llama's config.json with keys changed (None: removed)."""
    return lambda: modern_config_from_hf({k: v for k, v in (HF_CONFIG | changes).items() if v is not None})


def state_refused(state, cfg=HF_CFG):
    """modern_state_from_hf refused: its error, after checking that the caller's dict holds what it held."""
    before = {k: (v, v.clone() if isinstance(v, torch.Tensor) and not v.is_meta else None)
              for k, v in state.items()} if isinstance(state, dict) else None
    try:
        return modern_state_from_hf(state, cfg, source="ckpt")
    finally:
        if before is not None:
            assert before.keys() == state.keys() and all(state[k] is v for k, (v, _) in before.items())
            assert all(bool(((c == v) | ((c != c) & (v != v))).all()) for v, c in before.values() if c is not None)


def forward_refused(then, **kwargs):
    """A cached forward refused: the caches hold what they held before."""
    caches = MODEL.new_kv_caches()
    MODEL(IDS, kv_caches=caches)
    try:
        return MODEL(then, kv_caches=caches, **kwargs)
    finally:
        assert all(len(cache) == 4 for cache in caches), "a refused forward changed the caches"


def cached_then_full():
    caches = MODEL.new_kv_caches()
    MODEL(IDS[:, :3], kv_caches=caches)
    return MODEL(IDS[:, 3:], kv_caches=caches)


# %% Muon

def params(*shapes):
    return [nn.Parameter(torch.randn(*shape)) for shape in shapes]


def muon(groups=None, **kwargs):
    groups = [{"params": params((4, 6)), "muon": True}, {"params": params((6,))}] if groups is None else groups
    return Muon(groups, **({"lr": 0.01} | kwargs))


def stepped(optimizer):
    before = [p.clone() for g in optimizer.param_groups for p in g["params"]]
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.ones_like(p)
    optimizer.step()
    return [not torch.equal(b, p) for b, p in zip(before, (p for g in optimizer.param_groups for p in g["params"]))]


def muon_equals_torch():
    torch.manual_seed(2)
    ours = params((8, 12))[0]
    theirs = nn.Parameter(ours.detach().clone())
    mine = Muon([{"params": [ours], "muon": True}], lr=0.01)
    reference = torch.optim.Muon([theirs], lr=0.01, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for _ in range(2):
        ours.grad = torch.randn_like(ours)
        theirs.grad = ours.grad.clone()
        mine.step()
        reference.step()
    return torch.equal(ours, theirs)


def muon_rebuilt():
    """As a checkpoint rebuilds it: Muon(groups, **the keywords of its signature) and load_state_dict."""
    model = ModernGPT(CFG)
    first = make_muon(model, TCFG)
    stepped(first)
    defaults = {k: first.defaults[k] for k in ("lr", "momentum", "betas", "eps", "weight_decay", "ns_steps")}
    groups = [dict(g) for g in first.param_groups]
    second = Muon(groups, **defaults)
    second.load_state_dict(first.state_dict())
    return second.state_dict()["state"].keys() == first.state_dict()["state"].keys()


def non_leaf():
    return (nn.Parameter(torch.randn(4, 4)) * 2)


def generator_params():
    model = nn.Linear(4, 6)
    opt = Muon([{"params": (p for p in model.parameters() if p.dim() == 2), "muon": True},
                {"params": model.bias}], lr=0.01)
    return [len(g["params"]) for g in opt.param_groups]


# %% train_variant

def train_refused(**changes):
    """train_variant refused before it set the seed: the global random generator is as it was."""
    args = dict(cfg=CFG, train_data=DATA, val_data=DATA, tcfg=TCFG, seed=0, optimizer="adamw", val_batches=1)
    rng = torch.random.get_rng_state()
    try:
        return train_variant(**(args | changes))
    finally:
        assert torch.equal(rng, torch.random.get_rng_state()), "a refused train_variant drew from the generator"


def moved_name():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from course_lib.modern import check_modern_fields
    return check_modern_fields is modern_door.modern_fields and caught[0].category is DeprecationWarning


CASES = [
    # ModernConfig and its fields
    ("config default is GPT-2", lambda: ModernConfig(),
     ("result", lambda c: isinstance(c, GPTConfig) and (c.norm, c.positions, c.ffn) == ("layer", "learned", "gelu"))),
    ("config llama", lambda: CFG, ("result", lambda c: (c.kv_heads, c.dim_per_head, c.ffn_dim) == (2, 4, 42))),
    ("config head_dim given", config(head_dim=8, positions="rotary"), ("result", has(dim_per_head=8))),
    ("config odd head_dim learned", config(head_dim=5), ("result", has(dim_per_head=5))),
    ("config hidden_dim swiglu", config(ffn="swiglu", hidden_dim=24), ("result", lambda c: c.ffn_dim == 24)),
    ("config gelu 4x", config(hidden_dim=64), ("result", lambda c: c.ffn_dim == 64)),
    ("config norm 'RMS'", config(norm="RMS"), ("error", ValueError, "norm must be one of ('layer', 'rms')")),
    ("config norm LayerNorm", config(norm=LayerNorm), ("error", ValueError, "norm must be one of")),
    ("config positions 'rope'", config(positions="rope"), ("error", ValueError, "positions must be one of")),
    ("config ffn 'swish'", config(ffn="swish"), ("error", ValueError, "ffn must be one of")),
    ("config norm_eps 0", config(norm_eps=0), ("error", ValueError, "norm_eps must be in (0, inf)")),
    ("config norm_eps nan", config(norm_eps=math.nan), ("error", ValueError, "norm_eps")),
    ("config norm_eps str", config(norm_eps="1e-5"), ("error", TypeError, "norm_eps must be a number")),
    ("config rope_theta 1", config(rope_theta=1), ("error", ValueError, "rope_theta must be in (1, inf)")),
    ("config rope_theta inf", config(rope_theta=math.inf), ("error", ValueError, "rope_theta")),
    ("config rope_theta str", config(rope_theta="1e4"), ("error", TypeError, "rope_theta must be a number")),
    ("config hidden_dim 0", config(ffn="swiglu", hidden_dim=0), ("error", ValueError, "hidden_dim must be >= 1")),
    ("config hidden_dim float", config(ffn="swiglu", hidden_dim=42.0),
     ("error", TypeError, "hidden_dim must be an int")),
    ("config gelu hidden_dim", config(hidden_dim=40), ("error", ValueError, "hidden_dim 40 with ffn 'gelu'")),
    ("config n_kv_heads 3 of 4", config(n_kv_heads=3), ("error", ValueError, "n_kv_heads 3 does not divide n_heads 4")),
    ("config n_kv_heads 8 of 4", config(n_kv_heads=8), ("error", ValueError, "n_kv_heads 8 does not divide")),
    ("config n_kv_heads 0", config(n_kv_heads=0), ("error", ValueError, "n_kv_heads must be >= 1")),
    ("config n_kv_heads numpy", config(n_kv_heads=np.int64(2)), ("error", TypeError, "n_kv_heads must be an int")),
    ("config head_dim odd rotary", config(head_dim=5, positions="rotary"), ("error", ValueError, "head_dim 5 is odd")),
    ("config derived odd rotary", config(emb_dim=12, positions="rotary"), ("error", ValueError, "head_dim 3 is odd")),
    ("config head_dim 0", config(head_dim=0), ("error", ValueError, "head_dim must be >= 1")),
    ("config qk_norm 1", config(qk_norm=1), ("error", TypeError, "qk_norm must be True or False")),
    ("config bias 'no'", config(bias="no"), ("error", TypeError, "bias must be True or False")),
    ("config GPT-2 field", config(n_heads=3), ("error", ValueError, "not divisible by n_heads 3")),
    ("config unknown field", lambda: ModernConfig(rope="rotary"), ("error", TypeError, "rope")),
    ("config replace keeps checks", lambda: dataclasses.replace(CFG, n_kv_heads=3),
     ("error", ValueError, "n_kv_heads 3 does not divide")),
    ("config frozen", lambda: setattr(CFG, "norm", "layer"), ("error", dataclasses.FrozenInstanceError, "norm")),
    ("check_modern_fields moved", moved_name, ("result", bool)),
    # RMSNorm, make_norm
    ("rmsnorm ok", lambda: RMSNorm(16)(X), ("result", close(X / X.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()))),
    ("rmsnorm bf16 in", lambda: RMSNorm(16)(X.bfloat16()).dtype, ("result", lambda d: d == torch.float32)),
    ("rmsnorm 0", lambda: RMSNorm(0), ("error", ValueError, "emb_dim must be >= 1")),
    ("rmsnorm float", lambda: RMSNorm(16.0), ("error", TypeError, "emb_dim must be an int")),
    ("rmsnorm tensor", lambda: RMSNorm(torch.tensor(16)), ("error", TypeError, "emb_dim must be an int")),
    ("rmsnorm eps 0", lambda: RMSNorm(16, eps=0), ("error", ValueError, "eps must be in (0, inf)")),
    ("rmsnorm eps str", lambda: RMSNorm(16, "1e-6"), ("error", TypeError, "eps must be a number")),
    ("make_norm rms", lambda: make_norm(CFG, 8), ("result", lambda m: isinstance(m, RMSNorm) and m.emb_dim == 8)),
    ("make_norm layer", lambda: make_norm(ModernConfig(), 8), ("result", lambda m: isinstance(m, LayerNorm))),
    ("make_norm GPTConfig", lambda: make_norm(GPT_CFG, 8), ("error", TypeError, "cfg must be a ModernConfig")),
    ("make_norm dim 0", lambda: make_norm(CFG, 0), ("error", ValueError, "dim must be >= 1")),
    # Rotary, rotate
    ("rotary ok", lambda: Rotary(8)(torch.arange(5)), ("result", lambda cs: cs[0].shape == (5, 8)
                                                       and torch.allclose(cs[0] ** 2 + cs[1] ** 2, torch.ones(5, 8)))),
    ("rotary rows", lambda: Rotary(8)(torch.tensor([[0, 1, 2], [0, 0, 1]]))[0].shape,
     ("result", lambda s: s == (2, 3, 8))),
    ("rotary odd", lambda: Rotary(7), ("error", ValueError, "head_dim 7 is odd")),
    ("rotary 0", lambda: Rotary(0), ("error", ValueError, "head_dim must be >= 2")),
    ("rotary float", lambda: Rotary(8.0), ("error", TypeError, "head_dim must be an int")),
    ("rotary theta 1", lambda: Rotary(8, theta=1), ("error", ValueError, "theta must be in (1, inf)")),
    ("rotary theta nan", lambda: Rotary(8, theta=math.nan), ("error", ValueError, "theta")),
    ("rotary theta str", lambda: Rotary(8, "10000"), ("error", TypeError, "theta must be a number")),
    ("rotate keeps lengths", lambda: rotate(X.view(2, 1, 5, 16), *Rotary(16)(torch.arange(5))).norm(dim=-1),
     ("result", close(X.view(2, 1, 5, 16).norm(dim=-1)))),
    ("rotate position 0", lambda: rotate(X.view(2, 1, 5, 16), *Rotary(16)(torch.zeros(5, dtype=torch.long))),
     ("result", close(X.view(2, 1, 5, 16)))),
    # SwiGLU, drop_biases, make_feedforward
    ("swiglu ok", lambda: SwiGLU(CFG)(X).shape, ("result", lambda s: s == (2, 5, 16))),
    ("swiglu GPTConfig", lambda: SwiGLU(GPT_CFG), ("error", TypeError, "cfg must be a ModernConfig, got GPTConfig")),
    ("swiglu dict", lambda: SwiGLU(SHAPE), ("error", TypeError, "cfg must be a ModernConfig, got dict")),
    ("drop_biases ok", lambda: drop_biases(FeedForward(GPT_CFG)) is None, ("result", bool)),
    ("drop_biases str", lambda: drop_biases("ff"), ("error", TypeError, "module must be a Module")),
    ("drop_biases params", lambda: drop_biases(MODEL.parameters()), ("error", TypeError, "module must be a Module")),
    ("make_feedforward swiglu", lambda: make_feedforward(CFG), ("result", lambda m: isinstance(m, SwiGLU))),
    ("make_feedforward gelu no bias", lambda: make_feedforward(ModernConfig(**SHAPE, bias=False)),
     ("result", lambda m: isinstance(m, FeedForward) and m.fc.bias is None and m.proj.bias is None)),
    ("make_feedforward GPTConfig", lambda: make_feedforward(GPT_CFG),
     ("error", TypeError, "cfg must be a ModernConfig")),
    # GroupedQueryAttention, ModernBlock, TokenEmbedding
    ("gqa ok", lambda: GroupedQueryAttention(CFG).eval()(X, torch.arange(5)).shape,
     ("result", lambda s: s == (2, 5, 16))),
    ("gqa weights", lambda: GroupedQueryAttention(CFG).attention_weights(X),
     ("result", lambda w: w.shape == (2, 4, 5, 5) and torch.allclose(w.sum(-1), torch.ones(2, 4, 5)))),
    ("gqa GPTConfig", lambda: GroupedQueryAttention(GPT_CFG), ("error", TypeError, "cfg must be a ModernConfig")),
    ("block ok", lambda: ModernBlock(CFG)(X, positions=torch.arange(5)).shape, ("result", lambda s: s == (2, 5, 16))),
    ("block GPTConfig", lambda: ModernBlock(GPT_CFG), ("error", TypeError, "cfg must be a ModernConfig")),
    ("token embedding ok", lambda: TokenEmbedding(CFG)(IDS).shape, ("result", lambda s: s == (1, 4, 16))),
    ("token embedding dict", lambda: TokenEmbedding(SHAPE), ("error", TypeError, "cfg must be a ModernConfig")),
    # kv_cache_bytes
    ("kv bytes ok", lambda: kv_cache_bytes(CFG, 10), ("result", lambda n: n == 2 * 2 * 10 * 2 * 4 * 2)),
    ("kv bytes 0 tokens", lambda: kv_cache_bytes(CFG, 0), ("result", lambda n: n == 0)),
    ("kv bytes tokens -1", lambda: kv_cache_bytes(CFG, -1), ("error", ValueError, "tokens must be >= 0")),
    ("kv bytes tokens float", lambda: kv_cache_bytes(CFG, 8192.0), ("error", TypeError, "tokens must be an int")),
    ("kv bytes batch 0", lambda: kv_cache_bytes(CFG, 10, batch=0), ("error", ValueError, "batch must be >= 1")),
    ("kv bytes dtype", lambda: kv_cache_bytes(CFG, 10, bytes_per_number=torch.bfloat16),
     ("error", TypeError, "bytes_per_number must be an int")),
    ("kv bytes GPTConfig", lambda: kv_cache_bytes(GPT_CFG, 10), ("error", TypeError, "pass the model's ModernConfig")),
    # ModernGPT and its forward
    ("gpt ok", lambda: ModernGPT(CFG)(IDS).shape, ("result", lambda s: s == (1, 4, 32))),
    ("gpt GPT-2 switches = GPTModel", lambda: ModernGPT(ModernConfig(**SHAPE)).state_dict().keys(),
     ("result", lambda keys: keys == GPTModel(GPT_CFG).state_dict().keys())),
    ("gpt GPTConfig", lambda: ModernGPT(GPT_CFG), ("error", TypeError, "cfg must be a ModernConfig, got GPTConfig")),
    ("gpt None", lambda: ModernGPT(None), ("error", TypeError, "cfg must be a ModernConfig, got NoneType")),
    ("forward cached = full", cached_then_full, ("result", close(FULL[:, 3:]))),
    ("forward last_only", lambda: MODEL(IDS, last_only=True), ("result", close(FULL[:, -1:]))),
    ("forward mask of ones", lambda: MODEL(IDS, attention_mask=torch.ones(1, 4, dtype=torch.long)),
     ("result", close(FULL))),
    ("forward left padding",
     lambda: MODEL(torch.tensor([[0, 1, 2, 3, 4]]), attention_mask=torch.tensor([[0, 1, 1, 1, 1]]))[:, 1:],
     ("result", close(FULL))),
    ("forward list", lambda: MODEL([[1, 2]]), ("error", TypeError, "token_ids must be a torch.Tensor")),
    ("forward float ids", lambda: MODEL(IDS.float()), ("error", TypeError, "token_ids must hold integer token ids")),
    ("forward 1-D", lambda: MODEL(IDS[0]), ("error", ValueError, "token_ids must be 2-D")),
    ("forward id = vocab", lambda: MODEL(torch.tensor([[32]])), ("error", ValueError, "token_ids")),
    ("forward too long", lambda: MODEL(torch.zeros(1, 17, dtype=torch.long)), ("error", ValueError, "17 tokens")),
    ("forward last_only 'yes'", lambda: MODEL(IDS, last_only="yes"), ("error", TypeError, "last_only")),
    ("forward caches of GPTModel", lambda: MODEL(IDS, kv_caches=[None, None]), ("error", ValueError, "kv_caches")),
    ("forward caches 1 of 2", lambda: MODEL(IDS, kv_caches=MODEL.new_kv_caches()[:1]), ("error", ValueError,
                                                                                        "kv_caches")),
    ("forward past cache", lambda: forward_refused(torch.zeros(1, 13, dtype=torch.long)),
     ("error", ValueError, "13 tokens")),
    ("forward cache other batch", lambda: forward_refused(torch.zeros(2, 1, dtype=torch.long)),
     ("error", ValueError, "kv_caches hold 1 rows")),
    ("forward mask float", lambda: MODEL(IDS, attention_mask=torch.ones(1, 4)), ("error", TypeError, "attention_mask")),
    ("forward mask list", lambda: MODEL(IDS, attention_mask=[[1, 1, 1, 1]]), ("error", TypeError, "attention_mask")),
    ("forward mask shape", lambda: MODEL(IDS, attention_mask=torch.ones(1, 3, dtype=torch.long)),
     ("error", ValueError, "attention_mask must be shaped")),
    ("forward mask 2s", lambda: MODEL(IDS, attention_mask=torch.full((1, 4), 2)), ("error", ValueError, "only 1")),
    ("forward mask without cached",
     lambda: forward_refused(IDS[:, :1], attention_mask=torch.ones(1, 1, dtype=torch.long)),
     ("error", ValueError, "the cached ones included")),
    # modern_config_from_hf
    ("hf config llama", hf(), ("result", has(norm="rms", positions="rotary", ffn="swiglu", n_kv_heads=2, qk_norm=False,
                                             bias=False, qkv_bias=False, hidden_dim=40))),
    ("hf config v4 rope_theta", hf(rope_parameters=None, rope_theta=5e5), ("result", has(rope_theta=5e5))),
    ("hf config no kv heads", hf(num_key_value_heads=None), ("result", lambda c: c.kv_heads == 4)),
    ("hf config str", lambda: modern_config_from_hf("config.json"), ("error", TypeError, "hf must be a dict")),
    ("hf config gpt2", hf(model_type="gpt2"), ("error", ValueError, "model_type 'gpt2'")),
    ("hf config mistral", hf(model_type="mistral"), ("error", ValueError, "load_modern reads ('llama', 'qwen3')")),
    ("hf config llama3 rope", hf(rope_parameters={"rope_type": "llama3", "factor": 8.0}),
     ("error", ValueError, "scaled rotary angles (rope_type 'llama3')")),
    ("hf config rope str", hf(rope_parameters="default"), ("error", ValueError, "rope_parameters")),
    ("hf config attention_bias", hf(attention_bias=True), ("error", ValueError, "attention_bias")),
    ("hf config gelu", hf(hidden_act="gelu"), ("error", ValueError, "hidden_act 'gelu'")),
    ("hf config sliding", hf(use_sliding_window=True), ("error", ValueError, "sliding-window attention")),
    ("hf config no intermediate", hf(intermediate_size=None), ("error", ValueError, "no 'intermediate_size'")),
    ("hf config no eps", hf(rms_norm_eps=None), ("error", ValueError, "no 'rms_norm_eps'")),
    ("hf config hidden str", hf(hidden_size="16"), ("error", TypeError, "hidden_size must be an int")),
    ("hf config layers 0", hf(num_hidden_layers=0), ("error", ValueError, "num_hidden_layers must be >= 1")),
    ("hf config kv 0", hf(num_key_value_heads=0), ("error", ValueError, "num_key_value_heads must be >= 1")),
    ("hf config kv 3", hf(num_key_value_heads=3), ("error", ValueError, "n_kv_heads 3 does not divide n_heads 4")),
    ("hf config heads 3", hf(num_attention_heads=3), ("error", ValueError, "not divisible by n_heads 3")),
    ("hf config eps 0", hf(rms_norm_eps=0), ("error", ValueError, "rms_norm_eps must be in (0, inf)")),
    ("hf config theta str", hf(rope_parameters={"rope_type": "default", "rope_theta": "1e4"}),
     ("error", TypeError, "rope_theta must be a number")),
    ("hf config tie 'false'", hf(tie_word_embeddings="false"), ("error", TypeError, "tie_word_embeddings")),
    # modern_name_map
    ("name map llama", lambda: modern_name_map(HF_CFG), ("result", lambda n: len(n) == 3 + 9 * 2
                                                         and set(n.values()) == ModernGPT(HF_CFG).state_dict().keys())),
    ("name map qwen3", lambda: modern_name_map(CFG), ("result", lambda n: len(n) == 3 + 11 * 2)),
    ("name map GPT-2 config", lambda: modern_name_map(ModernConfig()),
     ("error", ValueError, "modern_name_map names the tensors of a Llama or Qwen3")),
    ("name map GPTConfig", lambda: modern_name_map(GPT_CFG), ("error", TypeError, "modern_config_from_hf(...)")),
    # modern_state_from_hf
    ("state ok", lambda: ModernGPT(HF_CFG).load_state_dict(modern_state_from_hf(HF_STATE, HF_CFG)),
     ("result", lambda r: not r.missing_keys and not r.unexpected_keys)),
    ("state tied, head stored", lambda: modern_state_from_hf(TIED_STATE | {"lm_head.weight": TIED_STATE[
        "model.embed_tokens.weight"]}, TIED_CFG), ("result", lambda s: s["out_head.weight"] is s[
            "embedding.tok_emb.weight"])),
    ("state list", lambda: state_refused(list(HF_STATE.values())), ("error", TypeError, "hf_state must be a dict")),
    ("state missing", lambda: state_refused({k: v for k, v in HF_STATE.items() if k != "model.norm.weight"}),
     ("error", ValueError, "missing ['model.norm.weight']")),
    ("state extra", lambda: state_refused(HF_STATE | {"model.layers.0.mlp.up_proj.bias": torch.zeros(40)}),
     ("error", ValueError, "not expected ['model.layers.0.mlp.up_proj.bias']")),
    ("state shape", lambda: state_refused(HF_STATE | {"model.norm.weight": torch.ones(8)}),
     ("error", ValueError, "model.norm.weight is torch.float32 (8,), expected a floating-point tensor of shape (16,)")),
    ("state int", lambda: state_refused(HF_STATE | {"model.norm.weight": torch.ones(16, dtype=torch.long)}),
     ("error", ValueError, "model.norm.weight is torch.int64")),
    ("state numpy", lambda: state_refused(HF_STATE | {"model.norm.weight": np.ones(16)}),
     ("error", ValueError, "model.norm.weight is ndarray")),
    ("state meta", lambda: state_refused(HF_STATE | {"model.norm.weight": torch.ones(16, device="meta")}),
     ("error", ValueError, "on meta, without data")),
    ("state NaN", lambda: state_refused(HF_STATE | {"model.norm.weight": torch.full((16,), math.nan)}),
     ("error", ValueError, "ckpt: model.norm.weight holds NaN or infinite values")),
    ("state tied head differs", lambda: state_refused(TIED_STATE | {"lm_head.weight": torch.zeros(32, 16)}, TIED_CFG),
     ("error", ValueError, "says tie_word_embeddings, but lm_head.weight differs")),
    ("state cfg GPT-2", lambda: state_refused(HF_STATE, ModernConfig()), ("error", ValueError, "modern_name_map")),
    # load_modern: folders, devices, configs, weights
    ("load llama", lambda: load_modern(LLAMA_DIR), ("result", same_as_hf(LLAMA_HF))),
    ("load qwen3", lambda: load_modern(str(QWEN_DIR)), ("result", same_as_hf(QWEN_HF))),
    ("load sharded", lambda: load_modern(SHARDED_DIR), ("result", same_as_hf(LLAMA_HF))),
    ("load tied", lambda: load_modern(TIED_DIR), ("result", lambda m: m.out_head.weight is m.embedding.tok_emb.weight)),
    ("load eval mode", lambda: load_modern(LLAMA_DIR).training, ("result", lambda t: t is False)),
    ("load device torch.device", lambda: load_modern(LLAMA_DIR, torch.device("cpu")).out_head.weight.device,
     ("result", lambda d: d.type == "cpu")),
    ("load path int", lambda: load_refused(3), ("error", TypeError, "path must be a folder")),
    ("load path None", lambda: load_refused(None), ("error", TypeError, "path must be a folder")),
    ("load missing folder", lambda: load_refused(HF_DIR / "nowhere"), ("error", FileNotFoundError,
                                                                       "config.json does not exist")),
    ("load the config file", lambda: load_refused(LLAMA_DIR / "config.json"), ("error", FileNotFoundError,
                                                                               "does not exist")),
    ("load no weights", lambda: load_refused(without_weights()), ("error", FileNotFoundError,
                                                                  "model.safetensors does not exist")),
    ("load bin only", lambda: load_refused(with_bin_only()), ("error", FileNotFoundError, "pytorch_model.bin")),
    ("load device gpu", lambda: load_refused(LLAMA_DIR, "gpu"), ("error", ValueError, "device must be None")),
    ("load device meta", lambda: load_refused(LLAMA_DIR, "meta"), ("error", ValueError, "no numbers")),
    ("load device cuda:99", lambda: load_refused(LLAMA_DIR, "cuda:99"), ("error", ValueError, "no such device")),
    ("load config gpt2", lambda: load_refused(edited({"model_type": "gpt2"})), ("error", ValueError, "load_gpt2")),
    ("load config not json", lambda: load_refused(broken_config()),
     ("error", ValueError, "is not valid JSON")),
    ("load config hidden str", lambda: load_refused(edited({"hidden_size": "16"})),
     ("error", TypeError, "hidden_size must be an int")),
    ("load config bigger ffn", lambda: load_refused(edited({"intermediate_size": 48})),
     ("error", ValueError, "model.layers.0.mlp.gate_proj.weight is torch.float32 (40, 16), expected a floating-point "
      "tensor of shape (48, 16)")),
    ("load config tied, head differs", lambda: load_refused(edited({"tie_word_embeddings": True})),
     ("error", ValueError, "lm_head.weight differs from the embedding")),
    ("load truncated weights", lambda: load_refused(truncated()), ("error", ValueError,
                                                                   "is not a readable safetensors file")),
    ("load NaN weight", lambda: load_refused(edited(**nan_at("model.layers.1.self_attn.q_proj.weight"))),
     ("error", ValueError, "model.layers.1.self_attn.q_proj.weight holds NaN or infinite values")),
    ("load inf weight", lambda: load_refused(edited(**nan_at("model.embed_tokens.weight", math.inf))),
     ("error", ValueError, "model.embed_tokens.weight holds NaN or infinite values")),
    ("load missing tensor", lambda: load_refused(edited(drop=("model.norm.weight",))),
     ("error", ValueError, "missing ['model.norm.weight']")),
    ("load int weight", lambda: load_refused(edited(model__norm__weight=torch.ones(16, dtype=torch.int32))),
     ("error", ValueError, "model.norm.weight is torch.int32")),
    ("load bf16 weights", lambda: load_modern(bf16_folder()).out_head.weight.dtype,
     ("result", lambda d: d == torch.float32)),
    # orthogonalize
    ("orth ok", lambda: torch.linalg.svdvals(orthogonalize(torch.randn(8, 24)).float()),
     ("result", lambda s: 0.5 < s.min() and s.max() < 1.3)),
    ("orth tall", lambda: orthogonalize(torch.randn(24, 8)).shape, ("result", lambda s: s == (24, 8))),
    ("orth NEWTON_SCHULZ", lambda: NEWTON_SCHULZ, ("result", lambda c: c == (3.4445, -4.7750, 2.0315))),
    ("orth 1-D", lambda: orthogonalize(torch.randn(8)), ("error", ValueError, "matrix must be 2-D")),
    ("orth 3-D", lambda: orthogonalize(torch.randn(2, 8, 8)), ("error", ValueError, "matrix must be 2-D")),
    ("orth list", lambda: orthogonalize([[1.0, 0.0], [0.0, 1.0]]), ("error", TypeError, "matrix must be a Tensor")),
    ("orth steps 0", lambda: orthogonalize(torch.randn(4, 4), steps=0), ("error", ValueError, "steps must be >= 1")),
    ("orth steps float", lambda: orthogonalize(torch.randn(4, 4), 5.0), ("error", TypeError, "steps must be an int")),
    # Muon
    ("muon = torch.optim.Muon", muon_equals_torch, ("result", bool)),
    ("muon steps both groups", lambda: stepped(muon()), ("result", lambda changed: all(changed))),
    ("muon generator params", generator_params, ("result", lambda n: n == [1, 1])),
    ("muon group lr 0", lambda: muon([{"params": params((4, 4)), "muon": True, "lr": 0.0}]),
     ("result", lambda o: o.param_groups[0]["lr"] == 0.0)),
    ("muon list betas", lambda: muon(betas=[0.9, 0.95]),
     ("result", lambda o: list(o.defaults["betas"]) == [0.9, 0.95])),
    ("muon step closure", lambda: muon().step(lambda: torch.tensor(2.5)), ("result", lambda loss: loss == 2.5)),
    ("muon rebuilt from a checkpoint", muon_rebuilt, ("result", bool)),
    ("muon lr 0", lambda: muon(lr=0), ("error", ValueError, "lr must be in (0, inf)")),
    ("muon lr nan", lambda: muon(lr=math.nan), ("error", ValueError, "lr must be in")),
    ("muon lr str", lambda: muon(lr="0.01"), ("error", TypeError, "lr must be a number")),
    ("muon lr tensor", lambda: muon(lr=torch.tensor(0.01)), ("error", TypeError, "lr must be a number")),
    ("muon momentum 1", lambda: muon(momentum=1.0), ("error", ValueError, "momentum must be in [0, 1)")),
    ("muon betas one", lambda: muon(betas=(0.9,)), ("error", TypeError, "betas must be a pair")),
    ("muon betas 0.9", lambda: muon(betas=0.9), ("error", TypeError, "betas must be a pair")),
    ("muon beta2 1", lambda: muon(betas=(0.9, 1.0)), ("error", ValueError, "betas' beta2 must be in [0, 1)")),
    ("muon eps -1", lambda: muon(eps=-1e-8), ("error", ValueError, "eps must be in [0, inf)")),
    ("muon decay -0.1", lambda: muon(weight_decay=-0.1), ("error", ValueError, "weight_decay must be in")),
    ("muon ns_steps 0", lambda: muon(ns_steps=0), ("error", ValueError, "ns_steps must be >= 1")),
    ("muon ns_steps 5.0", lambda: muon(ns_steps=5.0), ("error", TypeError, "ns_steps must be an int")),
    ("muon parameters()", lambda: Muon(MODEL.parameters(), lr=0.01), ("error", ValueError, "groups must be a list")),
    ("muon list of tensors", lambda: Muon(params((4, 4)), lr=0.01), ("error", ValueError, "groups must be a list")),
    ("muon no groups", lambda: Muon([], lr=0.01), ("error", ValueError, "groups must be a list")),
    ("muon no muon group", lambda: muon([{"params": params((4, 4))}]), ("error", ValueError,
                                                                        "at least one of them with muon=True")),
    ("muon vector in muon group", lambda: muon([{"params": params((4, 4), (4,)), "muon": True}]),
     ("error", ValueError, "not a matrix")),
    ("muon muon=1", lambda: muon([{"params": params((4, 4)), "muon": 1}]), ("error", TypeError, "groups[0]['muon']")),
    ("muon params set", lambda: muon([{"params": set(params((4, 4))), "muon": True}]),
     ("error", TypeError, "groups[0]['params'] must be a list of tensors")),
    ("muon params module", lambda: muon([{"params": nn.Linear(4, 4), "muon": True}]),
     ("error", TypeError, "groups[0]['params'] must be a list")),
    ("muon params no key", lambda: muon([{"muon": True}]), ("error", TypeError, "groups[0]['params']")),
    ("muon params numbers", lambda: muon([{"params": [1.0, 2.0], "muon": True}]),
     ("error", TypeError, "groups[0]['params'] holds float")),
    ("muon non-leaf", lambda: muon([{"params": [non_leaf()], "muon": True}]), ("error", TypeError, "not a leaf")),
    ("muon twice", lambda: muon([{"params": (p := params((4, 4))), "muon": True}, {"params": p}]),
     ("error", ValueError, "an earlier group holds too")),
    ("muon group lr -1", lambda: muon([{"params": params((4, 4)), "muon": True}, {"params": params((4,)), "lr": -1}]),
     ("error", ValueError, "groups[1]: lr must be in [0, inf)")),
    ("muon group decay str", lambda: muon([{"params": params((4, 4)), "muon": True, "weight_decay": "0.1"}]),
     ("error", TypeError, "groups[0]: weight_decay must be a number")),
    # make_muon
    ("make_muon ok", lambda: make_muon(MODEL, TCFG), ("result", lambda o: len(o.param_groups) == 3 and all(
        p.dim() == 2 for p in o.param_groups[0]["params"]) and o.param_groups[0]["muon"] is True)),
    ("make_muon GPTModel", lambda: make_muon(GPTModel(GPT_CFG), TCFG), ("result", lambda o: isinstance(o, Muon))),
    ("make_muon model str", lambda: make_muon("model", TCFG), ("error", TypeError, "model must be a Module")),
    ("make_muon tcfg None", lambda: make_muon(MODEL, None), ("error", TypeError, "tcfg must be a TrainConfig")),
    ("make_muon tcfg dict", lambda: make_muon(MODEL, {"max_lr": 1e-3}), ("error", TypeError, "tcfg")),
    ("make_muon Linear", lambda: make_muon(nn.Linear(4, 4), TCFG), ("error", ValueError, "no trainable matrix in "
                                                                    "trf_blocks")),
    # train_variant
    ("train ok", lambda: train_variant(CFG, DATA, DATA, TCFG, val_batches=1),
     ("result", lambda r: isinstance(r[0], ModernGPT) and math.isfinite(r[1]["val_loss"])
      and r[1]["parameters"] == sum(p.numel() for p in r[0].parameters()))),
    ("train muon", lambda: train_variant(CFG, DATA, DATA, TCFG, optimizer="muon", val_batches=1)[1]["val_loss"],
     ("result", math.isfinite)),
    ("train optimizer sgd", lambda: train_refused(optimizer="sgd"), ("error", ValueError,
                                                                     "optimizer must be 'adamw' or 'muon'")),
    ("train optimizer Muon", lambda: train_refused(optimizer="Muon"), ("error", ValueError, "got 'Muon'")),
    ("train optimizer object", lambda: train_refused(optimizer=muon()), ("error", ValueError, "optimizer must be")),
    ("train cfg GPTConfig", lambda: train_refused(cfg=GPT_CFG), ("error", TypeError, "cfg must be a ModernConfig")),
    ("train tcfg dict", lambda: train_refused(tcfg={}), ("error", TypeError, "tcfg must be a TrainConfig")),
    ("train seed float", lambda: train_refused(seed=1.5), ("error", TypeError, "seed must be an int")),
    ("train seed str", lambda: train_refused(seed="0"), ("error", TypeError, "seed must be an int")),
    ("train val_batches 0", lambda: train_refused(val_batches=0), ("error", ValueError, "val_batches must be >= 1")),
    ("train data list", lambda: train_refused(train_data=DATA.tolist()), ("error", TypeError, "train_data")),
    ("train data float", lambda: train_refused(train_data=DATA.float()), ("error", TypeError, "train_data")),
    ("train data 2-D", lambda: train_refused(train_data=DATA.view(10, 20)), ("error", ValueError, "train_data")),
    ("train data ids", lambda: train_refused(train_data=DATA + 32), ("error", ValueError, "train_data")),
    ("train val short", lambda: train_refused(val_data=DATA[:16]), ("error", ValueError, "val_data has 16 tokens")),
    # the constants
    ("HF_MODEL_TYPES", lambda: HF_MODEL_TYPES, ("result", lambda t: t == ("llama", "qwen3"))),
]


def broken_config():
    folder = edited()
    (folder / "config.json").write_text("{oops")
    return folder


def truncated():
    folder = edited()
    raw = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    return folder


def bf16_folder():
    return edited(**{k.replace(".", "__"): v.bfloat16() for k, v in HF_STATE.items()})


test_door = door_tests(CASES)


if __name__ == "__main__":  # the counts of issue 41's closing note
    report(CASES)

"""Not a lesson: the doors of notebook 16 (course_lib/modern.py): a ModernConfig's new fields, the config every part
of a modern model is built from (its forward is GPTModel's, with GPTModel's door), a Hugging Face Llama or Qwen3
folder (its config.json and its tensors, refused before anything is built), Muon's groups and hyperparameters, and
the arguments of make_muon and train_variant. The parts' forwards (RMSNorm, rotary, SwiGLU, attention) have none:
what reaches them was checked here, at the edge."""

import math
import os
from pathlib import Path

import torch
from torch import Tensor, nn

from ..config import GPTConfig
from ..guards import (as_device, require_bool, require_int, require_number, require_token_tensor, require_type,
                      require_weight)
from ..model import GPTModel
from ..training import TrainConfig

MODERN_FIELDS = ("norm", "norm_eps", "positions", "rope_theta", "ffn", "hidden_dim", "n_kv_heads", "head_dim",
                 "qk_norm", "bias")  # the fields ModernConfig adds to GPTConfig
CHOICES = {"norm": ("layer", "rms"), "positions": ("learned", "rotary"), "ffn": ("gelu", "swiglu")}
HF_INTS = ("vocab_size", "max_position_embeddings", "hidden_size", "num_attention_heads", "num_hidden_layers",
           "intermediate_size")  # the keys of config.json that ModernConfig's sizes come from
HF_REQUIRED = HF_INTS[:5] + ("rms_norm_eps",) + HF_INTS[5:]  # in the order modern_config_from_hf reads them
HF_OPTIONAL = ("num_key_value_heads", "head_dim")  # None (or absent): derived from the others
THETA_WHY = "the slowest rotation turns once every 2 pi theta positions; Llama uses 10000 or more"


def modern_fields(cfg) -> None:
    """ModernConfig's __post_init__: the new fields, known choices, and head counts and widths that fit together."""
    for name, allowed in CHOICES.items():
        if getattr(cfg, name) not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {getattr(cfg, name)!r}")
    require_number("norm_eps", cfg.norm_eps, 0, math.inf, low_open=True, high_open=True)
    require_number("rope_theta", cfg.rope_theta, 1, math.inf, low_open=True, high_open=True, why=THETA_WHY)
    for name in ("hidden_dim", "n_kv_heads", "head_dim"):
        if getattr(cfg, name) is not None:  # None: derived from the other fields
            require_int(name, getattr(cfg, name), minimum=1)
    require_bool("qk_norm", cfg.qk_norm)
    require_bool("bias", cfg.bias)
    if cfg.ffn == "gelu" and cfg.hidden_dim not in (None, 4 * cfg.emb_dim):
        raise ValueError(f"hidden_dim {cfg.hidden_dim} with ffn 'gelu': GPT-2's feed-forward is 4 * emb_dim = "
                         f"{4 * cfg.emb_dim} wide; leave hidden_dim None, or use ffn='swiglu'")
    if cfg.n_kv_heads is not None and cfg.n_heads % cfg.n_kv_heads:
        raise ValueError(f"n_kv_heads {cfg.n_kv_heads} does not divide n_heads {cfg.n_heads}: every key/value head "
                         f"serves the same number of query heads; pick a divisor of {cfg.n_heads}")
    head_dim = cfg.emb_dim // cfg.n_heads if cfg.head_dim is None else cfg.head_dim
    if cfg.positions == "rotary" and head_dim % 2:
        raise ValueError(f"head_dim {head_dim} is odd: rotary turns pairs of dimensions; choose an even head_dim")


def modern_config(cfg, fix: str = "build one with ModernConfig(...); ModernConfig() is GPT-2") -> None:
    """A ModernConfig, the one thing every part of a modern model is built from (a GPTConfig lacks the switches,
    a dict would fail later with an AttributeError that says nothing about the config). Known by its switches: a
    GPTConfig that has them all, so that the notebook's own class, defined before it is exported, passes too."""
    if not (isinstance(cfg, GPTConfig) and all(hasattr(cfg, name) for name in MODERN_FIELDS)):
        raise TypeError(f"cfg must be a ModernConfig, got {type(cfg).__name__}: {fix}")


def make_norm(cfg, dim: int) -> None:
    """make_norm: a ModernConfig, and a width of at least 1."""
    modern_config(cfg)
    require_int("dim", dim, minimum=1)


def rms_norm(emb_dim: int, eps: float) -> None:
    """RMSNorm(emb_dim, eps): a width of at least 1, and eps > 0 (with 0 a vector of zeros divides by zero)."""
    require_int("emb_dim", emb_dim, minimum=1)
    require_number("eps", eps, 0, math.inf, low_open=True, high_open=True, why="it keeps the root above 0")


def rotary(head_dim: int, theta: float) -> None:
    """Rotary(head_dim, theta): pairs of dimensions, and a base above 1 (at 1 nothing turns)."""
    require_int("head_dim", head_dim, minimum=2)
    if head_dim % 2:
        raise ValueError(f"head_dim {head_dim} is odd: rotary turns pairs of dimensions; choose an even head_dim")
    require_number("theta", theta, 1, math.inf, low_open=True, high_open=True, why=THETA_WHY)


def drop_biases(module) -> None:
    """drop_biases: a module (its nn.Linear layers lose their biases)."""
    require_type("module", module, nn.Module, "pass the layer (an nn.Module) whose nn.Linear biases to remove")


def kv_cache_bytes(cfg, tokens: int, batch: int, bytes_per_number: int) -> None:
    """kv_cache_bytes: a ModernConfig, and counts (tokens may be 0)."""
    modern_config(cfg, "pass the model's ModernConfig")
    require_int("tokens", tokens, minimum=0)
    require_int("batch", batch, minimum=1)
    require_int("bytes_per_number", bytes_per_number, minimum=1)


def hf_config(hf, source: str) -> None:
    """modern_config_from_hf: a parsed config.json of a Llama or Qwen3 that ModernGPT builds, with every number it
    reads, named by its key in the file."""
    from ..modern import HF_MODEL_TYPES  # this lesson's own list: imported when called, so no import cycle
    require_type("hf", hf, dict, "pass the parsed config.json: json.loads(path.read_text())")
    if hf.get("model_type") not in HF_MODEL_TYPES:
        raise ValueError(f"{source}: model_type {hf.get('model_type')!r}; load_modern reads {HF_MODEL_TYPES} "
                         "(for GPT-2 use load_gpt2 of notebook 10; for Mistral, Gemma 2 and Gemma 3 load_long of "
                         "notebook 17, course_lib.long_context)")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}  # transformers 5 names, then older ones
    if not isinstance(rope, dict):
        raise ValueError(f"{source}: rope_parameters (or rope_scaling) is {rope!r}, not an object: save the folder "
                         "again with save_pretrained")
    refused = {"scaled rotary angles (rope_type " + repr(rope.get("rope_type", rope.get("type"))) + ")":
               rope.get("rope_type", rope.get("type", "default")) not in ("default", None),
               "attention_bias": hf.get("attention_bias", False), "mlp_bias": hf.get("mlp_bias", False),
               "sliding-window attention": hf.get("use_sliding_window", False),
               f"hidden_act {hf.get('hidden_act')!r}": hf.get("hidden_act", "silu") != "silu"}
    if any(refused.values()):
        raise ValueError(f"{source}: {', '.join(k for k, v in refused.items() if v)}: not built in ModernGPT, which "
                         "has plain rotary angles, no biases, full attention and SwiGLU; stretched angles (llama3, "
                         "yarn, linear) and sliding windows load with load_long of notebook 17 "
                         "(course_lib.long_context); the rest needs transformers")
    for key in HF_REQUIRED:
        if key not in hf:
            raise ValueError(f"{source} has no {key!r}: it is not a complete {hf['model_type']} config.json; "
                             "save the folder again with save_pretrained")
    for key in HF_INTS + HF_OPTIONAL:
        if key in HF_INTS or hf.get(key) is not None:
            require_int(f"{source}: {key}", hf[key], minimum=1)
    require_number(f"{source}: rms_norm_eps", hf["rms_norm_eps"], 0, math.inf, low_open=True, high_open=True)
    require_number(f"{source}: rope_theta", rope.get("rope_theta", hf.get("rope_theta", 10000.0)), 1, math.inf,
                   low_open=True, high_open=True, why=THETA_WHY)
    require_bool(f"{source}: tie_word_embeddings", hf.get("tie_word_embeddings", False))


def name_map(cfg) -> None:
    """modern_name_map: the config of a Llama or Qwen3 (RMSNorm, rotary, SwiGLU, no biases), whose tensors it names;
    for another shape the map would name parameters the model does not have and miss those it has."""
    modern_config(cfg, "pass the ModernConfig of the checkpoint, modern_config_from_hf(...)")
    llama = dict(norm="rms", positions="rotary", ffn="swiglu", bias=False, qkv_bias=False)
    if any(getattr(cfg, name) != value for name, value in llama.items()):
        got = ", ".join(f"{name}={getattr(cfg, name)!r}" for name in llama)
        raise ValueError(f"cfg has {got}: modern_name_map names the tensors of a Llama or Qwen3 ("
                         f"{', '.join(f'{k}={v!r}' for k, v in llama.items())}); build cfg with modern_config_from_hf")


def hf_state(hf_state, cfg, names: dict[str, str], source: str, model_class=None) -> None:
    """modern_state_from_hf: every tensor the map names, none more (a tied head may be stored a second time, equal
    to the embedding), each a floating-point tensor of the shape model_class(cfg) gives it (default ModernGPT;
    notebook 17's door passes LongGPT), every number finite. One look at every tensor, in the loader."""
    from ..modern import ModernGPT  # this lesson's own class: imported when called, so no import cycle
    model_class = ModernGPT if model_class is None else model_class
    require_type("hf_state", hf_state, dict, "pass the tensors of the checkpoint, name -> tensor (safetensors' "
                 "load_file)")
    stored_head = cfg.tie_weights and {"lm_head.weight", "model.embed_tokens.weight"} <= hf_state.keys()
    missing = sorted(names.keys() - hf_state.keys())
    unknown = sorted(hf_state.keys() - names.keys() - ({"lm_head.weight"} if stored_head else set()))
    if missing or unknown:
        raise ValueError(f"{source}: the weights do not fit its config.json: missing {missing[:3]}, not expected "
                         f"{unknown[:3]} ({len(missing)} and {len(unknown)} in all)")
    with torch.device("meta"):  # the shapes only: no numbers, no draw from the random generator
        shapes = {name: tuple(p.shape) for name, p in model_class(cfg).state_dict().items()}
    for theirs, ours in names.items():
        require_weight(source, theirs, hf_state[theirs], shapes[ours])
    head = hf_state.get("lm_head.weight")
    if stored_head and not (isinstance(head, Tensor) and torch.equal(head, hf_state["model.embed_tokens.weight"])):
        raise ValueError(f"{source} says tie_word_embeddings, but lm_head.weight differs from the embedding: "
                         "set tie_word_embeddings to false in config.json to load the two matrices")


def load_modern(path, device) -> torch.device:
    """load_modern: a folder that holds config.json and model.safetensors (or its shards), and a device a model can
    be built on here; returns the device (default the CPU). Checked before any file is read."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a folder (a str or a Path), got {type(path).__name__}: pass the folder that "
                        "save_pretrained wrote")
    folder = Path(path)
    weights = (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file()
    if not ((folder / "config.json").is_file() and weights):
        lacking = "config.json" if not (folder / "config.json").is_file() else "model.safetensors"
        hint = (" (this folder has pytorch_model.bin: convert it with AutoModelForCausalLM.from_pretrained(folder)"
                ".save_pretrained(folder))" if (folder / "pytorch_model.bin").exists() else "")
        raise FileNotFoundError(f"{folder / lacking} does not exist{hint}: a Llama or Qwen3 folder holds config.json "
                                "and model.safetensors (or its shards and model.safetensors.index.json), as "
                                "save_pretrained writes them")
    device = as_device("cpu" if device is None else device)
    available = {"cuda": torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count(),
                 "mps": torch.backends.mps.is_available(), "meta": False}
    if not available.get(device.type, True):
        raise ValueError(f"device {str(device)!r} cannot hold the model here" + (
            ": a meta tensor has a shape and no numbers" if device.type == "meta" else
            ": this machine has no such device") + "; pass 'cpu' (the default) or course_lib.config.get_device()")
    return device


def orthogonalize(matrix, steps: int) -> None:
    """orthogonalize: one matrix, and at least one Newton-Schulz step."""
    require_type("matrix", matrix, Tensor, "pass one weight matrix (a gradient or its momentum) as a tensor")
    if matrix.dim() != 2:
        raise ValueError(f"matrix must be 2-D (rows, cols), got shape {tuple(matrix.shape)}: orthogonalize works on "
                         "one weight matrix (a gradient or its momentum)")
    require_int("steps", steps, minimum=1)


def group_settings(where: str, lr, momentum, betas, eps, weight_decay, ns_steps, lr_low_open: bool = True) -> None:
    """The hyperparameters of Muon, or of one of its groups (`where` names which)."""
    require_number(f"{where}lr", lr, 0, math.inf, low_open=lr_low_open, high_open=True)
    require_number(f"{where}momentum", momentum, 0, 1, high_open=True)
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
        raise TypeError(f"{where}betas must be a pair (beta1, beta2), got {betas!r}: e.g. (0.9, 0.99)")
    for name, beta in zip(("beta1", "beta2"), betas):
        require_number(f"{where}betas' {name}", beta, 0, 1, high_open=True, why="the decay of a running average")
    require_number(f"{where}eps", eps, 0, math.inf, high_open=True)
    require_number(f"{where}weight_decay", weight_decay, 0, math.inf, high_open=True)
    require_int(f"{where}ns_steps", ns_steps, minimum=1)


def muon(groups, lr, momentum, betas, eps, weight_decay, ns_steps) -> list[dict]:
    """Muon's constructor: the hyperparameters, and a list of parameter groups (dicts) with at least one muon=True
    group, every parameter a leaf tensor in one group only, muon groups of matrices only. Returns the groups with
    each one's params as a list (a generator is read once, here)."""
    group_settings("", lr, momentum, betas, eps, weight_decay, ns_steps)
    if not (isinstance(groups, list) and groups and all(isinstance(g, dict) for g in groups)
            and any(g.get("muon") for g in groups)):
        raise ValueError("groups must be a list of parameter groups (dicts), at least one of them with muon=True "
                         "(without one, every parameter would get AdamW): build them with make_muon(model, tcfg)")
    listed, seen = [], set()
    for i, group in enumerate(groups):
        params = group.get("params")
        if isinstance(params, Tensor):
            params = [params]
        if not isinstance(params, (list, tuple)) and not hasattr(params, "__next__"):
            raise TypeError(f"groups[{i}]['params'] must be a list of tensors, got {type(params).__name__}: "
                            "e.g. {'params': [p for p in model.parameters() if p.dim() == 2], 'muon': True}")
        params = list(params)
        for p in params:
            if not (isinstance(p, Tensor) and p.is_leaf):
                got = "a tensor computed from others (not a leaf)" if isinstance(p, Tensor) else type(p).__name__
                raise TypeError(f"groups[{i}]['params'] holds {got}: an optimizer updates the model's parameters, "
                                "model.parameters()")
            if id(p) in seen:
                raise ValueError(f"groups[{i}] holds a parameter that an earlier group holds too: each parameter "
                                 "gets one update, so put it in one group only")
            seen.add(id(p))
        require_bool(f"groups[{i}]['muon']", group.get("muon", False))
        settings = dict(lr=lr, momentum=momentum, betas=betas, eps=eps, weight_decay=weight_decay, ns_steps=ns_steps)
        group_settings(f"groups[{i}]: ", **(settings | {k: group[k] for k in settings if k in group}),
                       lr_low_open=False)  # a schedule may set a group's lr to 0 at its end
        if group.get("muon") and any(p.dim() != 2 for p in params):
            raise ValueError("a muon=True group holds a parameter that is not a matrix: Muon orthogonalises 2-D "
                             "weights only; put vectors and other shapes in a group with muon=False (AdamW)")
        listed.append(group | {"params": params})
    return listed


def make_muon(model, tcfg) -> None:
    """make_muon: a model with trainable matrices inside its blocks (trf_blocks), for Muon; without any, every
    parameter would silently get AdamW."""
    require_type("model", model, nn.Module, "pass the ModernGPT (or GPTModel) to train")
    require_type("tcfg", tcfg, TrainConfig, "build one with TrainConfig(...)")
    if not any(p.requires_grad and p.dim() == 2 and name.startswith("trf_blocks.")
               for name, p in model.named_parameters()):
        raise ValueError(f"model ({type(model).__name__}) has no trainable matrix in trf_blocks: make_muon gives Muon "
                         "the 2-D weights of the blocks and AdamW the rest; pass a ModernGPT or GPTModel")


def train_variant(cfg, train_data, val_data, tcfg, seed, optimizer, val_batches, model_class) -> None:
    """train_variant: everything, before the seed is set and a model built (a refusal changes nothing, not even
    the random generator)."""
    modern_config(cfg, "build one with ModernConfig(...)")
    if not (isinstance(model_class, type) and issubclass(model_class, GPTModel)):  # the notebook's own class too
        raise TypeError(f"model_class must be ModernGPT or a subclass of it (LongGPT), got {model_class!r}: pass the "
                        "class itself, not a model")
    if optimizer not in ("adamw", "muon"):
        raise ValueError(f"optimizer must be 'adamw' or 'muon', got {optimizer!r}")
    require_type("tcfg", tcfg, TrainConfig, "build one with TrainConfig(...)")
    require_int("seed", seed)
    require_int("val_batches", val_batches, minimum=1)
    for name, data in (("train_data", train_data), ("val_data", val_data)):
        require_token_tensor(name, data, dims=1, vocab_size=cfg.vocab_size)  # (tokens,)
        if len(data) <= cfg.context_length:
            raise ValueError(f"{name} has {len(data)} tokens: a window of context_length + 1 = "
                             f"{cfg.context_length + 1} does not fit; pass a longer stream or a smaller context_length")

"""Not a lesson: the doors of notebook 10 (course_lib/pretrained.py): a GPT-2 config.json our model can reproduce, a
Hugging Face state dict that fills a GPTModel exactly (every key, shape and value checked before anything is
copied), the name or folder to load from, the device to load to, and the model to save."""

import os

import torch

from ..config import GPTConfig, get_device
from ..guards import as_device, require_int, require_type, require_weight
from ..model import GPTModel


def expand_name_map(n_layers: int) -> None:
    require_int("n_layers", n_layers, minimum=1)


def config_from_hf(hf_config: dict, source: str) -> None:
    """A dict of GPT-2 settings that builds a GPTConfig and that our GPTModel reproduces; refuses, naming the key,
    every setting it would compute differently."""
    from ..pretrained import GPT2_CONFIG_DEFAULTS  # this lesson's own table: imported when called, no import cycle
    if not isinstance(hf_config, dict):
        raise TypeError(f"{source}: hf_config must be a dict of GPT-2 settings (config.json's object), got "
                        f"{type(hf_config).__name__}")
    if hf_config.get("model_type", "gpt2") != "gpt2":
        raise ValueError(f"{source}: model_type is {hf_config['model_type']!r}, not 'gpt2': load_gpt2 reads "
                         "GPT-2 checkpoints only")
    setting = {**GPT2_CONFIG_DEFAULTS, **hf_config}
    if "n_positions" not in hf_config and "n_ctx" in hf_config:  # very old configs name it n_ctx only
        setting["n_positions"] = hf_config["n_ctx"]
    try:
        cfg = GPTConfig(vocab_size=setting["vocab_size"], context_length=setting["n_positions"],
                        emb_dim=setting["n_embd"], n_heads=setting["n_head"], n_layers=setting["n_layer"],
                        drop_rate=setting["resid_pdrop"], qkv_bias=True, tie_weights=setting["tie_word_embeddings"])
    except (TypeError, ValueError) as error:
        raise ValueError(f"{source}: {error} (GPT-2's n_embd is our emb_dim, n_head n_heads, n_layer n_layers, "
                         "n_positions context_length, resid_pdrop drop_rate, tie_word_embeddings tie_weights)"
                         ) from error
    supported = {  # key -> the values our GPTModel reproduces (same JSON type and value)
        "activation_function": ("gelu_new", "gelu_pytorch_tanh"),  # two names of GELU's tanh form
        "layer_norm_epsilon": (1e-5,),
        "n_inner": (None, 4 * cfg.emb_dim),  # the feed-forward width: None means 4 * n_embd
        "scale_attn_weights": (True,),  # scores divided by sqrt(head_dim)
        "scale_attn_by_inverse_layer_idx": (False,),
        "add_cross_attention": (False,),
    }
    for key, allowed in supported.items():
        if not any(type(setting[key]) is type(a) and setting[key] == a for a in allowed):
            raise ValueError(f"{source}: {key} is {setting[key]!r}, but course_lib's GPTModel needs "
                             f"{' or '.join(map(repr, allowed))}, as in GPT-2: our model cannot reproduce it")


def plain_hf_state(hf_state: dict, source: str) -> None:
    """A state dict (name -> tensor) that names no tensor twice, with and without the "transformer." prefix."""
    require_type("hf_state", hf_state, dict, "pass a state dict, name -> tensor, e.g. safetensors' load_file(path)")
    seen = set()
    for key in hf_state:
        name = key.removeprefix("transformer.")  # GPT2LMHeadModel writes "transformer.h.0...", GPT2Model "h.0..."
        if name in seen:
            raise ValueError(f"{source}: {name} is stored twice, with and without the 'transformer.' prefix")
        seen.add(name)


def fill_from_hf(model: GPTModel, hf_state: dict, source: str) -> None:
    """Every key of the state dict used, every parameter of the model filled, every tensor a finite floating-point
    one of the right shape, a stored lm_head equal to wte when the head is tied: all before anything is copied."""
    from ..pretrained import expand_name_map, hf_shapes, plain_hf_state  # this lesson's own: no import cycle
    require_type("model", model, GPTModel, "fill a course_lib GPTModel built from config_from_hf(...)")
    params = dict(model.named_parameters())  # a tied head appears once, as embedding.tok_emb.weight
    tied, rows = model.cfg.tie_weights, expand_name_map(model.cfg.n_layers)
    filled = {ours for ours, *_ in rows} | (set() if tied else {"out_head.weight"})
    if set(params) != filled:  # e.g. a model built with qkv_bias=False
        raise ValueError(f"model and GPT2_NAME_MAP differ in {sorted(set(params) ^ filled)[:3]}: GPT-2 fills "
                         "exactly the parameters of a GPTModel with qkv_bias=True")
    state = plain_hf_state(hf_state, source)
    lm_head = state.pop("lm_head.weight") if tied and "lm_head.weight" in state else None
    expected = hf_shapes(params, rows, tied)
    problems = (("missing key", [k for k in expected if k not in state],
                 "the file is incomplete, or config.json describes a bigger model than the file holds"),
                ("unexpected key", [k for k in state if k not in expected],
                 "it is not a GPT-2 weight, or config.json describes a smaller model than the file holds"))
    for what, keys, why in problems:
        if keys:
            more = f" (and {len(keys) - 1} more: {', '.join(keys[1:4])}{', ...' if len(keys) > 4 else ''})"
            raise ValueError(f"{source}: {what} {keys[0]}{more if len(keys) > 1 else ''}: {why}")
    for key, shape in expected.items():
        require_weight(source, key, state[key], shape)
    if lm_head is not None and not torch.equal(lm_head, state["wte.weight"]):  # False for another shape too
        raise ValueError(f"{source}: lm_head.weight differs from wte.weight, but the config ties them: set "
                         "tie_word_embeddings to false in config.json to load a separate output head")


def gpt2_files(path_or_name) -> None:
    """A directory, or the name of a GPT-2 size on the Hub: checked before any download."""
    from ..pretrained import GPT2_HUB_REPOS  # this lesson's own table: imported when called, no import cycle
    if not isinstance(path_or_name, (str, os.PathLike)):
        raise TypeError(f"path_or_name must be a directory or a GPT-2 name like 'gpt2', got {path_or_name!r}")
    if not os.path.isdir(path_or_name) and not (isinstance(path_or_name, str) and path_or_name in GPT2_HUB_REPOS):
        raise ValueError(f"{str(path_or_name)!r} is neither a directory nor a GPT-2 name: pass a directory with "
                         f"config.json and model.safetensors, or one of {', '.join(GPT2_HUB_REPOS)}")


def download_gpt2(name) -> None:
    """A GPT-2 size that can be downloaded now: one of GPT2_HUB_REPOS, HF_HUB_OFFLINE not set, and the Hub's host
    name resolves (one DNS lookup, so an offline machine fails at once, not after huggingface_hub's retries)."""
    from .. import pretrained  # this lesson's own module, read when called (tests replace hub_reachable)
    if not (isinstance(name, str) and name in pretrained.GPT2_HUB_REPOS):
        raise ValueError(f"name must be one of {', '.join(pretrained.GPT2_HUB_REPOS)}, got {name!r}: to load a folder, "
                         "use load_gpt2(folder)")
    if pretrained.hf_constants.HF_HUB_OFFLINE or not pretrained.hub_reachable():
        why = "HF_HUB_OFFLINE is set" if pretrained.hf_constants.HF_HUB_OFFLINE else "there is no network"
        raise OSError(f"{name!r} is not in the Hugging Face cache and {why}, so it cannot be downloaded: online (and "
                      f"without HF_HUB_OFFLINE), load_gpt2({name!r}) downloads it once; offline, copy a folder with "
                      "config.json and model.safetensors here and pass its path, load_gpt2('path/to/folder')")


def load_gpt2(path_or_name, device) -> torch.device:
    """The device to load to (default get_device()); not 'meta', which would keep the shapes and lose the weights."""
    device = get_device() if device is None else as_device(device)
    if device.type == "meta":
        raise ValueError("device 'meta' holds shapes without values, so the loaded weights would be lost: load on "
                         "'cpu', 'cuda' or 'mps' (or None, for get_device())")
    return device


def hf_config_from(cfg, dtype) -> None:
    require_type("cfg", cfg, GPTConfig, "pass the model's config, model.cfg")
    require_type("dtype", dtype, torch.dtype, "pass the weights' dtype, e.g. torch.float32")


def hf_state_from(model) -> None:
    require_type("model", model, GPTModel, "pass a course_lib GPTModel")


def save_gpt2(model, directory) -> None:
    """A GPTModel with finite weights, and a folder path: checked before anything is written."""
    from ..pretrained import expand_name_map  # this lesson's own function: imported when called, no import cycle
    require_type("model", model, GPTModel, "pass a course_lib GPTModel, e.g. from load_gpt2")
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"directory must be a folder path (str or Path), got {directory!r}")
    hf_names = {ours: "transformer." + hf for ours, hf, *_ in expand_name_map(model.cfg.n_layers)}
    hf_names["out_head.weight"] = "lm_head.weight"
    bad = next((name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())), None)
    if bad is not None:  # named as in the file that would have been written
        raise ValueError(f"model's weight {hf_names.get(bad, bad)} holds NaN or infinite values: save a model whose "
                         "weights are finite")

import json
import re
from pathlib import Path

import torch
from huggingface_hub import hf_hub_download
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from course_lib.config import GPTConfig, get_device
from course_lib.model import GPTModel

GPT2_HUB_REPOS = {  # the four sizes OpenAI released, where the Hugging Face Hub keeps them
    "gpt2": "openai-community/gpt2",  # 124M parameters
    "gpt2-medium": "openai-community/gpt2-medium",  # 355M
    "gpt2-large": "openai-community/gpt2-large",  # 774M
    "gpt2-xl": "openai-community/gpt2-xl",  # 1558M
}

# One row per parameter: our name, Hugging Face's name, which third of the fused c_attn tensor it is
# (0 queries, 1 keys, 2 values; None: the whole tensor), and whether it is a Conv1D weight, stored
# (in, out), that must be transposed into nn.Linear's (out, in). "{i}" is the block index.
GPT2_NAME_MAP = (
    ("embedding.tok_emb.weight", "wte.weight", None, False),
    ("embedding.pos_emb.weight", "wpe.weight", None, False),
    ("trf_blocks.{i}.norm1.scale", "h.{i}.ln_1.weight", None, False),
    ("trf_blocks.{i}.norm1.shift", "h.{i}.ln_1.bias", None, False),
    ("trf_blocks.{i}.att.W_query.weight", "h.{i}.attn.c_attn.weight", 0, True),
    ("trf_blocks.{i}.att.W_key.weight", "h.{i}.attn.c_attn.weight", 1, True),
    ("trf_blocks.{i}.att.W_value.weight", "h.{i}.attn.c_attn.weight", 2, True),
    ("trf_blocks.{i}.att.W_query.bias", "h.{i}.attn.c_attn.bias", 0, False),
    ("trf_blocks.{i}.att.W_key.bias", "h.{i}.attn.c_attn.bias", 1, False),
    ("trf_blocks.{i}.att.W_value.bias", "h.{i}.attn.c_attn.bias", 2, False),
    ("trf_blocks.{i}.att.out_proj.weight", "h.{i}.attn.c_proj.weight", None, True),
    ("trf_blocks.{i}.att.out_proj.bias", "h.{i}.attn.c_proj.bias", None, False),
    ("trf_blocks.{i}.norm2.scale", "h.{i}.ln_2.weight", None, False),
    ("trf_blocks.{i}.norm2.shift", "h.{i}.ln_2.bias", None, False),
    ("trf_blocks.{i}.ff.layers.0.weight", "h.{i}.mlp.c_fc.weight", None, True),
    ("trf_blocks.{i}.ff.layers.0.bias", "h.{i}.mlp.c_fc.bias", None, False),
    ("trf_blocks.{i}.ff.layers.2.weight", "h.{i}.mlp.c_proj.weight", None, True),
    ("trf_blocks.{i}.ff.layers.2.bias", "h.{i}.mlp.c_proj.bias", None, False),
    ("final_norm.scale", "ln_f.weight", None, False),
    ("final_norm.shift", "ln_f.bias", None, False),
)

# The causal mask (and the -1e4 fill value) that older checkpoints store as if they were weights. They are
# constants, not learned: our attention builds its own mask, so the loader skips them.
GPT2_MASK_BUFFERS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")

GPT2_CONFIG_DEFAULTS = {  # what Hugging Face's GPT2Config assumes for a key that config.json leaves out
    "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
    "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.1,
    "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False,
    "tie_word_embeddings": True,
}


def expand_name_map(n_layers: int) -> list[tuple[str, str, int | None, bool]]:
    """GPT2_NAME_MAP with "{i}" filled in for blocks 0 .. n_layers - 1: one row per parameter of ours."""
    rows = []
    for ours, hf, part, transpose in GPT2_NAME_MAP:
        blocks = range(n_layers) if "{i}" in ours else [0]
        rows += [(ours.format(i=i), hf.format(i=i), part, transpose) for i in blocks]
    return rows


def config_from_hf(hf_config: dict, source: str = "config") -> tuple[GPTConfig, bool]:
    """Our GPTConfig, and whether the output head is tied, from the dict in a GPT-2 config.json.

    Refuses, naming the key, every setting our GPTModel cannot reproduce; `source` names the file."""
    if not isinstance(hf_config, dict):
        raise TypeError(f"{source}: a config must be a JSON object (dict), got {type(hf_config).__name__}")
    if hf_config.get("model_type", "gpt2") != "gpt2":
        raise ValueError(f"{source}: model_type is {hf_config['model_type']!r}, not 'gpt2': load_gpt2 reads "
                         "GPT-2 checkpoints only")
    setting = {**GPT2_CONFIG_DEFAULTS, **hf_config}
    if "n_positions" not in hf_config and "n_ctx" in hf_config:  # very old configs name it n_ctx only
        setting["n_positions"] = hf_config["n_ctx"]
    for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
        value = setting[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{source}: {key} must be a positive integer, got {value!r}")
    supported = {  # key -> the values our GPTModel reproduces (same JSON type and value)
        "activation_function": ("gelu_new", "gelu_pytorch_tanh"),  # two names of GELU's tanh form
        "layer_norm_epsilon": (1e-5,),
        "n_inner": (None, 4 * setting["n_embd"]),  # the feed-forward width: None means 4 * n_embd
        "scale_attn_weights": (True,),  # scores divided by sqrt(head_dim)
        "scale_attn_by_inverse_layer_idx": (False,),
        "add_cross_attention": (False,),
        "tie_word_embeddings": (True, False),
    }
    for key, allowed in supported.items():
        value = setting[key]
        if not any(type(value) is type(a) and value == a for a in allowed):
            raise ValueError(f"{source}: {key} is {value!r}, but course_lib's GPTModel needs "
                             f"{' or '.join(map(repr, allowed))}, as in GPT-2: this checkpoint is not a "
                             "standard GPT-2, so our model cannot reproduce it")
    try:
        cfg = GPTConfig(vocab_size=setting["vocab_size"], context_length=setting["n_positions"],
                        emb_dim=setting["n_embd"], n_heads=setting["n_head"], n_layers=setting["n_layer"],
                        drop_rate=setting["resid_pdrop"], qkv_bias=True)  # GPT-2's c_attn always has a bias
    except (TypeError, ValueError) as error:
        raise ValueError(f"{source}: {error} (n_embd is our emb_dim, n_head our n_heads, resid_pdrop our "
                         "drop_rate)") from error
    return cfg, setting["tie_word_embeddings"]


def hf_config_from(cfg: GPTConfig, tied: bool, dtype: torch.dtype = torch.float32) -> dict:
    """The config.json of a Hugging Face GPT2LMHeadModel with our model's shape."""
    eos_id = 50256 if cfg.vocab_size > 50256 else None  # <|endoftext|> exists only in GPT-2's vocabulary
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg.vocab_size, "n_positions": cfg.context_length, "n_ctx": cfg.context_length,
        "n_embd": cfg.emb_dim, "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "n_inner": None,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
        "embd_pdrop": cfg.drop_rate, "attn_pdrop": cfg.drop_rate, "resid_pdrop": cfg.drop_rate,
        "initializer_range": 0.02, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "add_cross_attention": False, "use_cache": True,
        "tie_word_embeddings": tied, "bos_token_id": eos_id, "eos_token_id": eos_id,
        "dtype": str(dtype).removeprefix("torch."),
    }


@torch.no_grad()
def fill_from_hf(model: GPTModel, hf_state: dict[str, Tensor], source: str = "state dict") -> None:
    """Copy a Hugging Face GPT-2 state dict (names with or without "transformer.") into `model`.

    Every key must be used, every parameter filled and every shape right; otherwise a ValueError names the
    key. With a tied head, a stored lm_head.weight must equal wte.weight."""
    if not isinstance(model, GPTModel):
        raise TypeError(f"model must be a course_lib GPTModel, got {type(model).__name__}")
    params = dict(model.named_parameters())  # a tied head appears once, as embedding.tok_emb.weight
    tied = "out_head.weight" not in params
    rows = expand_name_map(model.cfg.n_layers)
    absent = [ours for ours, *_ in rows if ours not in params]
    if absent:
        raise ValueError(f"model has no parameter {absent[0]}, but every GPT-2 checkpoint fills one: build "
                         "the model with GPTConfig(qkv_bias=True)")
    state = {}
    for key, tensor in hf_state.items():
        name = key.removeprefix("transformer.")  # GPT2LMHeadModel writes "transformer.h.0...", GPT2Model "h.0..."
        if name in state:
            raise ValueError(f"{source}: {name} is stored twice, with and without the 'transformer.' prefix")
        if not GPT2_MASK_BUFFERS.fullmatch(name):
            state[name] = tensor

    expected = {}  # Hugging Face name -> the shape it must have to fill our parameters
    for ours, hf, part, transpose in rows:
        shape = tuple(params[ours].shape)
        shape = shape[::-1] if transpose else shape  # Conv1D stores (in, out)
        expected[hf] = shape if part is None else shape[:-1] + (3 * shape[-1],)  # q, k, v side by side
    if not tied:
        expected["lm_head.weight"] = tuple(params["out_head.weight"].shape)
    lm_head = state.pop("lm_head.weight") if tied and "lm_head.weight" in state else None
    problems = (("missing key", [k for k in expected if k not in state],
                 "the file is incomplete, or config.json describes a bigger model than the file holds"),
                ("unexpected key", [k for k in state if k not in expected],
                 "it is not a GPT-2 weight, or config.json describes a smaller model than the file holds"))
    for what, keys, why in problems:
        if keys:
            more = f" (and {len(keys) - 1} more: {', '.join(keys[1:4])}{', ...' if len(keys) > 4 else ''})"
            raise ValueError(f"{source}: {what} {keys[0]}{more if len(keys) > 1 else ''}: {why}")
    for key, shape in expected.items():
        tensor = state[key]
        if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
            raise ValueError(f"{source}: {key} must be a floating-point tensor, got "
                             f"{getattr(tensor, 'dtype', type(tensor).__name__)}")
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{source}: {key} has shape {tuple(tensor.shape)}, expected {shape}")
    if lm_head is not None and not (lm_head.shape == state["wte.weight"].shape
                                    and torch.equal(lm_head, state["wte.weight"])):
        raise ValueError(f"{source}: lm_head.weight differs from wte.weight, but the config ties them "
                         "(tie_word_embeddings true): set tie_word_embeddings to false in config.json to load "
                         "a separate output head")

    for ours, hf, part, transpose in rows:
        tensor = state[hf]
        if part is not None:
            tensor = tensor.chunk(3, dim=-1)[part]  # c_attn holds [queries | keys | values] along its last dim
        params[ours].copy_(tensor.T if transpose else tensor)  # Conv1D (in, out) -> nn.Linear (out, in)
    if not tied:
        params["out_head.weight"].copy_(state["lm_head.weight"])  # nn.Linear in both: no transpose
    unfilled = sorted(set(params) - {ours for ours, *_ in rows} - {"out_head.weight"})
    if unfilled:
        raise ValueError(f"model parameter {unfilled[0]} has no GPT-2 counterpart in GPT2_NAME_MAP: "
                         "a GPT-2 checkpoint cannot fill this model")


@torch.no_grad()
def hf_state_from(model: GPTModel) -> dict[str, Tensor]:
    """Our model's weights under the names of a Hugging Face GPT2LMHeadModel, on the CPU.

    A model built without qkv biases gets zero c_attn biases: Linear(x) + 0 is the same function."""
    if not isinstance(model, GPTModel):
        raise TypeError(f"model must be a course_lib GPTModel, got {type(model).__name__}")
    params = dict(model.named_parameters())
    hf_state, qkv = {}, {}  # qkv: fused name -> [query, key, value] pieces in that order
    for ours, hf, part, transpose in expand_name_map(model.cfg.n_layers):
        if ours in params:
            tensor = params[ours]
        else:  # W_query/W_key/W_value bias of a model with qkv_bias=False
            weight = params[ours.removesuffix("bias") + "weight"]
            tensor = weight.new_zeros(weight.shape[0])
        tensor = tensor.detach().T if transpose else tensor.detach()  # nn.Linear (out, in) -> Conv1D (in, out)
        if part is None:
            hf_state["transformer." + hf] = tensor.contiguous().cpu()
        else:
            qkv.setdefault("transformer." + hf, []).append(tensor)
    for name, pieces in qkv.items():
        hf_state[name] = torch.cat(pieces, dim=-1).cpu()  # (emb_dim, 3 * emb_dim) or (3 * emb_dim,)
    if "out_head.weight" in params:  # untied: the head is a tensor of its own
        hf_state["lm_head.weight"] = params["out_head.weight"].detach().contiguous().cpu()
    return hf_state


def gpt2_files(path_or_name: str | Path) -> tuple[Path, Path]:
    """config.json and model.safetensors of a local directory, or of a GPT-2 size downloaded once from the
    Hugging Face Hub into its cache (with a progress bar); the name is checked before any download."""
    if not isinstance(path_or_name, (str, Path)):
        raise TypeError(f"path_or_name must be a directory path or a GPT-2 name, got {type(path_or_name).__name__}")
    path = Path(path_or_name)
    if path.is_dir():
        for file in (path / "config.json", path / "model.safetensors"):
            if not file.is_file():
                hint = (" (this directory has pytorch_model.bin: convert it with GPT2LMHeadModel.from_pretrained"
                        "(directory).save_pretrained(directory))" if (path / "pytorch_model.bin").exists() else "")
                raise FileNotFoundError(f"{file} does not exist{hint}: a GPT-2 directory holds config.json and "
                                        "model.safetensors; write one with save_gpt2(model, directory) or "
                                        "GPT2LMHeadModel.save_pretrained(directory)")
        return path / "config.json", path / "model.safetensors"
    if isinstance(path_or_name, str) and path_or_name in GPT2_HUB_REPOS:
        repo = GPT2_HUB_REPOS[path_or_name]
        try:
            config_file = hf_hub_download(repo, "config.json")
            weights_file = hf_hub_download(repo, "model.safetensors")
        except OSError as error:  # the Hub's errors (no connection and no cache, HTTP 404, ...) are OSErrors
            raise OSError(f"could not download {path_or_name!r} ({repo}) from the Hugging Face Hub: check the "
                          "network, or fetch config.json and model.safetensors elsewhere and pass their "
                          f"directory. The Hub said: {error}") from error
        return Path(config_file), Path(weights_file)
    if path.exists():
        raise ValueError(f"{path} is a file, not a directory: pass the directory that holds config.json and "
                         "model.safetensors")
    raise ValueError(f"{str(path_or_name)!r} is neither a directory nor a GPT-2 name: pass a directory with "
                     f"config.json and model.safetensors, or one of {', '.join(GPT2_HUB_REPOS)}")


def load_gpt2(path_or_name: str | Path, device: str | torch.device | None = None) -> GPTModel:
    """A GPTModel (tied head, eval mode, on `device`; default get_device()) holding GPT-2 weights from a
    Hugging Face directory (config.json + model.safetensors) or from the Hub ("gpt2" .. "gpt2-xl")."""
    config_file, weights_file = gpt2_files(path_or_name)
    try:
        device = get_device() if device is None else torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device must be None, a torch.device or a name like 'cpu' or 'cuda', got "
                         f"{device!r}") from error
    try:
        hf_config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{config_file} is not valid JSON ({error}): download it again or rewrite it with "
                         "save_gpt2") from error
    cfg, tied = config_from_hf(hf_config, source=str(config_file))
    try:
        hf_state = load_file(weights_file)  # name -> tensor, on the CPU
    except SafetensorError as error:
        raise ValueError(f"{weights_file} is not a readable safetensors file ({error}): it is truncated or "
                         "corrupt, e.g. by an interrupted download; delete it and download or save it again"
                         ) from error
    with device:  # build the parameters where they will live, without a copy from the CPU
        model = GPTModel(cfg, tie_weights=tied)
    fill_from_hf(model, hf_state, source=str(weights_file))
    return model.eval()


def save_gpt2(model: GPTModel, directory: str | Path) -> Path:
    """Write `model` as a Hugging Face GPT-2 directory (config.json + model.safetensors) that
    transformers.GPT2LMHeadModel.from_pretrained and load_gpt2 both read; returns the directory."""
    if not isinstance(model, GPTModel):
        raise TypeError(f"model must be a course_lib GPTModel, got {type(model).__name__}")
    if not isinstance(directory, (str, Path)):
        raise TypeError(f"directory must be a path, got {type(directory).__name__}")
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{directory} is a file: pass a directory (it is created if it does not exist)")
    hf_state = hf_state_from(model)
    tied = "lm_head.weight" not in hf_state
    directory.mkdir(parents=True, exist_ok=True)
    save_file(hf_state, directory / "model.safetensors", metadata={"format": "pt"})
    config = hf_config_from(model.cfg, tied, model.embedding.tok_emb.weight.dtype)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return directory

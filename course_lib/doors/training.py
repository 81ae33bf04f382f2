"""Not a lesson: the doors of notebook 09 (course_lib/training.py): the loss's targets, the corpus and its batches,
the run's settings, the training loop's inputs, and the checkpoint a run saves and loads (every entry of the file
checked before a weight is copied, every argument of a save before a byte is written)."""

import math
import pkgutil
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from ..config import GPTConfig
from ..guards import (as_device, require_bool, require_int, require_lesson_type, require_number,
                      require_token_tensor, require_type)
from ..model import GPTModel

OPTIMIZER_HOMES = ("torch.optim.", "course_lib.")  # the modules a checkpoint may name an optimizer class from


def targets(targets: Tensor, logits: Tensor) -> None:
    """Targets (batch, tokens) of ids in [0, vocab_size), one per position of logits (batch, tokens, vocab_size)."""
    if not (isinstance(logits, Tensor) and logits.is_floating_point() and logits.dim() == 3):
        got = f"{logits.dtype} {tuple(logits.shape)}" if isinstance(logits, Tensor) else type(logits).__name__
        raise TypeError(f"logits must be a floating-point tensor (batch, tokens, vocab_size), got {got}")
    require_token_tensor("targets", targets, dims=2, vocab_size=logits.shape[-1])  # ids in [0, vocab_size)
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets has shape {tuple(targets.shape)}, logits {tuple(logits.shape)}: one id per position")


def load_shakespeare(file: Path, digest: str, expected: str) -> None:
    """The corpus file is the recorded one: its SHA-256 is the one the course ships."""
    if digest != expected:
        raise ValueError(f"{file.name} is damaged: sha256 {digest}, not {expected}; restore it")


def split_by_position(token_ids: Tensor, val_fraction: float) -> None:
    """A stream of token ids, and a share of it for validation that leaves both parts non-empty."""
    require_token_tensor("token_ids", token_ids, dims=1)  # (tokens,)
    require_number("val_fraction", val_fraction, 0, 1, low_open=True, high_open=True,
                   why="the share kept for validation")
    split = int(len(token_ids) * (1.0 - val_fraction))
    if not 0 < split < len(token_ids):  # also every val_fraction outside (0, 1)
        raise ValueError(f"val_fraction {val_fraction} of {len(token_ids)} tokens leaves one part empty: use a "
                         "longer text or a val_fraction in (0, 1), further from 0 and 1")


def get_batch(token_ids: Tensor, batch_size: int, context_length: int, generator, device) -> torch.device:
    """The windows' source, sizes and generator; returns the device of the batch (token_ids' when None)."""
    require_token_tensor("token_ids", token_ids, dims=1)  # (tokens,)
    require_int("batch_size", batch_size, 1)
    require_int("context_length", context_length, 1)
    require_type("generator", generator, torch.Generator, "draw the windows with torch.Generator().manual_seed(0)")
    require_number("context_length", context_length, 1, len(token_ids) - 1, why="a window holds context_length + 1")
    return token_ids.device if device is None else as_device(device)


def sample_text(prompt, seed) -> None:
    """A prompt to continue and a seed (generate's door checks the rest)."""
    if not (isinstance(prompt, str) and prompt):
        kind = TypeError if not isinstance(prompt, str) else ValueError
        raise kind(f"prompt must be a non-empty str, got {prompt!r}")
    require_int("seed", seed)


def train_config(tcfg) -> None:
    """TrainConfig's __post_init__: every field a usable value, the warmup inside the run, min_lr <= max_lr."""
    for name in ("total_steps", "batch_size", "warmup_steps", "eval_every", "eval_batches"):
        require_int(name, getattr(tcfg, name), 0 if name == "warmup_steps" else 1)
    require_number("warmup_steps", tcfg.warmup_steps, 0, tcfg.total_steps, high_open=True, why="it is in the run")
    require_number("max_lr", tcfg.max_lr, 0, math.inf, low_open=True, high_open=True)
    require_number("min_lr", tcfg.min_lr, 0, tcfg.max_lr, why="the rate falls from max_lr to min_lr")
    require_number("weight_decay", tcfg.weight_decay, 0, math.inf, high_open=True)
    require_number("grad_clip", tcfg.grad_clip, 0, math.inf, low_open=True, why="the largest gradient norm")


def lr_at(step: int, tcfg) -> None:
    """A step of the run: past the last step the cosine would silently rise again."""
    _train_config_type("tcfg", tcfg, "build the schedule with TrainConfig(...)")
    require_int("step", step, minimum=0)
    if step >= tcfg.total_steps:
        raise ValueError(f"step {step} is past the run's last step {tcfg.total_steps - 1}")


def make_optimizer(model, tcfg, fused) -> None:
    require_type("model", model, nn.Module, "pass the GPTModel to train")
    _train_config_type("tcfg", tcfg, "build one with TrainConfig(...)")
    require_bool("fused", fused)


def evaluate(splits, num_batches: int, seed: int) -> None:
    require_int("num_batches", num_batches, minimum=1)  # 0 batches have no mean loss
    require_int("seed", seed)
    require_type("splits", splits, dict, "pass {'val': val_data}, a name for each token stream")


def train_inputs(model, optimizer, train_data: Tensor, val_data: Tensor, generator, history) -> None:
    """What train() is handed, checked before the first step changes the model."""
    from ..training import new_history  # this lesson's own function: imported when called, so no import cycle
    require_type("optimizer", optimizer, torch.optim.Optimizer, "build one with make_optimizer(model, tcfg)")
    require_type("generator", generator, torch.Generator, "draw the batches with torch.Generator().manual_seed(0)")
    for name, data in (("train_data", train_data), ("val_data", val_data)):
        require_token_tensor(name, data, dims=1, vocab_size=model.cfg.vocab_size)  # (tokens,)
    missing = sorted(new_history().keys() - history.keys()) if isinstance(history, dict) else None
    if history is not None and missing != []:
        raise ValueError(f"history must be None or a dict like new_history(), got {type(history).__name__}"
                         + (f" without {missing}" if missing else "") + ": pass the history train returned")


def train(model, optimizer, train_data, val_data, tcfg, generator, start_step, stop_step, history) -> int:
    """Everything train() is handed, before the first step changes the model; returns stop_step (None: the end)."""
    _train_config_type("tcfg", tcfg, "build one with TrainConfig(...)")
    stop_step = tcfg.total_steps if stop_step is None else stop_step
    require_int("start_step", start_step, 0)  # lr_at trusts the steps checked here
    require_number("stop_step", stop_step, start_step, tcfg.total_steps, why="the schedule ends at total_steps")
    train_inputs(model, optimizer, train_data, val_data, generator, history)
    return stop_step


# Checkpoints

def checkpoint_error(path, problem: str, fix: str = "save it again with save_checkpoint(...)") -> ValueError:
    """The ValueError for a checkpoint file that cannot be used: the file, the problem, the fix."""
    return ValueError(f"checkpoint {path} {problem}; {fix}")


def json_problem(value, where: str = "history") -> str | None:
    """The first entry of `value` that a JSON round trip would change or refuse (None if there is none)."""
    if value is None or isinstance(value, (str, int, float)):  # bool is an int; a NumPy float64 is a float
        return None
    if isinstance(value, list):
        return next((p for i, v in enumerate(value) if (p := json_problem(v, f"{where}[{i}]"))), None)
    if isinstance(value, dict):
        key = next((k for k in value if not isinstance(k, str)), None)
        if key is not None:
            return f"{where} has the key {key!r} ({type(key).__name__}), which JSON would turn into a str"
        return next((p for k, v in value.items() if (p := json_problem(v, f"{where}[{k!r}]"))), None)
    return f"{where} is a {type(value).__name__} ({str(value)[:40]}): store lists of float(x) or int(x)"


def _plain(value) -> bool:
    """A hyperparameter that torch.load(..., weights_only=True) reads back: a number, str, bool, None, tensor, or a
    tuple or list of them."""
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str, Tensor))


def optimizer(model: GPTModel, optimizer) -> None:
    """An optimizer load_checkpoint can rebuild: a torch.optim.Optimizer of a class it may import (torch.optim or
    course_lib), whose groups hold every parameter of the model once and nothing else (the file names them; a
    rebuilt model's parameters are all trainable), with hyperparameters a checkpoint can hold."""
    require_type("optimizer", optimizer, torch.optim.Optimizer, "pass the torch.optim optimizer that trains the model")
    cls = type(optimizer)
    name = f"{cls.__module__}:{cls.__qualname__}"
    importable = "<locals>" not in cls.__qualname__ and cls.__module__.startswith(OPTIMIZER_HOMES)
    try:
        importable = importable and pkgutil.resolve_name(name) is cls
    except (ImportError, AttributeError, ValueError):
        importable = False
    if not importable:
        raise TypeError(f"optimizer is a {name}, a class load_checkpoint would not import: it rebuilds optimizers of "
                        "torch.optim and course_lib only; use one of those (e.g. make_optimizer(model, tcfg))")
    names = {id(p): n for n, p in model.named_parameters()}  # a tied weight appears once
    held = [p for group in optimizer.param_groups for p in group["params"]]
    stranger = next((p for p in held if id(p) not in names), None)
    if stranger is not None:
        raise ValueError(f"optimizer holds a tensor of shape {tuple(stranger.shape)} that is not a parameter of the "
                         "model: a checkpoint stores the groups by parameter name; build the optimizer from "
                         "model.parameters()")
    twice = next((names[id(p)] for i, p in enumerate(held) if any(p is q for q in held[:i])), None)
    if twice is not None:
        raise ValueError(f"optimizer holds the parameter {twice} twice: each parameter belongs to one group once")
    missing = [n for n, p in model.named_parameters() if all(p is not q for q in held)]
    if missing:
        raise ValueError(f"optimizer lacks the model's parameter {missing[0]}"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                         + ": a resumed run would never update it; build the optimizer from model.parameters()")
    for where, settings in (("defaults", optimizer.defaults),
                            *((f"param_groups[{i}]", g) for i, g in enumerate(optimizer.param_groups))):
        bad = next((k for k, v in settings.items() if k != "params" and not _plain(v)), None)
        if bad is not None:
            raise TypeError(f"optimizer's {where}[{bad!r}] is a {type(settings[bad]).__name__}, which a checkpoint "
                            "cannot load back: use numbers, strings, tuples or tensors as hyperparameters")


def save_checkpoint(path, model, optimizer_, tokenizer, tcfg, step, generator, history) -> Path:
    """All that save_checkpoint is handed, before a byte is written; returns path as a Path."""
    from ..training import tokenizer_state  # this lesson's own function: imported when called, so no import cycle
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a file path (str or Path), got {type(path).__name__}")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"path {path} is a folder, not a file: save_checkpoint writes one file; name a file "
                                f"in it, e.g. {path / 'checkpoint.pt'}")
    folder = next(p for p in (path.parent, *path.parent.parents) if p.exists())
    if not folder.is_dir():
        raise NotADirectoryError(f"path {path} lies under {folder}, which is a file, not a folder: choose another path")
    require_type("model", model, GPTModel, "save a course_lib GPTModel")
    optimizer(model, optimizer_)
    _train_config_type("tcfg", tcfg, "pass the TrainConfig of the run")
    require_type("generator", generator, torch.Generator, "pass the generator that draws the batches")
    require_number("step", step, 0, tcfg.total_steps, why="the steps done, at most the run's total_steps")
    require_int("step", step)
    state = tokenizer_state(tokenizer)
    vocab_size = len(state["chars"]) if state["kind"] == "char" else tokenizer.n_vocab
    if vocab_size != model.cfg.vocab_size:
        raise ValueError(f"tokenizer has {vocab_size} tokens, the model's vocab_size is {model.cfg.vocab_size}: "
                         "save the tokenizer the model was built with")
    problem = json_problem(history) if history is None or isinstance(history, dict) else "history is not a dict"
    if problem:
        raise TypeError(f"{problem}; a checkpoint keeps history as JSON data (a dict like new_history())")
    return path


def _rng_state(state) -> bool:
    """A random generator's state that torch.Generator().set_state accepts."""
    try:
        torch.Generator().set_state(state)
        return True
    except (TypeError, RuntimeError, ValueError):
        return False


def readable(name: str, payload, why_and_fix: str) -> None:
    """Refuse what load_payload read if it is the error torch.load raised (a truncated zip, a pickle error, another
    file type: all mean "not readable"): '<name> cannot be read (<its first sentence>): <why_and_fix>'. The one
    refusal of an unreadable file for both kinds of checkpoint, notebook 09's and notebook 13's."""
    if isinstance(payload, Exception):
        reason = str(payload).split(". ")[0].strip() or type(payload).__name__  # the first sentence is enough
        raise ValueError(f"{name} cannot be read ({reason}): {why_and_fix}") from payload


def read_checkpoint(path, payload, keys: tuple[str, ...], version: str) -> dict:
    """What torch.load read from path (or the error it raised): a checkpoint of this version, every entry of its
    kind; returns the payload."""
    readable(f"checkpoint {path}", payload, "the file is truncated or is not a checkpoint, e.g. a copy or save was "
             "interrupted; save it again with save_checkpoint(...)")
    found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
    if found != version:
        raise checkpoint_error(path, f"has format {found!r}, not this version's {version!r}")
    missing = [key for key in keys if key not in payload]
    if missing:
        raise checkpoint_error(path, f"lacks {', '.join(missing)}: it is damaged")
    step, history = payload["step"], payload["history"]
    wrong = [("step", step, "a number of steps, an int >= 0") if isinstance(step, bool) or not isinstance(step, int)
             or step < 0 else None,
             ("history", history, "None or a dict like new_history()") if not (history is None or (
                 isinstance(history, dict) and json_problem(history) is None)) else None,
             *(((key, payload[key], "a dict") if not isinstance(payload[key], dict) else None)
               for key in ("model_config", "train_config", "model", "optimizer")),
             *(((key, payload[key], "a random generator's state") if not _rng_state(payload[key]) else None)
               for key in ("generator", "torch_rng"))]
    field, value, what = next((w for w in wrong if w), (None, None, None))
    if field:
        shown = f"{type(value).__name__} {str(value)[:40]!r}" if not isinstance(value, (int, type(None))) else value
        raise checkpoint_error(path, f"holds {field} {shown}, not {what}: it is damaged or is not a checkpoint "
                               "of this course")
    if ("optimizer_class" in payload) != ("optimizer_groups" in payload) or (
            "optimizer_class" in payload and "optimizer_defaults" not in payload):
        raise checkpoint_error(path, "holds only part of its optimizer's description (optimizer_class, "
                               "optimizer_groups, optimizer_defaults): it is damaged")
    if "optimizer_class" in payload:
        _optimizer_entries(path, payload)
    return payload


def _optimizer_entries(path, payload: dict) -> None:
    """optimizer_class names an optimizer of torch.optim or course_lib; optimizer_groups are lists of names, one
    per group of the stored state; optimizer_defaults is a dict."""
    name, groups = payload["optimizer_class"], payload["optimizer_groups"]
    module = name.split(":")[0] if isinstance(name, str) and name.count(":") == 1 else ""
    if not module.startswith(OPTIMIZER_HOMES):
        raise checkpoint_error(path, f"names the optimizer class {str(name)[:60]!r}, not a 'module:class' of "
                               "torch.optim or course_lib (the only ones load_checkpoint imports): it is damaged")
    try:
        cls = pkgutil.resolve_name(name)
    except (ImportError, AttributeError, ValueError) as error:
        raise checkpoint_error(path, f"names the optimizer class {name!r}, which this version does not have "
                               f"({error})", "load it with the version of course_lib that saved it") from error
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise checkpoint_error(path, f"names {name!r} as its optimizer class, which is not a torch.optim.Optimizer: "
                               "it is damaged")
    stored = payload["optimizer"].get("param_groups")
    if not (isinstance(groups, list) and all(isinstance(g, list) and all(isinstance(n, str) for n in g)
                                             for g in groups)
            and isinstance(stored, list) and len(stored) == len(groups)
            and isinstance(payload["optimizer_defaults"], dict)):
        raise checkpoint_error(path, "holds optimizer_groups that are not one list of parameter names per group of "
                               "its optimizer: it is damaged")


def load_checkpoint(path, payload: dict, device, expected_config, expected_tokenizer) -> torch.device:
    """The arguments of load_checkpoint and the checkpoint's configs and tokenizer: they build, they are the ones
    expected, they agree with each other and with the run's step; returns the device (default cpu)."""
    from ..training import TrainConfig, tokenizer_from_state, tokenizer_state  # this lesson's own: no import cycle
    device = as_device("cpu" if device is None else device)
    if device.type == "meta":
        raise ValueError("device 'meta' holds shapes without values, so the loaded weights would be lost: load on "
                         "'cpu', 'cuda' or 'mps'")
    if expected_config is not None:
        require_type("expected_config", expected_config, GPTConfig, "pass the GPTConfig you expect, or None")
    try:
        cfg, tcfg = GPTConfig(**payload["model_config"]), TrainConfig(**payload["train_config"])
    except (TypeError, ValueError) as error:
        raise checkpoint_error(path, f"holds a config this version cannot build ({error})") from error
    expected = (expected_config or cfg).__dict__
    differ = [f"{key} {value!r} (you expect {expected[key]!r})" for key, value in cfg.__dict__.items()
              if value != expected[key]]
    if differ:
        raise checkpoint_error(path, f"holds a model with {', '.join(differ)}", "build the model from the "
                               "checkpoint's own config (ckpt.model.cfg) or load a checkpoint of this shape")
    try:
        tokenizer = tokenizer_from_state(payload["tokenizer"])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise checkpoint_error(path, f"holds a tokenizer this version cannot rebuild ({error})") from error
    if expected_tokenizer is not None and tokenizer_state(expected_tokenizer) != payload["tokenizer"]:
        raise checkpoint_error(path, "holds another vocabulary than expected_tokenizer", "use ckpt.tokenizer")
    vocab_size = tokenizer.n_vocab if hasattr(tokenizer, "n_vocab") else tokenizer.vocab_size
    if vocab_size != cfg.vocab_size:
        raise checkpoint_error(path, f"is inconsistent: a tokenizer of {vocab_size} tokens, a model of "
                               f"{cfg.vocab_size}")
    if payload["step"] > tcfg.total_steps:
        raise checkpoint_error(path, f"holds step {payload['step']}, past its run's total_steps {tcfg.total_steps}: "
                               "it is damaged or is not a checkpoint of this course")
    return device


def restore_model(path, payload: dict, cfg: GPTConfig, tcfg, device: torch.device) -> None:
    """The stored weights and optimizer fit a model of cfg (tried on the meta device, where nothing is copied), and
    device is one this machine has."""
    from ..training import optimizer_from_state  # this lesson's own function: imported when called, no import cycle
    with torch.device("meta"):
        model = GPTModel(cfg)
    try:
        with warnings.catch_warnings():  # "copying ... to a meta parameter is a no-op": the point of the trial
            warnings.simplefilter("ignore", UserWarning)
            model.load_state_dict(payload["model"])
    except (RuntimeError, ValueError, TypeError, AttributeError) as error:
        detail = (str(error).strip().splitlines()[1:] or [str(error)])[0].strip()  # the first key that differs
        raise checkpoint_error(path, f"is damaged: the stored weights do not fit its own config ({detail})") from error
    known = {name for name, _ in model.named_parameters()}
    groups = payload.get("optimizer_groups", [])
    names = [n for g in groups for n in g]
    unknown = next((n for n in names if n not in known), None) or next(
        (n for i, n in enumerate(names) if n in names[:i]), None)
    if unknown is not None or (groups and set(names) != known):
        problem = (f"names {unknown!r} " + ("twice" if unknown in known else "as a parameter, which the model lacks")
                   if unknown is not None else f"leaves out {sorted(known - set(names))[:3]}")
        raise checkpoint_error(path, f"is damaged: its optimizer_groups {problem}")
    try:
        optimizer_from_state(model, payload, tcfg).load_state_dict(payload["optimizer"])
    except (RuntimeError, ValueError, TypeError, KeyError, AttributeError, IndexError) as error:
        raise checkpoint_error(path, f"is damaged: its optimizer does not fit the model ({error})") from error
    try:
        torch.empty(0, device=device)  # a device this machine does not have fails here, before anything is built
    except (RuntimeError, AssertionError) as error:
        raise ValueError(f"cannot move the model to device {device} ({error}); load it with device='cpu'") from error


def _train_config_type(name: str, tcfg, fix: str) -> None:
    """A TrainConfig (or notebook 09's own twin of it)."""
    from ..training import TrainConfig  # this lesson's own class: imported when called, so no import cycle
    require_lesson_type(name, tcfg, TrainConfig, fix)

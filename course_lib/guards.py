"""Not a lesson: the argument guards that every door shares (`course_lib/doors/`, one file per lesson). It checks
plain values and tensors and imports nothing from the course, so every door can use it.

A door calls one guard per argument in one line; the lesson function calls its door in one line, then shows its
mathematics. Guards are named `require_*` (never `check_*`, the prefix of the exercise checks). Each guard raises
TypeError (the wrong kind of value) or ValueError (the right kind, an impossible value) with a message that
names the argument, the value and the fix, so bad input never reaches a deep PyTorch error or, worse, a
silently wrong answer."""

import math
import warnings

import torch
from torch import Tensor

def require_int(name: str, value, minimum: int | None = None) -> None:
    """An int (a bool is not accepted), at least `minimum` when one is given."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def require_bool(name: str, value) -> None:
    """True or False, nothing else (not 0, 1 or None)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def require_number(name: str, value, low: float = -math.inf, high: float = math.inf, *, low_open: bool = False,
                 high_open: bool = False, why: str = "") -> None:
    """A real number (int or float, not a bool or NaN) between low and high; `low_open`/`high_open` leave that
    end out of the interval. `why` says what the number means, to help choose a valid one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if math.isnan(value) or below or above:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be in {interval}, got {value}" + (f": {why}" if why else ""))


def require_type(name: str, value, expected: type, fix: str) -> None:
    """An instance of `expected`; `fix` says how to make one."""
    if not isinstance(value, expected):
        raise TypeError(f"{name} must be a {expected.__name__}, got {type(value).__name__}: {fix}")



def require_lesson_type(name: str, value, expected: type, fix: str) -> None:
    """require_type for a class of a door's own lesson. In the notebook that teaches the class, the class is the
    notebook's own (defined in a cell, module __main__), a twin of course_lib's, and it passes too."""
    if not (type(value).__name__ == expected.__name__ and type(value).__module__ == "__main__"):
        require_type(name, value, expected, fix)

def as_device(device) -> torch.device:
    """`device` as a torch.device ('cpu', 'cuda', 'cuda:1', 'mps' or a torch.device), or a clear error."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device must be None, a torch.device or a name like 'cpu' or 'cuda', got "
                         f"{device!r}") from error


def values_readable(*tensors: Tensor) -> bool:
    """Whether a door may read these tensors' values for free: on the CPU (on a GPU the host would wait for the
    device) and outside torch.compile (where reading would break the graph)."""
    return all(t.device.type == "cpu" for t in tensors) and not torch.compiler.is_compiling()


def require_weight(source: str, key: str, tensor, shape: tuple[int, ...]) -> None:
    """A loaded weight: a floating-point tensor with data (not on meta) of the model's `shape`, holding no NaN or
    infinity (one look per tensor, in the loader, never in forward). `source` names the file it came from."""
    if not (isinstance(tensor, Tensor) and tensor.is_floating_point() and not tensor.is_meta
            and tuple(tensor.shape) == tuple(shape)):
        got = (f"{tensor.dtype} {tuple(tensor.shape)}{' on meta, without data' * tensor.is_meta}"
               if isinstance(tensor, Tensor) else type(tensor).__name__)
        raise ValueError(f"{source}: {key} is {got}, expected a floating-point tensor of shape {tuple(shape)}")
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"{source}: {key} holds NaN or infinite values: the file is corrupt or its run diverged")

def require_token_tensor(name: str, ids, dims: int, vocab_size: int | None = None,
                       device: torch.device | None = None, max_tokens: int | None = None) -> None:
    """A non-empty tensor of integer token ids with `dims` dimensions ((tokens,) or (batch, tokens)); with
    `device`, on that device; with `max_tokens`, at most that many tokens (the last dimension); with `vocab_size`,
    every id in [0, vocab_size), read only where reading is free: on the CPU, outside torch.compile (on a GPU it
    would make the host wait for the device, and in a compiled graph it would break the graph)."""
    if not isinstance(ids, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}: wrap a list of "
                        "ids with torch.tensor(...)")
    if ids.numel() == 0:  # before the dtype: torch.tensor([[]]), an empty prompt, is float32
        raise ValueError(f"{name} is empty, shape {tuple(ids.shape)}: pass at least one token (to start from "
                         "nothing, use <|endoftext|>, id 50256)")
    if ids.dtype not in (torch.int64, torch.int32):  # the integer types an embedding can index with
        raise TypeError(f"{name} must hold integer token ids, got dtype {ids.dtype}: convert with .long()")
    if ids.dim() != dims:
        shape, fix = (("(batch, tokens)", "for a single sequence add a batch dimension with .unsqueeze(0)")
                      if dims == 2 else ("(tokens,)", "make it one stream of tokens with .flatten()"))
        raise ValueError(f"{name} must be {dims}-D {shape}, got shape {tuple(ids.shape)}: {fix}")
    if device is not None and ids.device != device:
        raise ValueError(f"{name} is on {ids.device} but the model is on {device}: move it with .to(...)")
    if max_tokens is not None and ids.shape[-1] > max_tokens:
        raise ValueError(f"{name} has {ids.shape[-1]} tokens, more than the {max_tokens} positions left in the "
                         "context: crop the input to fit, or start again with empty KV caches")
    if vocab_size is not None and values_readable(ids):
        low, high = ids.min().item(), ids.max().item()  # one look at the data per call
        if high >= vocab_size:
            raise ValueError(f"{name} holds token id {high} >= vocab_size {vocab_size}: the ids come from a "
                             "larger vocabulary than the model's; use the tokenizer the model was built for")
        if low < 0:
            raise ValueError(f"{name} holds token id {low} < 0: token ids index the vocabulary, "
                             f"0 .. {vocab_size - 1}")


def require_attention_mask(mask, shape: tuple[int, int], device: torch.device) -> None:
    """A padding mask of `shape` (batch, tokens so far) on `device`: 1 or True for a real token, 0 or False for
    padding, as bools or integers (the values read, as the ids', only on the CPU outside torch.compile)."""
    if not isinstance(mask, Tensor) or mask.dtype.is_floating_point or mask.dtype.is_complex:
        got = f"dtype {mask.dtype}" if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"attention_mask must be a bool or integer tensor of 1s (real tokens) and 0s (padding), "
                        f"got {got}")
    if tuple(mask.shape) != tuple(shape) or mask.device != device:
        raise ValueError(f"attention_mask must be shaped (batch, tokens so far) = {tuple(shape)} on {device}, one "
                         f"entry per token of every row, the cached ones included; got {tuple(mask.shape)} on "
                         f"{mask.device}")
    if mask.dtype != torch.bool and values_readable(mask) and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("attention_mask must hold only 1 (a real token) and 0 (padding)")


_RENAMED = {f"check_{kind}": f"require_{kind}" for kind in ("int", "bool", "number", "type", "token_tensor",
                                                             "attention_mask")}


def __getattr__(name: str):
    """The guards' names before the doors got their own layer (check_int, ...), importable for one version."""
    if name in _RENAMED:
        warnings.warn(f"course_lib.guards.{name} is now course_lib.guards.{_RENAMED[name]}", DeprecationWarning,
                      stacklevel=2)
        return globals()[_RENAMED[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Not a lesson: the doors of notebook 07 (course_lib/model.py): the config a GPTModel is built from, the token ids
its forward reads (once, for every layer behind it), the model init_gpt2_weights draws, and trace_shapes' arguments."""

from torch import nn

from ..config import GPTConfig
from ..guards import require_int, require_token_tensor, require_type
from . import config as config_door


def gpt_config(cfg) -> None:
    """GPTModel(cfg): a GPTConfig (notebook 00's door)."""
    config_door.gpt_config(cfg)


def token_ids(model, token_ids) -> None:
    """GPTModel.forward: an integer tensor (batch, tokens) on the model's device, no longer than its context, and
    (where reading is free: on the CPU, outside torch.compile) every id inside its vocabulary."""
    require_token_tensor("token_ids", token_ids, dims=2, vocab_size=model.cfg.vocab_size,
                         device=model.out_head.weight.device, max_tokens=model.cfg.context_length)


def init_gpt2_weights(model) -> None:
    """init_gpt2_weights: a module with a GPTConfig as its cfg (GPTModel's layout; notebook 16's ModernGPT has it)."""
    if not (isinstance(model, nn.Module) and isinstance(getattr(model, "cfg", None), GPTConfig)):
        raise TypeError(f"model must be a GPTModel (or a model with its layout and a GPTConfig), got "
                        f"{type(model).__name__}: build one with GPTModel(cfg), which calls init_gpt2_weights itself")


def trace_shapes(model, max_depth) -> None:
    """trace_shapes: a module to run, and max_depth None (every level) or at least 1. The token ids are the model's
    to check."""
    require_type("model", model, nn.Module, "pass the model itself, like GPTModel(cfg)")
    require_int("max_depth", 1 if max_depth is None else max_depth, minimum=1)  # None: every level

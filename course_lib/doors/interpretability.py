"""Not a lesson: the doors of notebook 12 (course_lib/interpretability.py): the model whose hook points are named,
the hooks' places and edit functions, the names and patches of a pass, a pass the pattern hook can record, the
attention patterns that the head scores read, the target ids of the logit lens and of the attribution, the bridge's
model and tokenizer, and the chain and passages of the attention-only model."""

import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from ..config import GPTConfig
from ..guards import require_int, require_lesson_type, require_number, require_token_tensor, require_type
from ..model import GPTModel
from ..tokenization import CharTokenizer


def hook_points(model) -> None:
    """A model with GPTModel's layout and a GPTConfig (notebook 16's ModernGPT has both): its hook points name its
    parts."""
    if not (isinstance(model, nn.Module) and isinstance(getattr(model, "cfg", None), GPTConfig)):
        raise TypeError(f"model must be a GPTModel (course_lib.model) or a model with its layout, got "
                        f"{type(model).__name__}: its hook points name its parts")


def register(where: str, edit) -> None:
    """One of the four places a hook can sit, and an edit function to route the activation through."""
    if where not in ("input", "output", "pattern", "z"):
        raise ValueError(f"where must be 'input', 'output', 'pattern' or 'z', got {where!r}")
    if not callable(edit):
        raise TypeError(f"edit must be a function edit(name, activation), got {type(edit).__name__}")


def plain_pass(name: str, args: tuple) -> None:
    """The pattern hook's pass: attention_weights sees only the layer's input, so a pass with a KV cache or a
    padding mask (the layer's last two arguments) would record weights the layer did not use."""
    if len(args) > 2 and (args[-2] is not None or args[-1] is not None):  # (x, ..., kv_cache, may_attend)
        raise ValueError(f"{name} is recorded for a plain pass over whole sequences: the layer was called "
                         "with a KV cache or a padding mask, which attention_weights does not see; call the "
                         "model on the token ids alone, as run_with_cache does")


def hooked(model, names, edit) -> list[str]:
    """hooked's model, names (a list of this model's hook point names, not one str) and edit function, all checked
    before any hook is attached; returns the names as a list (a generator is read once)."""
    from ..interpretability import hook_points as points_of  # this lesson's own function: no import cycle
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise TypeError(f"names must be a list of hook point names, e.g. ['embed'], got {names!r}")
    points, names = points_of(model), list(names)
    unknown = [name for name in names if name not in points]
    if unknown:
        raise ValueError(f"no hook point named {unknown}: hook_points(model) lists this model's names")
    if not callable(edit):
        raise TypeError(f"edit must be a function edit(name, activation), got {type(edit).__name__}")
    return names


def patches(patches) -> dict:
    """A dict {hook point name: function(activation) -> new activation}, none of them an attention pattern (its
    hook only records: a patch would be ignored). Returns the patches, each wrapped so that what it returns is
    checked against the activation it replaces (`patched`)."""
    if not isinstance(patches, dict) or not all(map(callable, patches.values())):
        raise TypeError(f"patches must be a dict {{hook point name: function(activation) -> new activation}}, got "
                        f"{patches!r:.80}")
    if any(".attn.pattern" in name for name in patches):
        raise ValueError("patches: attn.pattern can be recorded but not patched; patch 'blocks.<i>.attn.z' instead")
    return {name: _checked(name, patch) for name, patch in patches.items()}


def _checked(name: str, patch):
    def checked(activation: Tensor) -> Tensor:
        new = patch(activation)
        patched(name, new, activation)
        return new
    return checked


def patched(name: str, new, activation: Tensor) -> None:
    """What a patch returned: a tensor of the activation's shape, dtype and device, or the model would fail three
    modules later with a shape error that names no patch."""
    if not isinstance(new, Tensor) or (new.shape, new.dtype, new.device) != (activation.shape, activation.dtype,
                                                                             activation.device):
        raise ValueError(f"patches[{name!r}] returned {getattr(new, 'shape', type(new))}, not a tensor of the "
                         f"activation's shape {activation.shape}, dtype {activation.dtype} and device "
                         f"{activation.device}")


def hf_tokenizer_for(tokenizer) -> None:
    require_type("tokenizer", tokenizer, CharTokenizer, "pass the CharTokenizer the model was trained with")


def to_transformer_lens(model, tokenizer) -> None:
    """A GPTModel and its CharTokenizer, of the same vocabulary; None only for GPT-2's vocabulary, whose tokenizer
    files save_gpt2 writes."""
    from ..interpretability import GPT2_VOCAB_SIZE  # this lesson's own constant: no import cycle
    require_type("model", model, GPTModel, "pass a GPTModel (course_lib.model)")
    if tokenizer is not None:
        require_type("tokenizer", tokenizer, CharTokenizer, "pass the model's CharTokenizer, or None for GPT-2's")
    expected = GPT2_VOCAB_SIZE if tokenizer is None else tokenizer.vocab_size
    if expected != model.cfg.vocab_size:
        raise ValueError(f"tokenizer: it has {expected} token ids, the model {model.cfg.vocab_size}: pass the "
                         "CharTokenizer the model was trained with (None only for GPT-2's vocabulary)")


def pattern(pattern) -> None:
    """An attention pattern (batch, heads, queries, keys) of float weights whose every row sums to 1: what
    run_with_cache records at 'blocks.<i>.attn.pattern'."""
    if not isinstance(pattern, Tensor) or not pattern.is_floating_point():
        got = f"dtype {pattern.dtype}" if isinstance(pattern, Tensor) else type(pattern).__name__
        raise TypeError(f"pattern must be a float tensor of attention weights, got {got}: take "
                        "cache['blocks.<i>.attn.pattern'] from run_with_cache")
    if pattern.dim() != 4 or pattern.shape[-1] != pattern.shape[-2]:
        raise ValueError(f"pattern must be (batch, heads, queries, keys) with as many queries as keys, got shape "
                         f"{tuple(pattern.shape)}: for one sequence add the batch dimension with .unsqueeze(0)")
    if not bool(((pattern.float().sum(-1) - 1).abs() <= 1e-2).all()):  # NaN fails too
        raise ValueError("pattern's rows must each sum to 1, the softmax weights of one query: pass the weights, "
                         "not the scores before the softmax or weights summed over several patterns")


def induction_score(pattern_, period) -> None:
    """A pattern, and a period whose two copies fit into it."""
    pattern(pattern_)
    require_int("period", period, minimum=1)
    if not 1 <= period <= pattern_.shape[-1] // 2:
        raise ValueError(f"period {period}: the pattern covers {pattern_.shape[-1]} tokens, not two copies of the "
                         "repeat")


def lens_targets(model, stream: Tensor, target_ids) -> None:
    """target_ids (batch, tokens): one id of the model's vocabulary per position of the cached stream."""
    require_type("model", model, GPTModel, "pass the GPTModel the cache was recorded from")
    require_token_tensor("target_ids", target_ids, dims=2, vocab_size=model.cfg.vocab_size)
    if target_ids.shape != stream.shape[:2]:
        raise ValueError(f"target_ids must hold one id per cached position, shape {tuple(stream.shape[:2])}, got "
                         f"{tuple(target_ids.shape)}: for next-token targets cache token_ids[:, :-1] and pass "
                         "token_ids[:, 1:]")


def logit_lens(model, cache, target_ids) -> None:
    """The model, and target ids for the positions of the cached stream (a missing activation: Python's KeyError
    names it)."""
    require_type("model", model, GPTModel, "pass the GPTModel the cache was recorded from")
    lens_targets(model, cache["embed"], target_ids)


def head_logit_attribution(model, cache, target_ids) -> None:
    """The model, and target ids for the positions of the stream leaving its last block."""
    require_type("model", model, GPTModel, "pass the GPTModel the cache was recorded from")
    lens_targets(model, cache[f"blocks.{len(model.trf_blocks) - 1}.resid_post"], target_ids)


def attention_only(model) -> None:
    require_type("model", model, GPTModel, "pass a GPTModel (course_lib.model)")


def second_order_chain(vocab_size, strength, seed) -> None:
    require_int("vocab_size", vocab_size, minimum=2)
    require_number("strength", strength, 0, math.inf, high_open=True,
                   why="0 gives uniform random tokens, larger a more predictable chain")
    require_int("seed", seed)


def sample(n, length, generator) -> None:
    require_int("n", n, minimum=0)
    require_int("length", length, minimum=0)
    require_type("generator", generator, torch.Generator, "pass torch.Generator().manual_seed(seed)")


def repeated_passages(chain, n, context_length, periods, generator) -> None:
    """A SecondOrderChain, a number of rows, and passage lengths that each fit twice into the row; all checked
    before the generator draws anything."""
    from ..interpretability import SecondOrderChain  # this lesson's own class: no import cycle
    require_lesson_type("chain", chain, SecondOrderChain, "build one with SecondOrderChain(vocab_size)")
    require_int("n", n, minimum=0)
    require_int("context_length", context_length, minimum=2)
    require_type("generator", generator, torch.Generator, "pass torch.Generator().manual_seed(seed)")
    if not isinstance(periods, (range, list, tuple)) or not all(isinstance(p, int) for p in periods):
        raise TypeError(f"periods must be a range or list of passage lengths (ints), got {periods!r}")
    if not periods or min(periods) < 1 or 2 * max(periods) > context_length:
        raise ValueError(f"periods: {periods} must be lengths >= 1 that fit twice into context_length={context_length}")



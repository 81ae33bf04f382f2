"""Not a lesson: the doors of notebook 14 (course_lib/finetuning.py): LoRA's layers, ranks, scales, targets and saved
adapters; the play classifier's corpus, splits, passages, models and training settings; the chat tokenizer, format,
batches, loss, instructions, replies and saved chat adapter.

Each door refuses before anything is computed or changed, so a refused apply_lora, merge_lora or
load_lora_state_dict leaves the model exactly as it was. This lesson's own classes (LoRALinear, Passages,
BagOfChars, ClassifierGPT, ChatTokenizer) are known by what they hold, not by isinstance: the notebook defines its
own copies of them while it runs. Its constants and pure helpers (CHAT_TOKENS, format_chat, ...) are imported inside
the doors that need them: the lesson imports its door when it loads, so the door may not import the lesson then."""

import math
import random
import re

import torch
from torch import Tensor, nn

from . import tokenization as tokenization_door
from ..guards import require_int, require_number, require_token_tensor, require_type, values_readable
from ..model import GPTModel
from ..tokenization import CharTokenizer

ALPHA_WHY = "the update is multiplied by alpha / r"


def _is_lora(module) -> bool:
    """A LoRALinear: a module with adapters and a merged flag."""
    return isinstance(module, nn.Module) and hasattr(module, "lora_A") and hasattr(module, "merged")


def _named(model, target: str) -> list[str]:
    """The full names of the modules of `model` that `target` names ("ff.fc" names trf_blocks.0.ff.fc, ...)."""
    return [n for n, _ in model.named_modules() if n == target or n.endswith("." + target)]


def _lora_layers(model) -> dict:
    lora_layers(model)
    return {name: m for name, m in model.named_modules() if _is_lora(m)}


# ------------------------------------------------------------------------------------------------------------ LoRA
def rank_and_alpha(r, alpha, dtype: torch.dtype = torch.float32) -> None:
    """A rank r >= 1 and a finite scale alpha > 0 whose alpha / r a weight of `dtype` can hold (an infinite scale
    makes 0 * inf = NaN out of the zero B of a fresh adapter)."""
    require_int("r", r, minimum=1)
    require_number("alpha", alpha, 0, math.inf, low_open=True, high_open=True, why=ALPHA_WHY)
    if dtype.is_floating_point and alpha / r > torch.finfo(dtype).max:
        raise ValueError(f"alpha / r = {alpha / r:g} is more than {dtype} can hold ({torch.finfo(dtype).max:g}): "
                         f"{ALPHA_WHY}, so pick an alpha of the order of r (e.g. 2 * r)")


def lora_linear(linear, r, alpha) -> None:
    """LoRALinear(linear, r, alpha): an nn.Linear to wrap, a rank and a scale."""
    require_type("linear", linear, nn.Linear, "wrap an existing layer, e.g. LoRALinear(block.att.out_proj, 8, 16)")
    rank_and_alpha(r, alpha, linear.weight.dtype)


def merge(layer) -> None:
    """LoRALinear.merge: not merged yet (merging twice would add the update twice)."""
    if layer.merged:
        raise RuntimeError("this LoRALinear is already merged: merging twice would add the update twice; "
                           "call unmerge() first")


def unmerge(layer) -> None:
    """LoRALinear.unmerge: merged (unmerging an unmerged layer would subtract an update it never had)."""
    if not layer.merged:
        raise RuntimeError("this LoRALinear is not merged: nothing to unmerge (call merge() first)")


def find_lora_targets(model, target_names) -> None:
    """A model and a non-empty list of layer names, each naming at least one nn.Linear of the model, none of them
    already a LoRALinear."""
    require_type("model", model, nn.Module, "pass the model to fine-tune, e.g. a GPTModel")
    if isinstance(target_names, str) or not isinstance(target_names, (list, tuple)) or not target_names:
        raise TypeError(f"target_names must be a non-empty list of layer names such as ['att.out_proj', 'ff.fc'], "
                        f"got {target_names!r}")
    modules = dict(model.named_modules())
    linear_names = sorted({re.sub(r"^trf_blocks\.\d+\.", "", n) for n, m in modules.items()
                           if isinstance(m, nn.Linear) or _is_lora(m)})
    for target in target_names:
        require_type("each target name", target, str, "write the layer's name, e.g. 'att.out_proj'")
        names = _named(model, target)
        if not names:
            raise ValueError(f"no layer of the model is named {target!r}: its linear layers are {linear_names}")
        for name in names:
            if _is_lora(modules[name]):
                raise ValueError(f"{name} already has LoRA: apply_lora once per model (start from a fresh copy "
                                 "to try another rank)")
            if not isinstance(modules[name], nn.Linear):
                raise TypeError(f"{name} is a {type(modules[name]).__name__}, not an nn.Linear: name one of the "
                                f"linear layers {linear_names}")


def apply_lora(model, target_names, r, alpha) -> None:
    """apply_lora: a model, its targets (find_lora_targets), a rank and a scale each target's dtype can hold, and no
    target whose weight is shared with another parameter (merging into it would change that one too)."""
    require_type("model", model, nn.Module, "pass the model to fine-tune, e.g. a GPTModel")
    rank_and_alpha(r, alpha)
    find_lora_targets(model, target_names)
    found = {name for target in target_names for name in _named(model, target)}
    names = [name for name, _ in model.named_modules() if name in found]
    owners = {}  # id of each parameter -> every name it has (a tied weight has two)
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    for name in names:
        weight = model.get_submodule(name).weight
        rank_and_alpha(r, alpha, weight.dtype)
        shared = owners[id(weight)]
        if len(shared) > 1:
            raise ValueError(f"{name}'s weight is shared with {[s for s in shared if s != name + '.weight']}: merging "
                             "an update into it would change them too; leave it out of target_names")


def lora_layers(model) -> None:
    """A model that holds at least one LoRALinear."""
    require_type("model", model, nn.Module, "pass the model you called apply_lora on")
    if not any(_is_lora(m) for m in model.modules()):
        raise ValueError("the model has no LoRALinear layers: call apply_lora(model, target_names, r, alpha) first")


def merge_lora(model) -> None:
    """merge_lora: LoRA layers, none merged yet (checked before any change, so an error leaves the model as it was)."""
    merged = [name for name, layer in _lora_layers(model).items() if layer.merged]
    if merged:
        raise RuntimeError(f"{merged[0]} is already merged: call unmerge_lora(model) first")


def unmerge_lora(model) -> None:
    """unmerge_lora: LoRA layers, every one merged."""
    unmerged = [name for name, layer in _lora_layers(model).items() if not layer.merged]
    if unmerged:
        raise RuntimeError(f"{unmerged[0]} is not merged: call merge_lora(model) first")


def load_lora_state_dict(model, state) -> None:
    """load_lora_state_dict: the keys of this model's adapters, each a finite floating tensor of its adapter's shape,
    into unmerged layers. Nothing is copied unless every tensor fits."""
    layers = _lora_layers(model)
    require_type("state", state, dict, "pass the dictionary that lora_state_dict returned")
    params = {f"{n}.{p}": getattr(layer, p) for n, layer in layers.items() for p in ("lora_A", "lora_B")}
    missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
    if missing or unexpected:
        raise ValueError(f"state does not fit this model's adapters: missing {missing[:4]}, unexpected "
                         f"{unexpected[:4]}; call apply_lora with the same target_names as when it was saved")
    for key, p in params.items():
        if not isinstance(state[key], Tensor):
            raise TypeError(f"state[{key!r}] is a {type(state[key]).__name__}, not a tensor: pass the dictionary "
                            "that lora_state_dict returned (or load_file read)")
        if state[key].shape != p.shape:
            raise ValueError(f"state[{key!r}] has shape {tuple(state[key].shape)}, the model's "
                             f"has {tuple(p.shape)}: call apply_lora with the rank r used when it was saved")
        if not state[key].dtype.is_floating_point:
            raise TypeError(f"state[{key!r}] has dtype {state[key].dtype}, not a floating-point adapter: pass the "
                            "tensors that lora_state_dict returned")
        if not bool(torch.isfinite(state[key]).all()):  # a load is an edge: one look at each tensor
            raise ValueError(f"state[{key!r}] holds NaN or infinite values: the adapters were saved from a run "
                             "that diverged, or the file is damaged; load adapters from an earlier checkpoint")
    merged = [n for n, layer in layers.items() if layer.merged]
    if merged:
        raise RuntimeError(f"{merged[0]} is merged: call unmerge_lora(model) before loading other adapters")


# ------------------------------------------------------------------------------------------------------ classifier
def play_speeches(text, plays: list[dict]) -> None:
    """play_speeches: the shipped corpus, whose length the play offsets were recorded for."""
    from ..finetuning import PLAYS_FILE  # this lesson's own constant: imported when called, so no import cycle
    require_type("text", text, str, "pass the corpus itself, load_shakespeare(), or leave it out")
    if plays[-1]["end"] != len(text):
        raise ValueError(f"text has {len(text):,} characters but {PLAYS_FILE.name} ends at {plays[-1]['end']:,}: "
                         "pass the shipped corpus, load_shakespeare()")


def _fractions(fractions) -> None:
    require_type("fractions", fractions, tuple, "pass e.g. (0.8, 0.1, 0.1)")
    if (not fractions or any(not isinstance(f, float) or not 0 < f <= 1 for f in fractions)
            or not abs(sum(fractions) - 1) <= 1e-9):  # NaN fails every comparison: refused too
        raise ValueError(f"fractions must be positive floats that sum to 1, got {fractions}")


def _int_labels(name: str, labels) -> None:
    require_type(name, labels, list, "pass one int label per item")
    for i, label in enumerate(labels):
        require_int(f"{name}[{i}]", label, minimum=0)


def stratified_split(labels, fractions, seed) -> None:
    """stratified_split: a non-empty list of int labels, shares that sum to 1, an int seed."""
    _int_labels("labels", labels)
    if not labels:
        raise ValueError("labels is empty: pass one int label per item to split")
    _fractions(fractions)
    require_int("seed", seed)


def encode_passages(texts, labels, tokenizer, max_chars) -> None:
    """encode_passages: one non-empty str and one int label per passage, a CharTokenizer, max_chars >= 1."""
    require_type("texts", texts, list, "pass a list of strings")
    _int_labels("labels", labels)
    require_type("tokenizer", tokenizer, CharTokenizer, "pass the model's tokenizer, e.g. load_shakespeare_gpt()[1]")
    require_int("max_chars", max_chars, minimum=1)
    if len(texts) != len(labels) or not texts:
        raise ValueError(f"texts ({len(texts)}) and labels ({len(labels)}) must have one label per text, and not 0")
    for i, text in enumerate(texts):
        require_type(f"texts[{i}]", text, str, "each passage is a string")
    empty = [i for i, text in enumerate(texts) if not text]
    if empty:
        raise ValueError(f"texts[{empty[0]}] is empty: a passage needs at least one character")


def play_passages(tokenizer, max_chars, min_chars, seed, fractions) -> None:
    """play_passages: a CharTokenizer, passage sizes >= 1, an int seed, three shares (train, val, test)."""
    require_type("tokenizer", tokenizer, CharTokenizer, "pass the model's tokenizer, e.g. load_shakespeare_gpt()[1]")
    require_int("max_chars", max_chars, minimum=1)
    require_int("min_chars", min_chars, minimum=1)
    require_int("seed", seed)
    if not (isinstance(fractions, tuple) and len(fractions) == 3):
        raise ValueError(f"fractions must be three shares (train, val, test) such as (0.8, 0.1, 0.1), got "
                         f"{fractions!r}")
    _fractions(fractions)


def lengths(lengths: Tensor | None, token_ids: Tensor) -> Tensor:
    """lengths (batch,) of ints in [1, tokens], one per row of token_ids (None: every row is full), returned as a
    tensor. Values are read only on the CPU, where that is free."""
    if lengths is None:
        return torch.full((len(token_ids),), token_ids.shape[1], device=token_ids.device)  # (batch,)
    if not isinstance(lengths, Tensor) or lengths.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"lengths must be an integer tensor (batch,), got {getattr(lengths, 'dtype', type(lengths))}")
    if lengths.shape != token_ids.shape[:1] or lengths.device != token_ids.device:
        raise ValueError(f"lengths has shape {tuple(lengths.shape)} on {lengths.device}; token_ids "
                         f"{tuple(token_ids.shape)} on {token_ids.device} needs one length per row, on its device")
    if values_readable(lengths):
        if lengths.min() < 1 or lengths.max() > token_ids.shape[1]:
            raise ValueError(f"lengths must be in [1, {token_ids.shape[1]}] (the real tokens of each row), got "
                             f"values from {lengths.min().item()} to {lengths.max().item()}")
    return lengths


def classifier_inputs(model, token_ids, lengths_) -> Tensor:
    """BagOfChars.forward and ClassifierGPT.forward: right-padded token ids (batch, tokens) of the model's vocabulary,
    on its device (ClassifierGPT: within its context), and their lengths, returned as a tensor (None: every row is
    full)."""
    cfg = getattr(model, "cfg", None)  # a ClassifierGPT has its GPT's config, a BagOfChars only a vocabulary size
    require_token_tensor("token_ids", token_ids, dims=2, vocab_size=cfg.vocab_size if cfg else model.vocab_size,
                         device=model.out_head.weight.device, max_tokens=cfg.context_length if cfg else None)
    return lengths(lengths_, token_ids)


def bag_of_chars(vocab_size, num_classes) -> None:
    require_int("vocab_size", vocab_size, minimum=1)
    require_int("num_classes", num_classes, minimum=2)


def classifier_gpt(model, num_classes) -> None:
    require_type("model", model, GPTModel, "pass a pretrained GPTModel, e.g. load_shakespeare_gpt()[0]")
    require_int("num_classes", num_classes, minimum=2)


def _classifier_and_data(model, data) -> None:
    """A BagOfChars or ClassifierGPT and a non-empty Passages whose ids, lengths and labels that model can read."""
    head = getattr(model, "out_head", None)
    if isinstance(model, GPTModel) or not isinstance(model, nn.Module) or not isinstance(head, nn.Linear):
        raise TypeError(f"model must be a ClassifierGPT or a BagOfChars, got {type(model).__name__}: wrap a "
                        "pretrained GPTModel with ClassifierGPT(model, num_classes)")
    if not all(hasattr(data, field) for field in ("token_ids", "lengths", "labels", "source")):
        raise TypeError(f"data must be a Passages, got {type(data).__name__}: build it with play_passages(...) or "
                        "encode_passages(...)")
    fields = (data.lengths, data.labels, data.source)
    if not all(isinstance(t, Tensor) and t.dim() == 1 for t in fields) or len({len(t) for t in fields}) != 1:
        raise ValueError("data's lengths, labels and source must be 1-D tensors of one entry per passage: build it "
                         "with encode_passages(...)")
    ids, n = data.token_ids, len(data.labels)
    if n == 0:
        raise ValueError("data holds no passage: pass at least one")
    cfg = getattr(model, "cfg", None)  # a ClassifierGPT has its GPT's config, a BagOfChars only a vocabulary size
    require_token_tensor("data.token_ids", ids, dims=2, vocab_size=cfg.vocab_size if cfg else model.vocab_size,
                         max_tokens=cfg.context_length if cfg else None)
    if ids.shape[0] != n:
        raise ValueError(f"data.token_ids has {ids.shape[0]} rows for {n} labels: build it with encode_passages(...)")
    lengths(data.lengths.to(ids.device), ids)
    classes = head.out_features
    if data.labels.dtype != torch.int64 or not bool(((data.labels >= 0) & (data.labels < classes)).all()):
        raise ValueError(f"data.labels must be int64 classes in [0, {classes}), the model's num_classes: build the "
                         f"model with as many classes as the data has")


def train_classifier(model, data, epochs, lr, batch_size, weight_decay, seed) -> None:
    """train_classifier: a classifier with trainable parameters, data it can read, and finite settings."""
    _classifier_and_data(model, data)
    require_int("epochs", epochs, minimum=1)
    require_int("batch_size", batch_size, minimum=1)
    require_number("lr", lr, 0, math.inf, low_open=True, high_open=True, why="the AdamW learning rate")
    require_number("weight_decay", weight_decay, 0, math.inf, high_open=True, why="AdamW's decoupled weight decay")
    require_int("seed", seed)
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("model has no parameter that requires grad: unfreeze the head, e.g. "
                         "model.out_head.requires_grad_(True)")


def accuracy(model, data, batch_size) -> None:
    _classifier_and_data(model, data)
    require_int("batch_size", batch_size, minimum=1)


def word_frequencies(texts, vocabulary) -> None:
    """word_frequencies: a list of str, and a vocabulary that is None or a non-empty list of distinct str."""
    require_type("texts", texts, list, "pass a list of strings, one per text")
    for i, text in enumerate(texts):
        require_type(f"texts[{i}]", text, str, "each text is a string")
    if vocabulary is not None:
        require_type("vocabulary", vocabulary, list, "pass the vocabulary returned for the training texts, or None")
        from ..finetuning import WORD  # this lesson's own pattern: imported when called, so no import cycle
        if (not vocabulary or len(set(vocabulary)) != len(vocabulary)
                or not all(isinstance(w, str) and WORD.fullmatch(w) for w in vocabulary)):
            raise ValueError("vocabulary must be a non-empty list of distinct words, each lower-case letters and "
                             "apostrophes: pass the one word_frequencies returned for the training texts")


def _features_and_labels(name: str, pair, num_classes: int, width: int | None = None, rows: int = 1) -> None:
    if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(t, Tensor) for t in pair)):
        raise TypeError(f"{name} must be a tuple (features (n, d), labels (n,)) of tensors, got {type(pair).__name__}")
    x, y = pair
    if x.dim() != 2 or x.dtype != torch.float32 or y.dim() != 1 or len(x) != len(y) or len(x) < rows:
        raise ValueError(f"{name} must be (features (n, d) float32, labels (n,)) with the same n >= {rows}, got "
                         f"shapes {tuple(x.shape)} ({x.dtype}) and {tuple(y.shape)}: .float() casts the features")
    if width is not None and x.shape[1] != width:
        raise ValueError(f"{name}'s features have {x.shape[1]} columns, train's {width}: compute both the same way "
                         "(the same vocabulary, the same model)")
    if y.dtype != torch.int64 or bool(((y < 0) | (y >= num_classes)).any()):
        raise ValueError(f"{name}'s labels must be int64 classes in [0, {num_classes})")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name}'s features hold NaN or inf: a logistic regression cannot fit them")


def fit_logistic(train, val, num_classes, penalties, max_iter) -> None:
    """fit_logistic: (features, labels) pairs for train and val of one width, classes, penalties >= 0."""
    require_int("num_classes", num_classes, minimum=2)
    _features_and_labels("train", train, num_classes, rows=2)  # a standard deviation needs two rows
    _features_and_labels("val", val, num_classes, width=train[0].shape[1])
    if not isinstance(penalties, tuple) or not penalties:
        raise TypeError(f"penalties must be a non-empty tuple of L2 strengths such as (1e-3, 1e-2), got {penalties!r}")
    for i, penalty in enumerate(penalties):
        require_number(f"penalties[{i}]", penalty, 0, math.inf, high_open=True, why="the L2 penalty on the weights")
    require_int("max_iter", max_iter, minimum=1)


def last_states(model, data, batch_size) -> None:
    """last_states: a GPTModel (the body, not a ClassifierGPT) and Passages it can read."""
    require_type("model", model, GPTModel, "pass the language model itself, e.g. load_shakespeare_gpt()[0], not a "
                 "ClassifierGPT (its head is the one being fitted)")
    if not all(hasattr(data, field) for field in ("token_ids", "lengths", "labels", "source")):
        raise TypeError(f"data must be a Passages, got {type(data).__name__}: build it with play_passages(...), "
                        "order_passages(...) or encode_passages(...)")
    if len(data.labels) == 0:
        raise ValueError("data holds no passage: pass at least one")
    require_token_tensor("data.token_ids", data.token_ids, dims=2, vocab_size=model.cfg.vocab_size,
                         max_tokens=model.cfg.context_length)
    lengths(data.lengths, data.token_ids)
    require_int("batch_size", batch_size, minimum=1)


def shuffle_words(line, rng) -> None:
    """shuffle_words: a str and a random.Random (seeded by the caller, so a rerun shuffles alike)."""
    require_type("line", line, str, "pass one line of text")
    require_type("rng", rng, random.Random, "pass a seeded generator, e.g. random.Random(0)")


def order_lines(text, exclude, min_chars, max_chars) -> None:
    require_type("text", text, str, "pass a stretch of the corpus, e.g. load_shakespeare()[:cut]")
    require_type("exclude", exclude, str, "pass the text no line may occur in, or \"\"")
    require_int("min_chars", min_chars, minimum=1)
    require_int("max_chars", max_chars, minimum=min_chars)


def order_passages(tokenizer, train_lines, val_lines, seed, available: int) -> None:
    """order_passages: a CharTokenizer, split sizes that the usable training lines can fill, an int seed."""
    require_type("tokenizer", tokenizer, CharTokenizer, "pass the model's tokenizer, e.g. load_shakespeare_gpt()[1]")
    require_int("train_lines", train_lines, minimum=2)
    require_int("val_lines", val_lines, minimum=2)
    require_int("seed", seed)
    if train_lines + val_lines > available:
        raise ValueError(f"train_lines + val_lines = {train_lines + val_lines:,} but the training text has "
                         f"{available:,} usable lines: ask for fewer")


# ------------------------------------------------------------------------------------------------------------ chat
def grow_vocabulary(model, n_new) -> None:
    require_type("model", model, GPTModel, "pass a course_lib GPTModel, e.g. load_shakespeare_gpt()[0]")
    require_int("n_new", n_new, minimum=1)


def _first_new(model, first_new, why: str) -> None:
    require_int("first_new", first_new, minimum=1)
    if first_new >= model.cfg.vocab_size:
        raise ValueError(f"first_new is {first_new}, but the vocabulary has {why}")


def train_new_rows(model, first_new) -> None:
    require_type("model", model, GPTModel, "pass the model that grow_vocabulary returned")
    _first_new(model, first_new, f"only {model.cfg.vocab_size} tokens: pass the old vocabulary size, the id of the "
                                 "first token grow_vocabulary added")


def _chat_tokenizer(tokenizer) -> None:
    """A ChatTokenizer: a tokenizer with chat-token ids."""
    if not (hasattr(tokenizer, "special_ids") and hasattr(tokenizer, "end_id") and hasattr(tokenizer, "encode")):
        raise TypeError(f"tokenizer must be a ChatTokenizer, got {type(tokenizer).__name__}: wrap the model's "
                        "tokenizer: ChatTokenizer(char_tokenizer)")


def chat_tokenizer(char_tokenizer) -> None:
    require_type("char_tokenizer", char_tokenizer, CharTokenizer, "pass the model's tokenizer, e.g. "
                 "load_shakespeare_gpt()[1]")


def chat_ids(ids, vocab_size: int) -> list[int]:
    """ChatTokenizer.decode: ids of its vocabulary, as a list of ints."""
    return tokenization_door.token_ids(ids, vocab_size)


def format_chat(instruction, response) -> None:
    """The texts of a turn: str without a chat token (format_chat adds them itself); response may be None."""
    from ..finetuning import CHAT_TOKENS  # this lesson's own constant, as above
    for name, text in (("instruction", instruction), ("response", response)):
        if text is None and name == "response":
            continue
        require_type(name, text, str, "pass the text of the turn")
        found = [token for token in CHAT_TOKENS if token in text]
        if found:
            raise ValueError(f"{name} contains the chat token {found[0]!r}: the turn's text may not hold "
                             f"{', '.join(CHAT_TOKENS)}; format_chat adds them itself")


def chat_batch(tokenizer, examples, context_length) -> None:
    """chat_batch: a ChatTokenizer, (instruction, response) pairs of str, each at most context_length + 1 tokens."""
    from ..finetuning import format_chat as lesson_format  # this lesson's own function, as above
    _chat_tokenizer(tokenizer)
    if not isinstance(examples, (list, tuple)) or not examples:
        raise TypeError(f"examples must be a non-empty list of (instruction, response) pairs, got {examples!r}")
    require_int("context_length", context_length, minimum=1)
    for i, pair in enumerate(examples):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise TypeError(f"examples[{i}] must be an (instruction, response) pair of str, got {pair!r}")
        length = len(tokenizer.encode(lesson_format(*pair)))  # the prompt, the response, <|end|>
        if length - 1 > context_length:
            raise ValueError(f"examples[{i}] is {length} tokens long, more than context_length + 1 = "
                             f"{context_length + 1}: shorten its instruction or response")


def chat_loss(model, inputs, targets) -> None:
    """chat_loss: inputs and int64 targets of one shape, targets in the vocabulary or IGNORE_INDEX, at least one
    target that counts (the mean of nothing is NaN)."""
    from ..finetuning import IGNORE_INDEX  # this lesson's own constant, as above
    require_type("model", model, nn.Module, "pass the model being fine-tuned")
    require_type("inputs", inputs, Tensor, "build inputs and targets with chat_batch(...)")
    require_type("targets", targets, Tensor, "build inputs and targets with chat_batch(...)")
    if targets.shape != inputs.shape or targets.dtype != torch.int64:
        raise ValueError(f"targets must be int64 of the inputs' shape {tuple(inputs.shape)}, got {targets.dtype} "
                         f"{tuple(targets.shape)}: build both with chat_batch(...)")
    if values_readable(targets):
        if not bool((targets != IGNORE_INDEX).any()):
            raise ValueError("every target is IGNORE_INDEX: the batch has no response token to learn")
        vocab_size = getattr(getattr(model, "cfg", None), "vocab_size", None)
        real = targets[targets != IGNORE_INDEX]
        if real.min() < 0 or (vocab_size is not None and real.max() >= vocab_size):
            raise ValueError(f"targets hold ids from {real.min().item()} to {real.max().item()}: each must be a "
                             f"token id of the model's vocabulary ({vocab_size} tokens) or IGNORE_INDEX "
                             f"({IGNORE_INDEX}); build them with chat_batch(...)")


def speeches(text) -> None:
    require_type("text", text, str, "pass the corpus text, or a part of it")


def make_instructions(text, per_task, seed, exclude, max_line, min_line=12) -> None:
    """make_instructions: a text, a count, a seed, the text to exclude, line lengths; and enough usable lines for
    every task."""
    from ..finetuning import _task_pools  # this lesson's own helper, as above
    require_type("text", text, str, "pass the corpus text, or a part of it")
    require_type("exclude", exclude, str, "pass the text whose lines may not be used, or ''")
    require_int("per_task", per_task, minimum=1)
    require_int("seed", seed)
    require_int("min_line", min_line, minimum=1)
    require_int("max_line", max_line, minimum=max(12, min_line))
    for task, pool in _task_pools(text, exclude, max_line, min_line).items():
        if len(pool) < per_task:
            raise ValueError(f"text has {len(pool)} usable lines for task {task!r}, fewer than per_task={per_task}: "
                             "pass a longer text or ask for fewer")


def prompt_spans(instruction) -> None:
    require_type("instruction", instruction, str, "pass the instruction's text, example['instruction']")


def copyable(example) -> None:
    """copyable: one instruction of make_instructions, with its instruction text, a known task and a response."""
    require_type("example", example, dict, "pass one dict that make_instructions returned")
    if not isinstance(example.get("instruction"), str):
        raise ValueError(f"example must have an 'instruction' (a str), got {sorted(example)}")
    judge_reply(example, "")  # the task and the response, as judge_reply needs them


def text_loss(model, token_ids, batch_size) -> None:
    """text_loss: a GPTModel, 1-D token ids of its vocabulary holding at least one window, a batch size."""
    require_type("model", model, GPTModel, "pass the model to measure, e.g. load_shakespeare_gpt()[0]")
    require_token_tensor("token_ids", token_ids, 1, model.cfg.vocab_size)
    if len(token_ids) <= model.cfg.context_length:
        raise ValueError(f"token_ids holds {len(token_ids)} tokens, no window of the context length "
                         f"({model.cfg.context_length}) and its next token: pass a longer text")
    require_int("batch_size", batch_size, minimum=1)


def judge_reply(example, reply) -> None:
    """judge_reply: one instruction of make_instructions (a dict with a known task and a response) and a str."""
    from ..finetuning import INSTRUCTION_TASKS  # this lesson's own constant, as above
    require_type("example", example, dict, "pass one dict that make_instructions returned")
    require_type("reply", reply, str, "pass the model's reply, e.g. from chat_reply")
    if example.get("task") not in INSTRUCTION_TASKS or not isinstance(example.get("response"), str):
        raise ValueError(f"example must have a 'task' among {list(INSTRUCTION_TASKS)} and a 'response', got "
                         f"{sorted(example)}")


def generate_replies(model, tokenizer, instruction, n, max_new_tokens) -> int:
    """generate_replies (and chat_reply through it): a GPTModel grown to the tokenizer's vocabulary, an instruction
    that leaves room for an answer, n >= 1 replies; returns max_new_tokens, by default all the room left."""
    from ..finetuning import CHAT_TOKENS, format_chat as lesson_format  # this lesson's own names, as above
    require_type("model", model, GPTModel, "pass the fine-tuned model")
    _chat_tokenizer(tokenizer)
    if tokenizer.vocab_size != model.cfg.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens, the model {model.cfg.vocab_size}: grow "
                         f"the model with grow_vocabulary(model, {len(CHAT_TOKENS)}) first")
    prompt = tokenizer.encode(lesson_format(instruction))
    room = model.cfg.context_length - len(prompt)
    if room < 1:
        raise ValueError(f"instruction takes {len(prompt)} tokens with the chat tokens, and the context holds "
                         f"{model.cfg.context_length}: shorten it to leave room for an answer")
    max_new_tokens = room if max_new_tokens is None else max_new_tokens
    require_int("max_new_tokens", max_new_tokens, minimum=1)
    require_int("n", n, minimum=1)
    return max_new_tokens


def chat_state_dict(model, first_new) -> None:
    """chat_state_dict: a grown GPTModel with LoRA adapters, and the old vocabulary size."""
    require_type("model", model, GPTModel, "pass the fine-tuned model")
    lora_layers(model)
    _first_new(model, first_new, f"{model.cfg.vocab_size} tokens: pass the old vocabulary size")


def chat_loop(read, write, sampling: dict) -> None:
    """chat_loop: read and write callables, and only the sampling settings chat_reply takes."""
    if not (callable(read) and callable(write)):
        raise TypeError("read and write must be callables, like input and print")
    unknown = sorted(set(sampling) - {"max_new_tokens", "temperature", "generator"})
    if unknown:
        raise TypeError(f"chat_loop got {unknown[0]!r}: its sampling settings go to chat_reply, which takes "
                        "max_new_tokens, temperature and generator")

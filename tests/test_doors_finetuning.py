"""Issue 41: every public function and class of course_lib.finetuning (notebook 14), called the way a user who has not
read the code might: wrong types, wrong shapes, out-of-range numbers, NaN and inf, empty inputs, mismatched models and
tokenizers, damaged adapters. One table of cases: ("error", type, fragment of our message naming the argument) or
("result", check). A refused call that gets a model leaves it as it was (`unchanged`). `python
tests/test_doors_finetuning.py` prints how many cases are clear errors, correct results, unclear errors and silent
wrong answers."""

import math
import random
import string
import warnings
from dataclasses import replace

import torch
from torch import nn

from course_lib.config import GPTConfig
from course_lib.doors import finetuning as door
from course_lib.finetuning import (
    CHAT_TOKENS, IGNORE_INDEX, BagOfChars, ChatTokenizer, ClassifierGPT, LoRALinear, Passages, accuracy, apply_lora,
    chat_batch, chat_loop, chat_loss, chat_reply, chat_state_dict, copyable, encode_passages, find_lora_targets,
    format_chat,
    fit_logistic, generate_replies, grow_vocabulary, judge_reply, last_states, last_word, line_words,
    load_lora_state_dict,
    load_shakespeare_chat, lora_layers, lora_state_dict, make_instructions, merge_lora, order_lines, order_passages,
    play_passages, play_speeches, prompt_spans, shuffle_words, speeches, stratified_split, text_loss,
    train_classifier, train_new_rows,
    unmerge_lora, word_frequencies,
)
from course_lib.model import GPTModel
from course_lib.tokenization import CharTokenizer
from course_lib.training import load_shakespeare

from doors import door_tests, report

CFG = GPTConfig(vocab_size=12, context_length=16, emb_dim=16, n_heads=2, n_layers=2, drop_rate=0.0, qkv_bias=True,
                tie_weights=False)
TARGETS = ["att.W_query", "att.W_key", "att.W_value", "att.out_proj", "ff.fc", "ff.proj"]  # the notebook's
IDS = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 0]])  # ids of every vocabulary below


def model(cfg=CFG):
    torch.manual_seed(0)
    return GPTModel(cfg)


def lora_model(targets=("ff.fc",), cfg=CFG):
    m = model(cfg)
    apply_lora(m, list(targets), r=2, alpha=4)
    return m


def trained_lora():
    "A LoRA model whose B is not zero, as after training."
    m = lora_model()
    with torch.no_grad():
        for layer in lora_layers(m).values():
            layer.lora_B.normal_(0, 0.1)
    return m


def merged_model():
    m = trained_lora()
    merge_lora(m)
    return m


def one_merged():
    "A trained LoRA model whose second layer was merged by hand."
    m = trained_lora()
    m.trf_blocks[1].ff.fc.merge()
    return m


def unchanged(call, make=model):
    "call(m) on a fresh model; whatever happens, m's state_dict and requires_grad flags must be what they were."
    m = make()
    state = {k: v.clone() for k, v in m.state_dict().items()}
    grads = {n: p.requires_grad for n, p in m.named_parameters()}
    merged = {n: layer.merged for n, layer in m.named_modules() if isinstance(layer, LoRALinear)}
    training = m.training
    try:
        return call(m)
    finally:
        now = m.state_dict()
        assert now.keys() == state.keys() and all(torch.equal(state[k], now[k]) for k in state), "the model changed"
        assert grads == {n: p.requires_grad for n, p in m.named_parameters()}, "requires_grad changed"
        assert merged == {n: layer.merged for n, layer in m.named_modules() if isinstance(layer, LoRALinear)}
        assert m.training == training, "the model's mode changed"


def with_value(key, value):
    "lora_state_dict of a trained LoRA model, one entry replaced (a tensor: one element of it set to `value`)."
    state = lora_state_dict(trained_lora())
    if isinstance(value, float):
        state[key] = state[key].clone()
        state[key][0, 0] = value
    else:
        state[key] = value
    return state


KEY_B = "trf_blocks.1.ff.fc.lora_B"


def same_logits_as_base(m):
    with torch.no_grad():
        return torch.equal(m(IDS), model()(IDS))


# ------------------------------------------------------------------------------------------------------ classifier
TOK = CharTokenizer("abcdefgh")
TEXTS = ["abcabc", "hgf", "aab", "dd", "cheddd", "fade"]
LABELS = [0, 1, 0, 1, 0, 1]


def data():
    return encode_passages(TEXTS, LABELS, TOK, 4)


def bag():
    torch.manual_seed(0)
    return BagOfChars(8, 2)


def classifier(num_classes=2):
    torch.manual_seed(0)
    return ClassifierGPT(model(replace(CFG, vocab_size=8)), num_classes)


FEATURES = (torch.tensor([[0.0, 1.0], [0.2, 0.9], [1.0, 0.1], [0.9, 0.0], [0.1, 0.8], [0.8, 0.2]]),
            torch.tensor([0, 0, 1, 1, 0, 1]))  # two separable classes, as (features, labels)
SHAKESPEARE_CHARS = CharTokenizer(sorted(set(load_shakespeare())))  # the corpus's 65 characters


def passages(**changes):
    d = data()
    fields = dict(token_ids=d.token_ids, lengths=d.lengths, labels=d.labels, source=d.source) | changes
    return Passages(**fields)


def train_refused(make=bag, **overrides):
    "train_classifier with a bad argument: refused, and the model untouched (weights and mode)."
    args = dict(data=data(), epochs=1, lr=0.1, batch_size=2, weight_decay=0.0, seed=0) | overrides
    return unchanged(lambda m: train_classifier(m, **args), make)


# ------------------------------------------------------------------------------------------------------------ chat
CHARS = CharTokenizer(string.ascii_letters + " :\n.,!'")
CHAT = ChatTokenizer(CHARS)
CHAT_CFG = replace(CFG, vocab_size=CHAT.vocab_size, context_length=32)
PAIRS = [("abc", "ABC"), ("Caps:\nda bag.", "DA BAG.")]
TEXT = "ABE:\nA bad cafe, sir!\n\nCAD:\nFade the bead now.\nFace the cab.\n\nABE:\nBe a cab, dear Cad.\n\n"


def chat_model():
    return model(CHAT_CFG)


def chat_lora():
    m = chat_model()
    apply_lora(m, ["att.W_query"], 2, 4)
    return m


def batch():
    return chat_batch(CHAT, PAIRS, 32)


def twice(first, second=None):
    "A LoRALinear given `first` and then `second` (or `first` again)."
    layer = LoRALinear(nn.Linear(4, 4), 2, 4)
    getattr(layer, first)()
    getattr(layer, second or first)()
    return layer


def scripted(*messages):
    "A `read` for chat_loop that returns the messages in turn."
    lines = iter(messages)
    return lambda prompt: next(lines)


def moved(name):
    "The old name still imports, with a DeprecationWarning, and is the new one."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import course_lib.finetuning as finetuning
        found = getattr(finetuning, name)
    return found, [str(w.message) for w in caught if w.category is DeprecationWarning]


EXAMPLE = {"task": "upper", "instruction": "Upper case:\nab", "response": "AB"}

CASES = [
    # LoRALinear, merge, unmerge
    ("LoRALinear ok", lambda: LoRALinear(nn.Linear(4, 3), 2, 4)(torch.ones(1, 4)), "result",
     lambda y: y.shape == (1, 3)),
    ("LoRALinear conv", lambda: LoRALinear(nn.Conv1d(4, 4, 1), 2, 4), "error", TypeError, "linear must be a Linear"),
    ("LoRALinear module list", lambda: LoRALinear([nn.Linear(4, 4)], 2, 4), "error", TypeError, "linear"),
    ("LoRALinear r 0", lambda: LoRALinear(nn.Linear(4, 4), 0, 4), "error", ValueError, "r must be >= 1"),
    ("LoRALinear r 2.0", lambda: LoRALinear(nn.Linear(4, 4), 2.0, 4), "error", TypeError, "r must be an int"),
    ("LoRALinear r nan", lambda: LoRALinear(nn.Linear(4, 4), math.nan, 4), "error", TypeError, "r must be an int"),
    ("LoRALinear r True", lambda: LoRALinear(nn.Linear(4, 4), True, 4), "error", TypeError, "r must be an int"),
    ("LoRALinear alpha 0", lambda: LoRALinear(nn.Linear(4, 4), 2, 0), "error", ValueError, "alpha must be in (0, inf)"),
    ("LoRALinear alpha inf", lambda: LoRALinear(nn.Linear(4, 4), 2, math.inf), "error", ValueError, "alpha must be in"),
    ("LoRALinear alpha nan", lambda: LoRALinear(nn.Linear(4, 4), 2, math.nan), "error", ValueError, "alpha must be in"),
    ("LoRALinear alpha str", lambda: LoRALinear(nn.Linear(4, 4), 2, "16"), "error", TypeError,
     "alpha must be a number"),
    ("LoRALinear alpha 1e40", lambda: LoRALinear(nn.Linear(4, 4), 2, 1e40), "error", ValueError, "alpha / r = 5e+39"),
    ("LoRALinear fp16 alpha 1e6", lambda: LoRALinear(nn.Linear(4, 4).half(), 1, 1e6), "error", ValueError,
     "more than torch.float16 can hold"),
    ("merge() twice", lambda: twice("merge"), "error", RuntimeError, "already merged"),
    ("merge() unmerge()", lambda: twice("merge", "unmerge"), "result", lambda layer: not layer.merged),
    ("unmerge unmerged", lambda: LoRALinear(nn.Linear(4, 4), 2, 4).unmerge(), "error", RuntimeError, "is not merged"),
    # find_lora_targets
    ("targets ok", lambda: find_lora_targets(model(), ["ff.fc", "W_query"]), "result",
     lambda r: r == ["trf_blocks.0.att.W_query", "trf_blocks.0.ff.fc", "trf_blocks.1.att.W_query",
                     "trf_blocks.1.ff.fc"]),
    ("targets tuple", lambda: find_lora_targets(model(), ("ff.fc",)), "result", lambda r: len(r) == 2),
    ("targets repeated", lambda: find_lora_targets(model(), ["ff.fc", "ff.fc"]), "result", lambda r: len(r) == 2),
    ("targets model str", lambda: find_lora_targets("gpt2", ["ff.fc"]), "error", TypeError, "model must be a Module"),
    ("targets str", lambda: find_lora_targets(model(), "ff.fc"), "error", TypeError, "non-empty list"),
    ("targets None", lambda: find_lora_targets(model(), None), "error", TypeError, "non-empty list"),
    ("targets int name", lambda: find_lora_targets(model(), [3]), "error", TypeError, "each target name must be a str"),
    ("targets unknown", lambda: find_lora_targets(model(), ["c_attn"]), "error", ValueError,
     "no layer of the model is named 'c_attn'"),
    ("targets empty name", lambda: find_lora_targets(model(), [""]), "error", TypeError, "not an nn.Linear"),
    ("targets a block", lambda: find_lora_targets(model(), ["ff"]), "error", TypeError,
     "trf_blocks.0.ff is a FeedForward, not an nn.Linear"),
    ("targets LoRA already", lambda: find_lora_targets(lora_model(), ["ff.fc"]), "error", ValueError,
     "already has LoRA"),
    # apply_lora: the examples (alpha = inf) and the rest; a refusal leaves the model as it was
    ("apply ok", lambda: (lambda m: (apply_lora(m, TARGETS, 8, 16), m))(model()), "result",
     lambda r: len(r[0]) == 12 and same_logits_as_base(r[1])
     and {n for n, p in r[1].named_parameters() if p.requires_grad} == {f"{n}.lora_{x}" for n in r[0] for x in "AB"}),
    ("apply alpha inf (notebook targets)", lambda: unchanged(lambda m: apply_lora(m, TARGETS, 8, math.inf)),
     "error", ValueError, "alpha must be in (0, inf), got inf"),
    ("apply alpha inf (W_query)", lambda: unchanged(lambda m: apply_lora(m, ["att.W_query"], 8, math.inf)),
     "error", ValueError, "alpha must be in (0, inf), got inf"),
    ("apply alpha nan", lambda: unchanged(lambda m: apply_lora(m, TARGETS, 8, math.nan)), "error", ValueError,
     "alpha must be in"),
    ("apply alpha -inf", lambda: unchanged(lambda m: apply_lora(m, TARGETS, 8, -math.inf)), "error", ValueError,
     "alpha must be in"),
    ("apply alpha 0", lambda: unchanged(lambda m: apply_lora(m, TARGETS, 8, 0)), "error", ValueError,
     "alpha must be in"),
    ("apply alpha 1e40", lambda: unchanged(lambda m: apply_lora(m, ["att.W_query"], 8, 1e40)), "error", ValueError,
     "alpha / r"),
    ("apply alpha bool", lambda: unchanged(lambda m: apply_lora(m, TARGETS, 8, True)), "error", TypeError,
     "alpha must be a number"),
    ("apply alpha tensor", lambda: unchanged(lambda m: apply_lora(m, TARGETS, 8, torch.tensor(16.0))), "error",
     TypeError, "alpha must be a number"),
    ("apply fp16 alpha 1e6", lambda: unchanged(lambda m: apply_lora(m, TARGETS, 1, 1e6), lambda: model().half()),
     "error", ValueError, "more than torch.float16 can hold"),
    ("apply r 0", lambda: unchanged(lambda m: apply_lora(m, TARGETS, 0, 16)), "error", ValueError, "r must be >= 1"),
    ("apply r -3", lambda: unchanged(lambda m: apply_lora(m, TARGETS, -3, 16)), "error", ValueError, "r must be >= 1"),
    ("apply r 8.0", lambda: unchanged(lambda m: apply_lora(m, TARGETS, 8.0, 16)), "error", TypeError,
     "r must be an int"),
    ("apply r inf", lambda: unchanged(lambda m: apply_lora(m, TARGETS, math.inf, 16)), "error", TypeError,
     "r must be an int"),
    ("apply r None", lambda: unchanged(lambda m: apply_lora(m, TARGETS, None, 16)), "error", TypeError,
     "r must be an int"),
    ("apply model str", lambda: apply_lora("gpt2", TARGETS, 8, 16), "error", TypeError, "model must be a Module"),
    ("apply model state_dict", lambda: apply_lora(model().state_dict(), TARGETS, 8, 16), "error", TypeError,
     "model must be a Module"),
    ("apply targets str", lambda: unchanged(lambda m: apply_lora(m, "att.W_query", 8, 16)), "error", TypeError,
     "non-empty list"),
    ("apply targets []", lambda: unchanged(lambda m: apply_lora(m, [], 8, 16)), "error", TypeError, "non-empty list"),
    ("apply unknown last", lambda: unchanged(lambda m: apply_lora(m, ["ff.fc", "attn.c_proj"], 8, 16)), "error",
     ValueError, "no layer of the model is named 'attn.c_proj'"),
    ("apply twice", lambda: unchanged(lambda m: apply_lora(m, ["ff.fc"], 2, 4), lora_model), "error", ValueError,
     "already has LoRA"),
    ("apply tied head", lambda: unchanged(lambda m: apply_lora(m, ["ff.fc", "out_head"], 2, 4),
                                          lambda: model(replace(CFG, tie_weights=True))), "error", ValueError,
     "out_head's weight is shared with ['embedding.tok_emb.weight']"),
    ("apply untied head", lambda: apply_lora(model(), ["out_head"], 2, 4), "result", lambda r: r == ["out_head"]),
    # lora_layers, merge_lora, unmerge_lora, lora_state_dict
    ("layers ok", lambda: lora_layers(lora_model()), "result", lambda r: list(r) == ["trf_blocks.0.ff.fc",
                                                                                      "trf_blocks.1.ff.fc"]),
    ("layers none", lambda: lora_layers(model()), "error", ValueError, "call apply_lora"),
    ("layers str", lambda: lora_layers("model"), "error", TypeError, "model must be a Module"),
    ("merge ok", lambda: (lambda m: (merge_lora(m), m))(trained_lora()), "result",
     lambda r: all(layer.merged for layer in lora_layers(r[1]).values())),
    ("merge round trip", lambda: (lambda m, w: (merge_lora(m), unmerge_lora(m), (m.trf_blocks[0].ff.fc.weight - w)))(
        *(lambda m: (m, m.trf_blocks[0].ff.fc.weight.detach().clone()))(trained_lora()))[2], "result",
     lambda d: d.abs().max() < 1e-6),
    ("merge without LoRA", lambda: unchanged(merge_lora), "error", ValueError, "call apply_lora"),
    ("merge twice", lambda: unchanged(merge_lora, merged_model), "error", RuntimeError, "is already merged"),
    ("merge one merged by hand", lambda: unchanged(merge_lora, one_merged), "error", RuntimeError,
     "trf_blocks.1.ff.fc is already merged"),
    ("merge str", lambda: merge_lora("model"), "error", TypeError, "model must be a Module"),
    ("unmerge unmerged", lambda: unchanged(unmerge_lora, trained_lora), "error", RuntimeError, "is not merged"),
    ("unmerge without LoRA", lambda: unchanged(unmerge_lora), "error", ValueError, "call apply_lora"),
    ("state ok", lambda: lora_state_dict(lora_model()), "result",
     lambda s: sorted(s) == sorted(f"trf_blocks.{i}.ff.fc.lora_{x}" for i in (0, 1) for x in "AB")
     and s["trf_blocks.0.ff.fc.lora_A"].shape == (2, 16) and not s["trf_blocks.0.ff.fc.lora_A"].requires_grad),
    ("state without LoRA", lambda: lora_state_dict(model()), "error", ValueError, "call apply_lora"),
    ("state none", lambda: lora_state_dict(None), "error", TypeError, "model must be a Module"),
    # load_lora_state_dict: the example (NaN weights) and the rest; a refusal leaves the model as it was
    ("load ok", lambda: (lambda m, s: (load_lora_state_dict(m, s), m))(lora_model(), lora_state_dict(trained_lora())),
     "result", lambda r: all(torch.equal(a, b) for a, b in zip(lora_state_dict(r[1]).values(),
                                                                 lora_state_dict(trained_lora()).values()))),
    ("load fp16 state", lambda: load_lora_state_dict(lora_model(), {k: v.half() for k, v in
                                                                    lora_state_dict(trained_lora()).items()}),
     "result", lambda r: r is None),
    ("load NaN", lambda: unchanged(lambda m: load_lora_state_dict(m, with_value(KEY_B, math.nan)), lora_model),
     "error", ValueError, f"state['{KEY_B}'] holds NaN or infinite values"),
    ("load inf", lambda: unchanged(lambda m: load_lora_state_dict(m, with_value(KEY_B, math.inf)), lora_model),
     "error", ValueError, f"state['{KEY_B}'] holds NaN"),
    ("load -inf in A", lambda: unchanged(lambda m: load_lora_state_dict(
        m, with_value("trf_blocks.0.ff.fc.lora_A", -math.inf)), lora_model), "error", ValueError,
     "state['trf_blocks.0.ff.fc.lora_A'] holds NaN"),
    ("load int tensor", lambda: unchanged(lambda m: load_lora_state_dict(
        m, with_value(KEY_B, torch.zeros(16 * 4, 2, dtype=torch.long))), lora_model), "error", TypeError,
     "has dtype torch.int64"),
    ("load list value", lambda: unchanged(lambda m: load_lora_state_dict(m, with_value(KEY_B, [[0.0] * 2] * 64)),
                                          lora_model), "error", TypeError, f"state['{KEY_B}'] is a list, not a tensor"),
    ("load other rank", lambda: unchanged(lambda m: load_lora_state_dict(m, lora_state_dict(lora_model())),
                                          lambda: (lambda m: (apply_lora(m, ["ff.fc"], 3, 6), m)[1])(model())),
     "error", ValueError, "with the rank r used when it was saved"),
    ("load other layers", lambda: unchanged(lambda m: load_lora_state_dict(m, lora_state_dict(lora_model(["ff.proj"]))),
                                            lora_model), "error", ValueError, "missing ['trf_blocks.0.ff.fc.lora_A'"),
    ("load missing key", lambda: unchanged(lambda m: load_lora_state_dict(
        m, {k: v for k, v in lora_state_dict(trained_lora()).items() if k != KEY_B}), lora_model), "error", ValueError,
     f"missing ['{KEY_B}']"),
    ("load extra key", lambda: unchanged(lambda m: load_lora_state_dict(
        m, lora_state_dict(trained_lora()) | {"out_head.weight": torch.zeros(12, 16)}), lora_model), "error",
     ValueError, "unexpected ['out_head.weight']"),
    ("load whole state_dict", lambda: unchanged(lambda m: load_lora_state_dict(m, model().state_dict()), lora_model),
     "error", ValueError, "state does not fit this model's adapters"),
    ("load list", lambda: unchanged(lambda m: load_lora_state_dict(m, [1]), lora_model), "error", TypeError,
     "state must be a dict"),
    ("load into merged", lambda: unchanged(lambda m: load_lora_state_dict(m, lora_state_dict(trained_lora())),
                                           merged_model), "error", RuntimeError, "unmerge_lora(model) before loading"),
    ("load without LoRA", lambda: unchanged(lambda m: load_lora_state_dict(m, lora_state_dict(trained_lora()))),
     "error", ValueError, "call apply_lora"),
    # play_speeches, stratified_split, Passages, encode_passages, play_passages
    ("speeches of plays ok", lambda: play_speeches(), "result", lambda r: len(r[0]) == len(r[1]) and len(r[2]) == 7),
    ("speeches of plays short", lambda: play_speeches("too short"), "error", ValueError, "pass the shipped corpus"),
    ("speeches of plays int", lambda: play_speeches(5), "error", TypeError, "text must be a str"),
    ("speeches of plays bytes", lambda: play_speeches(b"HAMLET:\n"), "error", TypeError, "text must be a str"),
    ("split ok", lambda: stratified_split([0, 1] * 10, (0.5, 0.5), 0), "result",
     lambda r: sorted(torch.cat(r).tolist()) == list(range(20)) and [len(p) for p in r] == [10, 10]),
    ("split sum", lambda: stratified_split([0, 1], (0.5, 0.6), 0), "error", ValueError, "sum to 1"),
    ("split nan", lambda: stratified_split([0, 1], (math.nan, 1.0), 0), "error", ValueError, "sum to 1"),
    ("split nan nan", lambda: stratified_split([0, 1], (math.nan, math.nan), 0), "error", ValueError, "sum to 1"),
    ("split inf", lambda: stratified_split([0, 1], (math.inf, -math.inf), 0), "error", ValueError, "sum to 1"),
    ("split negative", lambda: stratified_split([0, 1], (1.5, -0.5), 0), "error", ValueError, "positive floats"),
    ("split ints", lambda: stratified_split([0, 1], (1,), 0), "error", ValueError, "positive floats"),
    ("split list", lambda: stratified_split([0, 1], [0.5, 0.5], 0), "error", TypeError, "fractions must be a tuple"),
    ("split empty fractions", lambda: stratified_split([0, 1], (), 0), "error", ValueError, "fractions must be"),
    ("split no labels", lambda: stratified_split([], (1.0,), 0), "error", ValueError, "labels is empty"),
    ("split str labels", lambda: stratified_split(["a", "b"], (1.0,), 0), "error", TypeError,
     "labels[0] must be an int"),
    ("split negative label", lambda: stratified_split([0, -1], (1.0,), 0), "error", ValueError,
     "labels[1] must be >= 0"),
    ("split tensor labels", lambda: stratified_split(torch.tensor([0, 1]), (1.0,), 0), "error", TypeError,
     "labels must be a list"),
    ("split seed float", lambda: stratified_split([0, 1], (1.0,), 0.5), "error", TypeError, "seed must be an int"),
    ("Passages index", lambda: data()[torch.tensor([0, 2])], "result",
     lambda p: len(p) == 2 and p.labels.tolist() == [0, 0] and p.source.tolist() == [0, 2]),
    ("encode ok", data, "result", lambda p: p.token_ids.shape == (6, 4) and p.lengths.tolist() == [4, 3, 3, 2, 4, 4]),
    ("encode one label short", lambda: encode_passages(["ab"], [0, 1], TOK, 4), "error", ValueError,
     "one label per text"),
    ("encode nothing", lambda: encode_passages([], [], TOK, 4), "error", ValueError, "one label per text, and not 0"),
    ("encode empty text", lambda: encode_passages(["ab", ""], [0, 1], TOK, 4), "error", ValueError,
     "texts[1] is empty"),
    ("encode int text", lambda: encode_passages(["ab", 5], [0, 1], TOK, 4), "error", TypeError,
     "texts[1] must be a str"),
    ("encode str texts", lambda: encode_passages("ab", [0, 1], TOK, 4), "error", TypeError, "texts must be a list"),
    ("encode labels tensor", lambda: encode_passages(["ab"], torch.tensor([0]), TOK, 4), "error", TypeError,
     "labels must be a list"),
    ("encode labels float", lambda: encode_passages(["ab"], [0.0], TOK, 4), "error", TypeError,
     "labels[0] must be an int"),
    ("encode max_chars 0", lambda: encode_passages(["ab"], [0], TOK, 0), "error", ValueError, "max_chars must be >= 1"),
    ("encode max_chars 2.5", lambda: encode_passages(["ab"], [0], TOK, 2.5), "error", TypeError, "max_chars"),
    ("encode tokenizer str", lambda: encode_passages(["ab"], [0], "abc", 4), "error", TypeError,
     "tokenizer must be a CharTokenizer"),
    ("encode unknown char", lambda: encode_passages(["xyz"], [0], TOK, 4), "error", ValueError,
     "are not in the vocabulary"),
    ("passages 2 shares", lambda: play_passages(TOK, fractions=(0.5, 0.5)), "error", ValueError, "three shares"),
    ("passages shares nan", lambda: play_passages(TOK, fractions=(math.nan, 0.5, 0.5)), "error", ValueError,
     "sum to 1"),
    ("passages min_chars 0", lambda: play_passages(TOK, min_chars=0), "error", ValueError, "min_chars must be >= 1"),
    ("passages min_chars nan", lambda: play_passages(TOK, min_chars=math.nan), "error", TypeError, "min_chars"),
    ("passages max_chars 1.5", lambda: play_passages(TOK, max_chars=1.5), "error", TypeError, "max_chars"),
    ("passages seed str", lambda: play_passages(TOK, seed="0"), "error", TypeError, "seed must be an int"),
    ("passages tokenizer None", lambda: play_passages(None), "error", TypeError, "tokenizer must be a CharTokenizer"),
    ("passages other tokenizer", lambda: play_passages(TOK), "error", ValueError, "are not in the vocabulary"),
    # BagOfChars, ClassifierGPT and their forward; the door that left the lesson: lengths
    ("bag ok", lambda: bag()(data().token_ids, data().lengths), "result", lambda y: y.shape == (6, 2)),
    ("bag lengths None", lambda: bag()(data().token_ids), "result", lambda y: y.shape == (6, 2)),
    ("bag classes 1", lambda: BagOfChars(8, 1), "error", ValueError, "num_classes must be >= 2"),
    ("bag vocab 0", lambda: BagOfChars(0, 2), "error", ValueError, "vocab_size must be >= 1"),
    ("bag vocab 8.0", lambda: BagOfChars(8.0, 2), "error", TypeError, "vocab_size must be an int"),
    ("bag ids float", lambda: bag()(data().token_ids.float()), "error", TypeError, "token_ids must hold integer"),
    ("bag ids 1-D", lambda: bag()(data().token_ids[0]), "error", ValueError, "token_ids must be 2-D"),
    ("bag ids too big", lambda: bag()(data().token_ids + 8), "error", ValueError, "token_ids holds token id"),
    ("bag ids list", lambda: bag()([[1, 2]]), "error", TypeError, "token_ids must be a torch.Tensor"),
    ("bag lengths shape", lambda: bag()(IDS, torch.tensor([4])), "error", ValueError, "lengths has shape (1,)"),
    ("bag lengths 0", lambda: bag()(IDS, torch.tensor([4, 0])), "error", ValueError, "lengths must be in [1, 4]"),
    ("bag lengths 5", lambda: bag()(IDS, torch.tensor([4, 5])), "error", ValueError, "lengths must be in [1, 4]"),
    ("bag lengths float", lambda: bag()(IDS, torch.tensor([4.0, 2.0])), "error", TypeError,
     "lengths must be an integer tensor"),
    ("bag lengths list", lambda: bag()(IDS, [4, 2]), "error", TypeError, "lengths must be an integer tensor"),
    ("clf ok", lambda: classifier()(IDS, torch.tensor([4, 2])), "result", lambda y: y.shape == (2, 2)),
    ("clf padding ignored", lambda: (classifier()(IDS[:, :2]), classifier()(IDS, torch.tensor([2, 2]))), "result",
     lambda r: torch.allclose(r[0], r[1], atol=1e-6)),
    ("clf model linear", lambda: ClassifierGPT(nn.Linear(2, 2), 3), "error", TypeError, "model must be a GPTModel"),
    ("clf classes 1", lambda: ClassifierGPT(model(), 1), "error", ValueError, "num_classes must be >= 2"),
    ("clf classes 2.0", lambda: ClassifierGPT(model(), 2.0), "error", TypeError, "num_classes must be an int"),
    ("clf too long", lambda: classifier()(torch.zeros(1, 17, dtype=torch.long)), "error", ValueError, "17 tokens"),
    ("clf lengths > tokens", lambda: classifier()(IDS, torch.tensor([4, 5])), "error", ValueError,
     "lengths must be in [1, 4]"),
    ("clf ids too big", lambda: classifier()(IDS + 4), "error", ValueError, "token_ids holds token id 11"),
    ("clf ids meta", lambda: classifier()(IDS.to("meta")), "error", ValueError, "token_ids is on meta"),
    ("lengths door None", lambda: door.lengths(None, IDS), "result", lambda r: r.tolist() == [4, 4]),
    ("lengths door int32", lambda: door.lengths(torch.tensor([1, 4], dtype=torch.int32), IDS), "result",
     lambda r: r.tolist() == [1, 4]),
    # train_classifier and accuracy: a refusal leaves the model's weights and mode as they were
    ("train ok", lambda: train_classifier(bag(), data(), 2, 0.1, batch_size=2), "result",
     lambda losses: len(losses) == 6 and all(math.isfinite(x) for x in losses)),
    ("train frozen", lambda: train_refused(lambda: bag().requires_grad_(False)), "error", ValueError,
     "no parameter that requires grad"),
    ("train data tuple", lambda: train_refused(data=(data().token_ids, data().labels)), "error", TypeError,
     "data must be a Passages"),
    ("train data empty", lambda: train_refused(data=data()[torch.arange(0)]), "error", ValueError,
     "data holds no passage"),
    ("train labels >= classes", lambda: train_refused(data=passages(labels=torch.tensor([0, 1, 2, 0, 1, 2]))),
     "error", ValueError, "data.labels must be int64 classes in [0, 2)"),
    ("train labels negative", lambda: train_refused(data=passages(labels=-torch.ones(6, dtype=torch.long))),
     "error", ValueError, "data.labels must be"),
    ("train labels float", lambda: train_refused(data=passages(labels=torch.zeros(6))), "error", ValueError,
     "data.labels must be int64"),
    ("train lengths short", lambda: train_refused(data=passages(lengths=torch.tensor([4, 4]))), "error", ValueError,
     "one entry per passage"),
    ("train ids too big", lambda: train_refused(data=passages(token_ids=data().token_ids + 8)), "error", ValueError,
     "data.token_ids holds token id"),
    ("train ids too long", lambda: train_refused(classifier, data=encode_passages(["abcdefgh" * 3], [0], TOK, 24)),
     "error", ValueError, "data.token_ids has 24 tokens"),
    ("train lengths 0", lambda: train_refused(data=passages(lengths=torch.tensor([4, 3, 3, 2, 4, 0]))), "error",
     ValueError, "lengths must be in [1, 4]"),
    ("train lr 0", lambda: train_refused(lr=0.0), "error", ValueError, "lr must be in"),
    ("train lr inf", lambda: train_refused(lr=math.inf), "error", ValueError, "lr must be in"),
    ("train lr nan", lambda: train_refused(lr=math.nan), "error", ValueError, "lr must be in"),
    ("train lr str", lambda: train_refused(lr="1e-3"), "error", TypeError, "lr must be a number"),
    ("train decay inf", lambda: train_refused(weight_decay=math.inf), "error", ValueError, "weight_decay must be in"),
    ("train decay -1", lambda: train_refused(weight_decay=-1.0), "error", ValueError, "weight_decay must be in"),
    ("train epochs 0", lambda: train_refused(epochs=0), "error", ValueError, "epochs must be >= 1"),
    ("train epochs 1.5", lambda: train_refused(epochs=1.5), "error", TypeError, "epochs must be an int"),
    ("train batch 0", lambda: train_refused(batch_size=0), "error", ValueError, "batch_size must be >= 1"),
    ("train seed float", lambda: train_refused(seed=0.5), "error", TypeError, "seed must be an int"),
    ("train GPTModel", lambda: train_refused(model), "error", TypeError,
     "model must be a ClassifierGPT or a BagOfChars"),
    ("train classifier ok", lambda: train_classifier(classifier(), data(), 1, 1e-3, batch_size=3), "result",
     lambda losses: len(losses) == 2),
    ("accuracy ok", lambda: accuracy(bag(), data()), "result", lambda a: 0 <= a <= 1),
    ("accuracy list", lambda: accuracy(bag(), [1, 2]), "error", TypeError, "data must be a Passages"),
    ("accuracy empty", lambda: accuracy(bag(), data()[torch.arange(0)]), "error", ValueError, "data holds no passage"),
    ("accuracy batch 0", lambda: accuracy(bag(), data(), 0), "error", ValueError, "batch_size must be >= 1"),
    ("accuracy str model", lambda: accuracy("bag", data()), "error", TypeError, "model must be a ClassifierGPT"),
    ("accuracy labels >= classes", lambda: accuracy(bag(), passages(labels=torch.full((6,), 5))), "error",
     ValueError, "data.labels must be int64 classes in [0, 2)"),
    # word_frequencies, fit_logistic, last_states: the bag of words and the probe fitted to convergence
    ("words ok", lambda: word_frequencies(["O Rome, O Rome", "Rome"]), "result",
     lambda r: r[1] == ["o", "rome"] and torch.allclose(r[0], torch.tensor([[0.5, 0.5], [0.0, 1.0]]))),
    ("words unseen word", lambda: word_frequencies(["good night"], ["night"]), "result",
     lambda r: torch.equal(r[0], torch.tensor([[1.0]]))),
    ("words no known word", lambda: word_frequencies(["..."], ["night"]), "result",
     lambda r: torch.equal(r[0], torch.zeros(1, 1))),
    ("words str", lambda: word_frequencies("O Rome"), "error", TypeError, "texts must be a list"),
    ("words int text", lambda: word_frequencies(["a", 3]), "error", TypeError, "texts[1] must be a str"),
    ("words vocabulary str", lambda: word_frequencies(["a"], "a"), "error", TypeError, "vocabulary must be a list"),
    ("words vocabulary empty", lambda: word_frequencies(["a"], []), "error", ValueError,
     "vocabulary must be a non-empty"),
    ("words vocabulary twice", lambda: word_frequencies(["a"], ["a", "a"]), "error", ValueError, "distinct words"),
    ("words vocabulary capital", lambda: word_frequencies(["Rome"], ["Rome"]), "error", ValueError,
     "each lower-case letters and apostrophes"),
    ("logistic ok", lambda: fit_logistic(FEATURES, FEATURES, 2), "result",
     lambda r: isinstance(r[0], nn.Linear) and r[1] in (1e-4, 1e-3, 1e-2, 1e-1)
     and bool((r[0](FEATURES[0]).argmax(-1) == FEATURES[1]).all())),
    ("logistic one class", lambda: fit_logistic(FEATURES, FEATURES, 1), "error", ValueError,
     "num_classes must be >= 2"),
    ("logistic list", lambda: fit_logistic([FEATURES[0], FEATURES[1]], FEATURES, 2), "error", TypeError,
     "train must be a tuple (features (n, d), labels (n,))"),
    ("logistic 1-d features", lambda: fit_logistic((FEATURES[0][:, 0], FEATURES[1]), FEATURES, 2), "error",
     ValueError, "train must be (features (n, d) float32, labels (n,))"),
    ("logistic int features", lambda: fit_logistic((FEATURES[0].long(), FEATURES[1]), FEATURES, 2), "error",
     ValueError, "train must be (features (n, d) float32"),
    ("logistic float64 features", lambda: fit_logistic((FEATURES[0].double(), FEATURES[1]), FEATURES, 2), "error",
     ValueError, ".float() casts the features"),
    ("logistic one row", lambda: fit_logistic((FEATURES[0][:1], FEATURES[1][:1]), FEATURES, 2), "error",
     ValueError, "with the same n >= 2"),
    ("logistic constant column", lambda: fit_logistic((torch.cat([FEATURES[0], torch.ones(6, 1)], 1), FEATURES[1]),
                                                      (torch.cat([FEATURES[0], torch.ones(6, 1)], 1), FEATURES[1]), 2),
     "result", lambda r: bool(torch.isfinite(r[0].weight).all()) and r[0].weight[:, 2].abs().max() < 1),
    ("logistic n mismatch", lambda: fit_logistic((FEATURES[0], FEATURES[1][:3]), FEATURES, 2), "error", ValueError,
     "with the same n >= 2"),
    ("logistic val width", lambda: fit_logistic(FEATURES, (FEATURES[0][:, :1], FEATURES[1]), 2), "error", ValueError,
     "val's features have 1 columns, train's 2"),
    ("logistic label 2", lambda: fit_logistic((FEATURES[0], FEATURES[1] + 1), FEATURES, 2), "error", ValueError,
     "train's labels must be int64 classes in [0, 2)"),
    ("logistic nan", lambda: fit_logistic((FEATURES[0].masked_fill(FEATURES[0] > 0.5, math.nan), FEATURES[1]),
                                          FEATURES, 2), "error", ValueError, "train's features hold NaN or inf"),
    ("logistic penalty list", lambda: fit_logistic(FEATURES, FEATURES, 2, [0.1]), "error", TypeError,
     "penalties must be a non-empty tuple"),
    ("logistic penalty -1", lambda: fit_logistic(FEATURES, FEATURES, 2, (-1.0,)), "error", ValueError,
     "penalties[0] must be"),
    ("logistic max_iter 0", lambda: fit_logistic(FEATURES, FEATURES, 2, max_iter=0), "error", ValueError,
     "max_iter must be >= 1"),
    ("states ok", lambda: last_states(model(replace(CFG, vocab_size=8)), data(), 4), "result",
     lambda s: s.shape == (6, 16)),
    ("states classifier", lambda: last_states(classifier(), data()), "error", TypeError,
     "model must be a GPTModel"),
    ("states list", lambda: last_states(model(replace(CFG, vocab_size=8)), [1]), "error", TypeError,
     "data must be a Passages"),
    ("states empty", lambda: last_states(model(replace(CFG, vocab_size=8)), data()[torch.arange(0)]), "error",
     ValueError, "data holds no passage"),
    ("states vocabulary", lambda: last_states(model(replace(CFG, vocab_size=4)), data()), "error", ValueError,
     "data.token_ids"),
    ("states batch 0", lambda: last_states(model(replace(CFG, vocab_size=8)), data(), 0), "error", ValueError,
     "batch_size must be >= 1"),
    # shuffle_words, order_lines, order_passages: the word-order task
    ("shuffle ok", lambda: shuffle_words("Is this a dagger which I see", random.Random(0)), "result",
     lambda s: s != "Is this a dagger which I see" and sorted(s) == sorted("Is this a dagger which I see")),
    ("shuffle too few", lambda: shuffle_words("Ay, my lord.", random.Random(0)), "result", lambda s: s is None),
    ("shuffle one word", lambda: shuffle_words("O the the the end", random.Random(0)), "result", lambda s: s is None),
    ("shuffle bytes", lambda: shuffle_words(b"a b c d e", random.Random(0)), "error", TypeError, "line must be a str"),
    ("shuffle seed int", lambda: shuffle_words("a b c d e", 0), "error", TypeError,
     "rng must be a Random, got int: pass a seeded generator"),
    ("order lines ok", lambda: order_lines("A:\nIs this a dagger which I see\n\n", min_chars=5), "result",
     lambda lines: lines == ["Is this a dagger which I see"]),
    ("order lines excluded", lambda: order_lines("A:\nIs this a dagger which I see\n\n",
                                                 "B:\nIs this a dagger which I see\n"), "result",
     lambda lines: lines == []),
    ("order lines bytes", lambda: order_lines(b"A:\nx\n\n"), "error", TypeError, "text must be a str"),
    ("order lines exclude None", lambda: order_lines("A:\nx\n\n", None), "error", TypeError, "exclude must be a str"),
    ("order lines max < min", lambda: order_lines("A:\nx\n\n", "", 20, 10), "error", ValueError,
     "max_chars must be >= 20"),
    ("order passages tokenizer", lambda: order_passages("chars"), "error", TypeError,
     "tokenizer must be a CharTokenizer"),
    ("order passages too many", lambda: order_passages(SHAKESPEARE_CHARS, train_lines=10**6), "error", ValueError,
     "usable lines: ask for fewer"),
    ("order passages val 1", lambda: order_passages(SHAKESPEARE_CHARS, val_lines=1), "error", ValueError,
     "val_lines must be >= 2"),
    ("order passages seed", lambda: order_passages(SHAKESPEARE_CHARS, seed="0"), "error", TypeError,
     "seed must be an int"),
    # grow_vocabulary, train_new_rows
    ("grow ok", lambda: (lambda m, g: (m, g))(model(), grow_vocabulary(model(), 3)), "result",
     lambda r: r[1].cfg.vocab_size == 15 and torch.equal(r[1].out_head.weight[:12], r[0].out_head.weight)),
    ("grow tied", lambda: grow_vocabulary(model(replace(CFG, tie_weights=True)), 3), "result",
     lambda g: g.out_head.weight is g.embedding.tok_emb.weight and g.out_head.weight.shape == (15, 16)),
    ("grow 0", lambda: grow_vocabulary(model(), 0), "error", ValueError, "n_new must be >= 1"),
    ("grow 2.0", lambda: grow_vocabulary(model(), 2.0), "error", TypeError, "n_new must be an int"),
    ("grow linear", lambda: grow_vocabulary(nn.Linear(2, 2), 1), "error", TypeError, "model must be a GPTModel"),
    ("new rows ok", lambda: train_new_rows(grow_vocabulary(model(), 3), 12), "result", lambda ps: len(ps) == 2),
    ("new rows past", lambda: train_new_rows(grow_vocabulary(model(), 3), 15), "error", ValueError, "first_new is 15"),
    ("new rows 0", lambda: train_new_rows(model(), 0), "error", ValueError, "first_new must be >= 1"),
    ("new rows float", lambda: train_new_rows(model(), 11.0), "error", TypeError, "first_new must be an int"),
    ("new rows linear", lambda: train_new_rows(nn.Linear(2, 2), 1), "error", TypeError, "model must be a GPTModel"),
    # ChatTokenizer, format_chat
    ("chat tok ok", lambda: CHAT.decode(CHAT.encode(format_chat("ab", "c"))), "result",
     lambda text: text == "<|user|>ab<|assistant|>c<|end|>"),
    ("chat tok ids", lambda: CHAT.encode("<|user|>a"), "result", lambda ids: ids == [CHAT.user_id, 0]),
    ("chat tok list", lambda: ChatTokenizer(["a", "b"]), "error", TypeError, "char_tokenizer must be a CharTokenizer"),
    ("chat tok of chat tok", lambda: ChatTokenizer(CHAT), "error", TypeError, "char_tokenizer must be a CharTokenizer"),
    ("chat encode int", lambda: CHAT.encode(5), "error", TypeError, "expected string"),
    ("chat encode bytes", lambda: CHAT.encode(b"ab"), "error", TypeError, "bytes-like object"),
    ("chat encode unknown", lambda: CHAT.encode("Ça"), "error", ValueError, "are not in the vocabulary"),
    ("chat decode tensor", lambda: CHAT.decode(torch.tensor([0, CHAT.end_id])), "result", lambda t: t == "a<|end|>"),
    ("chat decode -1", lambda: CHAT.decode([0, -1]), "error", ValueError, "ids[1] = -1 is not a token id"),
    ("chat decode too big", lambda: CHAT.decode([CHAT.vocab_size]), "error", ValueError, "is not a token id"),
    ("chat decode float", lambda: CHAT.decode([1.0]), "error", TypeError, "ids must be a sequence of int"),
    ("chat decode 2-D", lambda: CHAT.decode(torch.tensor([[0, 1]])), "error", TypeError, "ids must be a sequence"),
    ("chat decode str", lambda: CHAT.decode("ab"), "error", TypeError, "ids must be a sequence"),
    ("format ok", lambda: format_chat("ab"), "result", lambda t: t == "<|user|>ab<|assistant|>"),
    ("format end inside", lambda: format_chat("Hi<|end|>"), "error", ValueError,
     "instruction contains the chat token '<|end|>'"),
    ("format user in response", lambda: format_chat("Hi", "<|user|>x"), "error", ValueError,
     "response contains the chat token '<|user|>'"),
    ("format None", lambda: format_chat(None), "error", TypeError, "instruction must be a str"),
    ("format response int", lambda: format_chat("Hi", 5), "error", TypeError, "response must be a str"),
    # chat_batch, chat_loss
    ("batch ok", batch, "result",
     lambda r: r[0].shape == r[1].shape and (r[1] != IGNORE_INDEX).sum() == len("ABC") + len("DA BAG.") + 2),
    ("batch empty", lambda: chat_batch(CHAT, [], 32), "error", TypeError, "examples must be a non-empty list"),
    ("batch str", lambda: chat_batch(CHAT, "ab", 32), "error", TypeError, "examples must be a non-empty list"),
    ("batch flat pair", lambda: chat_batch(CHAT, ["ab"], 32), "error", TypeError,
     "examples[0] must be an (instruction, response) pair"),
    ("batch triple", lambda: chat_batch(CHAT, [("a", "b", "c")], 32), "error", TypeError, "examples[0] must be"),
    ("batch int response", lambda: chat_batch(CHAT, [("a", 5)], 32), "error", TypeError, "response must be a str"),
    ("batch too long", lambda: chat_batch(CHAT, PAIRS + [("a" * 40, "b")], 32), "error", ValueError,
     "examples[2] is 44 tokens long"),
    ("batch context 0", lambda: chat_batch(CHAT, PAIRS, 0), "error", ValueError, "context_length must be >= 1"),
    ("batch char tokenizer", lambda: chat_batch(CHARS, PAIRS, 32), "error", TypeError,
     "tokenizer must be a ChatTokenizer"),
    ("batch chat token", lambda: chat_batch(CHAT, [("a<|end|>", "b")], 32), "error", ValueError,
     "instruction contains the chat token"),
    ("loss ok", lambda: chat_loss(chat_model(), *batch()), "result", lambda l: l.ndim == 0 and math.isfinite(l.item())),
    ("loss all ignored", lambda: chat_loss(chat_model(), batch()[0], torch.full_like(batch()[1], IGNORE_INDEX)),
     "error", ValueError, "every target is IGNORE_INDEX"),
    ("loss shape", lambda: chat_loss(chat_model(), batch()[0], batch()[1][:, 1:]), "error", ValueError,
     "targets must be int64 of the inputs' shape"),
    ("loss float targets", lambda: chat_loss(chat_model(), batch()[0], batch()[1].float()), "error", ValueError,
     "targets must be int64"),
    ("loss targets list", lambda: chat_loss(chat_model(), batch()[0], batch()[1].tolist()), "error", TypeError,
     "targets must be a Tensor"),
    ("loss inputs list", lambda: chat_loss(chat_model(), batch()[0].tolist(), batch()[1]), "error", TypeError,
     "inputs must be a Tensor"),
    ("loss target too big", lambda: chat_loss(chat_model(), batch()[0], batch()[1].clamp(min=0) + 30), "error",
     ValueError, "each must be a token id of the model's vocabulary"),
    ("loss target -5", lambda: chat_loss(chat_model(), batch()[0], torch.where(batch()[1] < 0, -5, batch()[1])),
     "error", ValueError, "or IGNORE_INDEX (-100)"),
    ("loss base model", lambda: chat_loss(model(replace(CHAT_CFG, vocab_size=CHARS.vocab_size)), *batch()), "error",
     ValueError, "the model's vocabulary (59 tokens)"),
    ("loss model str", lambda: chat_loss("gpt", *batch()), "error", TypeError, "model must be a Module"),
    # speeches, last_word, make_instructions, judge_reply
    ("speeches ok", lambda: speeches(TEXT), "result",
     lambda r: [who for who, _ in r] == ["ABE", "CAD", "ABE"] and r[1][1][1] == "Face the cab."),
    ("speeches int", lambda: speeches(5), "error", TypeError, "text must be a str"),
    ("speeches list", lambda: speeches(TEXT.split("\n")), "error", TypeError, "text must be a str"),
    ("last word ok", lambda: last_word("Hail, sir!"), "result", lambda w: w == "sir"),
    ("last word none", lambda: last_word("!!"), "result", lambda w: w == ""),
    ("last word int", lambda: last_word(5), "error", TypeError, "expected string"),
    ("line words ok", lambda: line_words("Hail, sir! ne'er"), "result", lambda w: w == ["Hail", "sir", "ne'er"]),
    ("line words none", lambda: line_words("-- !"), "result", lambda w: w == []),
    ("line words int", lambda: line_words(5), "error", TypeError, "expected string"),
    ("spans ok", lambda: prompt_spans("Upper case:\nab, cd"), "result",
     lambda r: {"ab", "ab,", "cd", "ab, cd", "ab cd", "Upper case:\nab, cd"} <= r and "" not in r),
    ("spans empty", lambda: prompt_spans(""), "result", lambda r: r == set()),
    ("spans int", lambda: prompt_spans(5), "error", TypeError, "instruction must be a str"),
    ("spans list", lambda: prompt_spans(["ab"]), "error", TypeError, "instruction must be a str"),
    ("copyable no", lambda: copyable(EXAMPLE), "result", lambda r: r is False),
    ("copyable yes", lambda: copyable({**EXAMPLE, "instruction": "Upper case:\nAB"}), "result", lambda r: r is True),
    ("copyable no task", lambda: copyable({"instruction": "AB", "response": "AB"}), "error", ValueError,
     "example must have a 'task'"),
    ("copyable no instruction", lambda: copyable({"task": "upper", "response": "AB"}), "error", ValueError,
     "example must have an 'instruction'"),
    ("copyable list", lambda: copyable([EXAMPLE]), "error", TypeError, "example must be a dict"),
    ("copyable no response", lambda: copyable({"task": "upper", "instruction": "Upper case:\nab"}), "error",
     ValueError, "example must have a 'task'"),
    # text_loss
    ("text loss ok", lambda: text_loss(chat_model(), torch.arange(70) % 20), "result",
     lambda r: isinstance(r, float) and math.isfinite(r) and r > 0),
    ("text loss one window", lambda: text_loss(chat_model(), torch.arange(32) % 20), "error", ValueError,
     "no window of the context length (32)"),
    ("text loss 2-D", lambda: text_loss(chat_model(), (torch.arange(70) % 20).view(2, 35)), "error", ValueError,
     "token_ids must be 1-D"),
    ("text loss list", lambda: text_loss(chat_model(), list(range(70))), "error", TypeError,
     "token_ids must be a torch.Tensor"),
    ("text loss id too big", lambda: text_loss(chat_model(), torch.arange(70) + 100), "error", ValueError,
     "token_ids holds token id"),
    ("text loss batch 0", lambda: text_loss(chat_model(), torch.arange(70) % 20, 0), "error", ValueError,
     "batch_size must be >= 1"),
    ("text loss model str", lambda: text_loss("gpt", torch.arange(70) % 20), "error", TypeError,
     "model must be a GPTModel"),
    ("instructions ok", lambda: make_instructions(TEXT * 3, 1, 0), "result",
     lambda r: [e["task"] for e in r] == ["upper", "last_word", "count", "continue"]),
    ("instructions same seed", lambda: (make_instructions(TEXT * 3, 1, 5), make_instructions(TEXT * 3, 1, 5)), "result",
     lambda r: r[0] == r[1]),
    ("instructions too few", lambda: make_instructions("ROMEO:\nHi.\n", 1, 0), "error", ValueError,
     "text has 0 usable lines for task 'upper'"),
    ("instructions all excluded", lambda: make_instructions(TEXT * 3, 1, 0, exclude=TEXT), "error",
     ValueError, "usable lines for task"),
    ("instructions per_task 0", lambda: make_instructions(TEXT, 0, 0), "error", ValueError, "per_task must be >= 1"),
    ("instructions seed float", lambda: make_instructions(TEXT, 1, 0.5), "error", TypeError, "seed must be an int"),
    ("instructions exclude list", lambda: make_instructions(TEXT, 1, 0, exclude=["Face the cab."]), "error", TypeError,
     "exclude must be a str"),
    ("instructions max_line 5", lambda: make_instructions(TEXT, 1, 0, max_line=5), "error", ValueError,
     "max_line must be >= 12"),
    ("instructions text None", lambda: make_instructions(None, 1, 0), "error", TypeError, "text must be a str"),
    ("instructions min_line 0", lambda: make_instructions(TEXT, 1, 0, min_line=0), "error", ValueError,
     "min_line must be >= 1"),
    ("instructions max below min", lambda: make_instructions(TEXT, 1, 0, max_line=20, min_line=30), "error",
     ValueError, "max_line must be >= 30"),
    ("instructions long lines", lambda: make_instructions(TEXT * 3, 1, 0, max_line=19, min_line=13), "result",
     lambda r: all(13 <= len(e["instruction"].split("\n")[-1]) <= 19 for e in r if e["task"] != "continue")),
    ("judge ok", lambda: (judge_reply(EXAMPLE, "AB"), judge_reply(EXAMPLE, "AB ")), "result",
     lambda r: r == (True, False)),
    ("judge continue", lambda: judge_reply({"task": "continue", "response": "ABE:\nbad"}, "ABE:\nFade away."), "result",
     lambda r: r is True),
    ("judge unknown task", lambda: judge_reply({"task": "poetry", "response": "x"}, "x"), "error", ValueError,
     "example must have a 'task'"),
    ("judge no response", lambda: judge_reply({"task": "upper"}, "x"), "error", ValueError, "and a 'response'"),
    ("judge response None", lambda: judge_reply({"task": "upper", "response": None}, "x"), "error", ValueError,
     "and a 'response'"),
    ("judge reply None", lambda: judge_reply(EXAMPLE, None), "error", TypeError, "reply must be a str"),
    ("judge example list", lambda: judge_reply([EXAMPLE], "AB"), "error", TypeError, "example must be a dict"),
    ("judge pair", lambda: judge_reply(("Upper case:\nab", "AB"), "AB"), "error", TypeError,
     "example must be a dict"),
    # generate_replies, chat_reply, chat_state_dict, load_shakespeare_chat, chat_loop
    ("replies ok", lambda: generate_replies(chat_model(), CHAT, "ab", 3, 2, 1.0, torch.Generator().manual_seed(0)),
     "result", lambda r: r[0].shape == (3, 4) and r[1].shape[0] == 3 and r[1].shape[1] <= 2 and len(r[2]) == 3),
    ("replies n 0", lambda: generate_replies(chat_model(), CHAT, "ab", 0), "error", ValueError, "n must be >= 1"),
    ("replies n 2.0", lambda: generate_replies(chat_model(), CHAT, "ab", 2.0), "error", TypeError,
     "n must be an int"),
    ("replies n None", lambda: generate_replies(chat_model(), CHAT, "ab", None), "error", TypeError,
     "n must be an int"),
    ("reply ok", lambda: chat_reply(chat_model(), CHAT, "ab", 3), "result",
     lambda r: isinstance(r, str) and len(r) <= 3),
    ("reply default room", lambda: chat_reply(chat_model(), CHAT, "ab"), "result",
     lambda r: len(r) <= 32 - 4),  # the prompt <|user|>ab<|assistant|> takes 4 tokens of the 32
    ("reply base model", lambda: chat_reply(model(replace(CHAT_CFG, vocab_size=CHARS.vocab_size)), CHAT, "ab"),
     "error", ValueError, "the tokenizer has 62 tokens, the model 59: grow the model"),
    ("reply too long", lambda: chat_reply(chat_model(), CHAT, "a" * 40), "error", ValueError,
     "instruction takes 42 tokens"),
    ("reply fills context", lambda: chat_reply(chat_model(), CHAT, "a" * 30), "error", ValueError,
     "leave room for an answer"),
    ("reply new 0", lambda: chat_reply(chat_model(), CHAT, "ab", 0), "error", ValueError,
     "max_new_tokens must be >= 1"),
    ("reply new 2.5", lambda: chat_reply(chat_model(), CHAT, "ab", 2.5), "error", TypeError,
     "max_new_tokens must be an int"),
    ("reply temperature nan", lambda: chat_reply(chat_model(), CHAT, "ab", 3, temperature=math.nan), "error",
     ValueError, "temperature"),
    ("reply char tokenizer", lambda: chat_reply(chat_model(), CHARS, "ab"), "error", TypeError,
     "tokenizer must be a ChatTokenizer"),
    ("reply model linear", lambda: chat_reply(nn.Linear(2, 2), CHAT, "ab"), "error", TypeError,
     "model must be a GPTModel"),
    ("reply chat token", lambda: chat_reply(chat_model(), CHAT, "ab<|end|>"), "error", ValueError,
     "instruction contains the chat token"),
    ("reply instruction None", lambda: chat_reply(chat_model(), CHAT, None), "error", TypeError,
     "instruction must be a str"),
    ("chat state ok", lambda: chat_state_dict(chat_lora(), CHARS.vocab_size), "result",
     lambda s: s["out_head.new_rows"].shape == (3, 16) and s["embedding.tok_emb.new_rows"].shape == (3, 16)),
    ("chat state no LoRA", lambda: chat_state_dict(chat_model(), CHARS.vocab_size), "error", ValueError,
     "call apply_lora"),
    ("chat state first_new past", lambda: chat_state_dict(chat_lora(), CHAT.vocab_size), "error", ValueError,
     "first_new is 62, but the vocabulary has 62 tokens"),
    ("chat state first_new 0", lambda: chat_state_dict(chat_lora(), 0), "error", ValueError, "first_new must be >= 1"),
    ("chat state model linear", lambda: chat_state_dict(nn.Linear(2, 2), 1), "error", TypeError,
     "model must be a GPTModel"),
    ("shipped chat ok", lambda: load_shakespeare_chat("cpu"), "result",
     lambda r: r[0].cfg.vocab_size == r[1].vocab_size == 68 and not r[0].training),
    ("shipped chat device", lambda: load_shakespeare_chat("gpu"), "error", ValueError, "device must be None"),
    ("loop ok", lambda: chat_loop(chat_model(), CHAT, read=scripted("ab", " "), write=lambda line: None,
                                  max_new_tokens=2), "result", lambda r: len(r) == 1 and r[0][0] == "ab"),
    ("loop read str", lambda: chat_loop(chat_model(), CHAT, read="Hi"), "error", TypeError,
     "read and write must be callables"),
    ("loop write None", lambda: chat_loop(chat_model(), CHAT, read=lambda p: "", write=None), "error", TypeError,
     "read and write must be callables"),
    ("loop unknown setting", lambda: chat_loop(chat_model(), CHAT, read=lambda p: "ab", top_k=5), "error", TypeError,
     "chat_loop got 'top_k'"),
    # the names that left the lesson still import, with a warning
    ("moved check_reply", lambda: moved("check_reply"), "result",
     lambda r: r[0] is judge_reply and "judge_reply" in r[1][0]),
    ("moved check_lengths", lambda: moved("check_lengths"), "result",
     lambda r: r[0] is door.lengths and "course_lib.doors.finetuning.lengths" in r[1][0]),
    ("chat tokens", lambda: CHAT_TOKENS, "result", lambda t: t == ("<|user|>", "<|assistant|>", "<|end|>")),
]

test_door = door_tests(CASES)


if __name__ == "__main__":  # the counts of issue 41
    report(CASES)

"""Issue 30, notebook 12: every public door of course_lib.interpretability called the way a user who has not read
the code might call it. Each case is the call and what must come out: ("error", type, a fragment of our message
naming the argument) or ("result", check) for an input that legitimately works, the check proving the result right.
`outcome` sorts a run into clear / correct (passes) and unclear / silent (a deep error, or a wrong answer)."""

import warnings

import pytest
import torch
from torch import nn

from course_lib.config import GPTConfig
from course_lib.doors import interpretability as door
from course_lib.interpretability import (NoFeedForward, SecondOrderChain, attention_only, first_token_score,
                                         head_logit_attribution, hf_tokenizer_for, hook_points, hooked,
                                         induction_score, logit_lens, previous_token_score, register,
                                         repeated_passages, run_with_cache, run_with_patches, to_transformer_lens)
from course_lib.model import GPTModel
from course_lib.tokenization import CharTokenizer

from doors import door_tests, error, report, result

CFG = GPTConfig(vocab_size=13, context_length=16, emb_dim=12, n_heads=3, n_layers=2, drop_rate=0.0)
torch.manual_seed(0)
MODEL = GPTModel(CFG).eval()
IDS = torch.randint(0, CFG.vocab_size, (2, 6))
LOGITS, CACHE = run_with_cache(MODEL, IDS)
TARGETS = torch.randint(0, CFG.vocab_size, (2, 6))
CHAIN = SecondOrderChain(vocab_size=9, seed=1)


def pattern(tokens=6, heads=2, batch=1):
    """A causal pattern whose rows sum to 1: each query attends to itself."""
    return torch.eye(tokens).expand(batch, heads, tokens, tokens).clone()


def previous(tokens=6):
    p = torch.zeros(1, 2, tokens, tokens)
    p[0, :, 0, 0] = 1.0
    p[0, :, torch.arange(1, tokens), torch.arange(tokens - 1)] = 1.0
    return p


def induction(tokens=8, period=3):
    p = torch.zeros(1, 1, tokens, tokens)
    p[0, 0, :period, 0] = 1.0
    q = torch.arange(period, tokens)
    p[0, 0, q, q - period + 1] = 1.0
    return p


def bf16_model():
    return GPTModel(CFG).to(torch.bfloat16).eval()


def identity(name, x):
    return x


def hooked_run(names, edit):
    """A forward pass inside hooked(...): the hooks go when it ends, whatever happens."""
    with hooked(MODEL, names, edit):
        return MODEL(IDS)


def registered_run(where, edit):
    """register one hook on a model of its own, run it, take the hook off: MODEL never keeps it."""
    model = GPTModel(CFG).eval()
    handle = register(model.trf_blocks[0].att, where, "x", edit)
    try:
        return model(IDS)
    finally:
        handle.remove()


def pattern_hook_run(**pass_args):
    """Record block 0's attention pattern during a pass of MODEL with pass_args (a KV cache, or a padding mask on
    the block itself)."""
    recorded = {}
    with hooked(MODEL, ["blocks.0.attn.pattern"], lambda name, p: recorded.setdefault(name, p)):
        if "may_attend" in pass_args:
            x = MODEL.embedding(IDS)
            MODEL.trf_blocks[0](x, None, pass_args["may_attend"])
        else:
            MODEL(IDS, **pass_args)
    return recorded


def old_import(name):
    """A name that moved to the door, imported from its old place: it warns, and it is the door's function."""
    import course_lib.interpretability as lesson
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = getattr(lesson, name)
    return found, [str(w.message) for w in caught if w.category is DeprecationWarning]


def untouched_generator_after(call):
    """True when call(generator) is refused and the generator has drawn nothing."""
    generator = torch.Generator().manual_seed(5)
    state = generator.get_state()
    try:
        call(generator)
    except (TypeError, ValueError):
        return torch.equal(generator.get_state(), state)
    return False


CASES = {
    # hook points and hooks
    "hook_points count": (lambda: len(hook_points(MODEL)), result(lambda r: r == 2 + 7 * CFG.n_layers)),
    "hook_points of a Linear": (lambda: hook_points(nn.Linear(2, 2)), error(TypeError, "model")),
    "hook_points of None": (lambda: hook_points(None), error(TypeError, "model")),
    "register output": (lambda: registered_run("output", lambda name, x: 0 * x), result(lambda r: r.shape == (2, 6, 13))),
    "register typo in where": (lambda: registered_run("ouptut", identity), error(ValueError, "where")),
    "register edit not callable": (lambda: registered_run("output", None), error(TypeError, "edit")),
    "hooked identity": (lambda: hooked_run(["embed"], identity), result(lambda r: torch.equal(r, MODEL(IDS)))),
    "hooked names str": (lambda: hooked_run("embed", identity), error(TypeError, "names")),
    "hooked unknown name": (lambda: hooked_run(["emb"], identity), error(ValueError, "no hook point")),
    "hooked edit None": (lambda: hooked_run(["embed"], None), error(TypeError, "edit")),
    # run_with_cache
    "cache all": (lambda: run_with_cache(MODEL, IDS), result(lambda r: torch.equal(r[0], MODEL(IDS).detach())
                                                              and len(r[1]) == 2 + 7 * CFG.n_layers)),
    "cache names list": (lambda: list(run_with_cache(MODEL, IDS, ["embed"])[1]), result(lambda r: r == ["embed"])),
    "cache names tuple": (lambda: list(run_with_cache(MODEL, IDS, ("embed",))[1]), result(lambda r: r == ["embed"])),
    "cache names empty": (lambda: run_with_cache(MODEL, IDS, [])[1], result(lambda r: r == {})),
    "cache names str": (lambda: run_with_cache(MODEL, IDS, "embed"), error(TypeError, "names")),
    "cache names int": (lambda: run_with_cache(MODEL, IDS, 3), error(TypeError, "names")),
    "cache ids list": (lambda: run_with_cache(MODEL, [[1, 2]]), error(TypeError, "token_ids")),
    "cache ids 1-D": (lambda: run_with_cache(MODEL, IDS[0]), error(ValueError, "token_ids")),
    "cache ids float": (lambda: run_with_cache(MODEL, IDS.float()), error(TypeError, "token_ids")),
    "cache ids = vocab": (lambda: run_with_cache(MODEL, torch.tensor([[13]])), error(ValueError, "token_ids")),
    "cache model Linear": (lambda: run_with_cache(nn.Linear(2, 2), IDS), error(TypeError, "model")),
    # run_with_patches
    "patch identity": (lambda: run_with_patches(MODEL, IDS, {"blocks.0.attn.z": lambda z: z}),
                       result(lambda r: torch.allclose(r, LOGITS))),
    "patch empty": (lambda: run_with_patches(MODEL, IDS, {}), result(lambda r: torch.allclose(r, LOGITS))),
    "patch list of pairs": (lambda: run_with_patches(MODEL, IDS, [("embed", lambda x: x)]), error(TypeError, "patches")),
    "patch not callable": (lambda: run_with_patches(MODEL, IDS, {"embed": 0.0}), error(TypeError, "patches must be a dict")),
    "patch wrong shape": (lambda: run_with_patches(MODEL, IDS, {"embed": lambda x: x[0]}),
                          error(ValueError, "patches['embed']")),
    "patch wrong dtype": (lambda: run_with_patches(MODEL, IDS, {"embed": lambda x: x.double()}),
                          error(ValueError, "patches['embed']")),
    "patch pattern": (lambda: run_with_patches(MODEL, IDS, {"blocks.0.attn.pattern": lambda p: p}),
                      error(ValueError, "attn.pattern")),
    "patch unknown": (lambda: run_with_patches(MODEL, IDS, {"blocks.9.attn.z": lambda p: p}),
                      error(ValueError, "no hook point")),
    # the scores
    "previous by hand": (lambda: previous_token_score(previous()), result(lambda r: torch.equal(r, torch.ones(2)))),
    "previous of the model": (lambda: previous_token_score(CACHE["blocks.0.attn.pattern"]),
                              result(lambda r: r.shape == (3,) and (0 <= r).all() and (r <= 1).all())),
    "previous without batch": (lambda: previous_token_score(previous()[0]), error(ValueError, "pattern")),
    "previous list": (lambda: previous_token_score([[1.0]]), error(TypeError, "pattern")),
    "previous not square": (lambda: previous_token_score(torch.ones(1, 2, 3, 4) / 4), error(ValueError, "pattern")),
    "previous rows of 5": (lambda: previous_token_score(5 * previous()), error(ValueError, "pattern")),
    "previous NaN": (lambda: previous_token_score(previous() * float("nan")), error(ValueError, "pattern")),
    "first by hand": (lambda: first_token_score(induction(8, 3)), result(lambda r: torch.allclose(r, torch.tensor([2 / 7])))),
    "first without batch": (lambda: first_token_score(pattern()[0]), error(ValueError, "pattern")),
    "first int": (lambda: first_token_score(pattern().long()), error(TypeError, "pattern")),
    "induction by hand": (lambda: induction_score(induction(8, 3), 3), result(lambda r: torch.equal(r, torch.ones(1)))),
    "induction bfloat16": (lambda: induction_score(induction(8, 3).bfloat16(), 3),
                           result(lambda r: torch.equal(r.float(), torch.ones(1)))),
    "induction unnormalised": (lambda: induction_score(5 * induction(8, 3), 3), error(ValueError, "pattern")),
    "induction without batch": (lambda: induction_score(induction(8, 3)[0], 3), error(ValueError, "pattern")),
    "induction period float": (lambda: induction_score(induction(8, 3), 3.0), error(TypeError, "period")),
    "induction period True": (lambda: induction_score(induction(8, 3), True), error(TypeError, "period")),
    "induction period too long": (lambda: induction_score(induction(8, 3), 5), error(ValueError, "period")),
    # logit lens and attribution
    "lens shape": (lambda: logit_lens(MODEL, CACHE, TARGETS),
                   result(lambda r: r[0].shape == r[1].shape == (3, 2, 6) and torch.allclose(
                       r[0][-1], LOGITS.softmax(-1).gather(-1, TARGETS[..., None])[..., 0]))),
    "lens target = vocab": (lambda: logit_lens(MODEL, CACHE, torch.full((2, 6), 13)), error(ValueError, "target_ids")),
    "lens target -1": (lambda: logit_lens(MODEL, CACHE, torch.full((2, 6), -1)), error(ValueError, "target_ids")),
    "lens target float": (lambda: logit_lens(MODEL, CACHE, TARGETS.float()), error(TypeError, "target_ids")),
    "lens target 1-D": (lambda: logit_lens(MODEL, CACHE, TARGETS[0]), error(ValueError, "target_ids")),
    "lens target of one row": (lambda: logit_lens(MODEL, CACHE, TARGETS[:1]), error(ValueError, "target_ids")),
    "lens missing activation": (lambda: logit_lens(MODEL, {"embed": CACHE["embed"]}, TARGETS),
                                error(KeyError, "blocks.0.resid_post")),
    "lens model Linear": (lambda: logit_lens(nn.Linear(2, 2), CACHE, TARGETS), error(TypeError, "model")),
    "attribution shape": (lambda: head_logit_attribution(MODEL, CACHE, TARGETS),
                          result(lambda r: r.shape == (2, 3, 2, 6) and torch.isfinite(r).all())),
    "attribution target = vocab": (lambda: head_logit_attribution(MODEL, CACHE, torch.full((2, 6), 13)),
                                   error(ValueError, "target_ids")),
    "attribution target -1": (lambda: head_logit_attribution(MODEL, CACHE, torch.full((2, 6), -1)),
                              error(ValueError, "target_ids")),
    "attribution target of one row": (lambda: head_logit_attribution(MODEL, CACHE, TARGETS[:1]),
                                      error(ValueError, "target_ids")),
    "attribution target list": (lambda: head_logit_attribution(MODEL, CACHE, [[1]]), error(TypeError, "target_ids")),
    "attribution missing z": (lambda: head_logit_attribution(MODEL, {"blocks.1.resid_post": CACHE["blocks.1.resid_post"]},
                                                             TARGETS), error(KeyError, "blocks.0.attn.z")),
    # attention-only models, the chain, the passages
    "NoFeedForward": (lambda: NoFeedForward()(torch.ones(2, 3)), result(lambda r: torch.equal(r, torch.zeros(2, 3)))),
    "attention_only": (lambda: attention_only(GPTModel(CFG)), result(lambda r: all(
        isinstance(b.ff, NoFeedForward) for b in r.trf_blocks))),
    "attention_only Linear": (lambda: attention_only(nn.Linear(2, 2)), error(TypeError, "model")),
    "chain strength inf": (lambda: SecondOrderChain(5, strength=float("inf")), error(ValueError, "strength")),
    "chain seed float": (lambda: SecondOrderChain(5, seed=1.5), error(TypeError, "seed")),
    "chain vocab bool": (lambda: SecondOrderChain(True), error(TypeError, "vocab_size")),
    "sample by hand": (lambda: CHAIN.sample(3, 5, torch.Generator().manual_seed(0)),
                       result(lambda r: r.shape == (3, 5) and 0 <= r.min() and r.max() < 9)),
    "sample n float": (lambda: CHAIN.sample(2.0, 5, torch.Generator()), error(TypeError, "n must be an int")),
    "sample n -1": (lambda: CHAIN.sample(-1, 5, torch.Generator()), error(ValueError, "n must be")),
    "sample length float": (lambda: CHAIN.sample(2, 5.0, torch.Generator()), error(TypeError, "length")),
    "passages by hand": (lambda: repeated_passages(CHAIN, 2, 12, range(3, 4), torch.Generator().manual_seed(0)),
                         result(lambda r: r.shape == (2, 12) and torch.equal(r[:, 3:], r[:, :-3]))),
    "passages set": (lambda: repeated_passages(CHAIN, 2, 12, {3, 4}, torch.Generator()), error(TypeError, "periods")),
    "passages float periods": (lambda: repeated_passages(CHAIN, 2, 12, [3.5], torch.Generator()),
                               error(TypeError, "periods")),
    "passages context float": (lambda: repeated_passages(CHAIN, 2, 12.0, range(3, 4), torch.Generator()),
                               error(TypeError, "context_length")),
    "passages chain None": (lambda: repeated_passages(None, 2, 12, range(3, 4), torch.Generator()),
                            error(TypeError, "chain")),
    # the pattern hook records a plain pass only (its door: door.plain_pass)
    "pattern hook plain pass": (lambda: pattern_hook_run(),
                                result(lambda r: r["blocks.0.attn.pattern"].shape == (2, 3, 6, 6))),
    "pattern hook KV cache": (lambda: pattern_hook_run(kv_caches=MODEL.new_kv_caches()),
                              error(ValueError, "KV cache or a padding mask")),
    "pattern hook padding mask": (lambda: pattern_hook_run(may_attend=torch.ones(2, 1, 6, 6, dtype=torch.bool)),
                                  error(ValueError, "KV cache or a padding mask")),
    "patch returns list": (lambda: run_with_patches(MODEL, IDS, {"embed": lambda x: x.tolist()}),
                           error(ValueError, "patches['embed'] returned")),
    "patch returns None": (lambda: run_with_patches(MODEL, IDS, {"blocks.1.attn.z": lambda z: None}),
                           error(ValueError, "patches['blocks.1.attn.z'] returned")),
    "patch z by hand": (lambda: run_with_patches(MODEL, IDS, {"blocks.1.attn.z": torch.zeros_like}),
                        result(lambda r: r.shape == LOGITS.shape and not torch.allclose(r, LOGITS))),
    "hooked generator of names": (lambda: hooked_run((n for n in ["embed"]), identity),
                                  result(lambda r: torch.equal(r, MODEL(IDS)))),
    "sample generator int": (lambda: CHAIN.sample(2, 5, 0), error(TypeError, "generator")),
    "passages generator None": (lambda: repeated_passages(CHAIN, 2, 12, range(3, 4), None),
                                error(TypeError, "generator")),
    "passages n -1": (lambda: repeated_passages(CHAIN, -1, 12, range(3, 4), torch.Generator()),
                      error(ValueError, "n must be")),
    "passages refused, generator untouched": (lambda: untouched_generator_after(
        lambda g: repeated_passages(CHAIN, -1, 12, range(3, 4), g)), result(lambda r: r is True)),
    # the doors themselves, and the names that moved to them
    "door.pattern list": (lambda: door.pattern([[1.0]]), error(TypeError, "pattern")),
    "door.pattern ok": (lambda: door.pattern(previous()), result(lambda r: r is None)),
    "door.lens_targets wrong shape": (lambda: door.lens_targets(MODEL, CACHE["embed"], TARGETS[:, :3]),
                                      error(ValueError, "one id per cached position")),
    "check_pattern old import": (lambda: old_import("check_pattern"),
                                 result(lambda r: r[0] is door.pattern and "course_lib.doors.interpretability.pattern"
                                        in r[1][0])),
    "check_lens_targets old import": (lambda: old_import("check_lens_targets"),
                                      result(lambda r: r[0] is door.lens_targets and r[1])),
    "unknown old name": (lambda: old_import("check_nothing"), error(AttributeError, "check_nothing")),
    # the bridge's doors (their results are proved in tests/test_interpretability.py)
    "hf_tokenizer_for str": (lambda: hf_tokenizer_for("abc"), error(TypeError, "tokenizer")),
    "hf_tokenizer_for ids": (lambda: hf_tokenizer_for(CharTokenizer("ab")).encode("ba"), result(lambda r: r == [1, 0])),
    "bridge model Linear": (lambda: to_transformer_lens(nn.Linear(2, 2)), error(TypeError, "model")),
    "bridge tokenizer of another vocabulary": (lambda: to_transformer_lens(MODEL, CharTokenizer("ab")),
                                               error(ValueError, "tokenizer")),
}


def test_a_refused_call_leaves_no_hook_behind():
    for call in (lambda: run_with_cache(MODEL, IDS, "embed"), lambda: run_with_patches(MODEL, IDS, {"embed": 0.0}),
                 lambda: run_with_patches(MODEL, IDS, {"embed": lambda x: x.double()}),
                 lambda: hooked_run(["embed"], None), lambda: pattern_hook_run(kv_caches=MODEL.new_kv_caches())):
        with pytest.raises((TypeError, ValueError)):
            call()
        assert all(not m._forward_hooks and not m._forward_pre_hooks for m in MODEL.modules())


test_door = door_tests(CASES)


if __name__ == "__main__":  # the counts of issue 30's closing note
    report(CASES)

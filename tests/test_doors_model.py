"""Issue 30: the doors of course_lib.model (GPTModel(cfg), its forward with token ids, kv_caches and last_only,
init_gpt2_weights, trace_shapes), called as a user who has not read the code would call them. Each case is a call
and its expected outcome: ("error", type, a fragment of the message that names the argument) or ("result", check);
("error", type, fragment, "pytorch") is PyTorch's own error, which names no argument of ours.
`python tests/test_doors_model.py` counts the outcomes as clear / correct / unclear / silent."""


import torch
from torch import nn

from course_lib.attention import KVCache
from course_lib.config import GPTConfig
from course_lib.doors.model import forward_args
from course_lib.generation import StaticKVCache
from course_lib.model import GPTModel, init_gpt2_weights, trace_shapes

from doors import door_tests, report

CFG = GPTConfig(vocab_size=50, context_length=8, emb_dim=8, n_heads=2, n_layers=2, drop_rate=0.0)
torch.manual_seed(0)
MODEL = GPTModel(CFG).eval()
IDS = torch.tensor([[1, 2, 3]])
FULL = MODEL(IDS).detach()  # (1, 3, 50)


def logits_like(expected):
    return lambda out: out.shape == expected.shape and torch.allclose(out, expected, atol=1e-6)


def cached_then(first, then, caches=None):
    """Run `first` through fresh caches (or `caches`), then `then`; the second call's result."""
    caches = MODEL.new_kv_caches() if caches is None else caches
    MODEL(first, kv_caches=caches)
    return lambda: MODEL(then, kv_caches=caches)


def refused_leaves_caches(first, then, caches):
    """After a refused call the caches hold what they held before it."""
    MODEL(first, kv_caches=caches)
    before = [len(cache) for cache in caches]
    try:
        MODEL(then, kv_caches=caches)
    except ValueError:
        return [len(cache) for cache in caches] == before
    return False


def no_hooks_after_failure():
    try:
        trace_shapes(MODEL, torch.tensor([[60]]))
    except ValueError:
        return all(not m._forward_hooks and not m._forward_pre_hooks for m in MODEL.modules())
    return False


def gpt2_statistics(model):
    init_gpt2_weights(model)
    return (abs(model.embedding.tok_emb.weight.std().item() - 0.02) < 0.003
            and abs(model.trf_blocks[0].ff.fc.weight.std().item() - 0.02) < 0.003
            and model.trf_blocks[0].ff.proj.weight.std().item() < 0.015 and model.final_norm.scale.eq(1).all().item())


CASES = [
    # GPTModel(cfg)
    ("model dict", lambda: GPTModel(dict(vocab_size=50)), ("error", TypeError, "cfg must be a GPTConfig, got dict")),
    ("model None", lambda: GPTModel(None), ("error", TypeError, "cfg must be a GPTConfig, got NoneType")),
    ("model class", lambda: GPTModel(GPTConfig), ("error", TypeError, "cfg must be a GPTConfig, got type")),
    ("model tied", lambda: GPTModel(CFG), ("result", lambda m: m.out_head.weight is m.embedding.tok_emb.weight)),
    # forward: the token ids
    ("ids ok", lambda: MODEL(IDS), ("result", lambda out: out.shape == (1, 3, 50))),
    ("ids int32", lambda: MODEL(IDS.int()), ("result", logits_like(FULL))),
    ("ids batch of 2", lambda: MODEL(IDS.repeat(2, 1))[1], ("result", logits_like(FULL[0]))),
    ("ids list", lambda: MODEL([[1, 2, 3]]), ("error", TypeError, "token_ids must be a torch.Tensor")),
    ("ids 1-D", lambda: MODEL(IDS[0]), ("error", ValueError, "token_ids must be 2-D (batch, tokens)")),
    ("ids 3-D", lambda: MODEL(IDS[None]), ("error", ValueError, "token_ids must be 2-D (batch, tokens)")),
    ("ids 0-D", lambda: MODEL(torch.tensor(3)), ("error", ValueError, "token_ids must be 2-D")),
    ("ids empty", lambda: MODEL(torch.zeros(1, 0, dtype=torch.long)), ("error", ValueError, "token_ids is empty")),
    ("ids empty list tensor", lambda: MODEL(torch.tensor([[]])), ("error", ValueError, "token_ids is empty")),
    ("ids float", lambda: MODEL(IDS.float()), ("error", TypeError, "token_ids must hold integer token ids")),
    ("ids bool", lambda: MODEL(IDS > 1), ("error", TypeError, "token_ids must hold integer token ids")),
    ("ids bfloat16", lambda: MODEL(IDS.bfloat16()), ("error", TypeError, "token_ids must hold integer token ids")),
    ("ids int16", lambda: MODEL(IDS.short()), ("error", TypeError, "token_ids must hold integer token ids, got dtype torch.int16")),
    ("ids uint8", lambda: MODEL(IDS.to(torch.uint8)), ("error", TypeError, "token_ids must hold integer token ids, got dtype torch.uint8")),
    ("ids negative", lambda: MODEL(torch.tensor([[1, -1]])), ("error", ValueError, "token_ids holds token id -1 < 0")),
    ("ids = vocab_size", lambda: MODEL(torch.tensor([[50]])), ("error", ValueError, "holds token id 50 >= vocab_size 50")),
    ("ids GPT-2 EOS", lambda: MODEL(torch.tensor([[50256]])), ("error", ValueError, ">= vocab_size 50")),
    ("ids too long", lambda: MODEL(torch.zeros(1, 9, dtype=torch.long)), ("error", ValueError, "token_ids has 9 tokens")),
    ("ids full context", lambda: MODEL(torch.zeros(1, 8, dtype=torch.long)).shape, ("result", lambda s: s == (1, 8, 50))),
    ("ids meta", lambda: MODEL(IDS.to("meta")), ("error", ValueError, "token_ids is on meta but the model is on cpu")),
    # forward: last_only
    ("last_only True", lambda: MODEL(IDS, last_only=True), ("result", logits_like(FULL[:, -1:]))),
    ("last_only False", lambda: MODEL(IDS, last_only=False), ("result", logits_like(FULL))),
    ("last_only 'no'", lambda: MODEL(IDS, last_only="no"), ("error", TypeError, "last_only must be True or False")),
    ("check last_only 'no'", lambda: forward_args(MODEL, IDS, None, "no"),
     ("error", TypeError, "last_only must be True or False")),
    ("check last_only None", lambda: forward_args(MODEL, IDS, None, None),
     ("error", TypeError, "last_only must be True or False")),
    ("check ok", lambda: forward_args(MODEL, IDS, MODEL.new_kv_caches(), True), ("result", lambda s: s == 0)),
    # forward: kv_caches
    ("caches ok", lambda: MODEL(IDS, kv_caches=MODEL.new_kv_caches()), ("result", logits_like(FULL))),
    ("caches tuple", lambda: MODEL(IDS, kv_caches=tuple(MODEL.new_kv_caches())), ("result", logits_like(FULL))),
    ("caches static", lambda: MODEL(IDS, kv_caches=[StaticKVCache(8), StaticKVCache(8)]), ("result", logits_like(FULL))),
    ("caches continue", cached_then(IDS[:, :2], IDS[:, 2:]), ("result", logits_like(FULL[:, 2:]))),
    ("caches one too few", lambda: MODEL(IDS, kv_caches=[KVCache()]), ("error", ValueError, "one cache per block (2)")),
    ("caches empty list", lambda: MODEL(IDS, kv_caches=[]), ("error", ValueError, "one cache per block (2)")),
    ("caches of None", lambda: MODEL(IDS, kv_caches=[None, None]), ("error", ValueError, "one cache per block (2)")),
    ("caches str", lambda: MODEL(IDS, kv_caches="ab"), ("error", ValueError, "kv_caches must be model.new_kv_caches()")),
    ("caches int", lambda: MODEL(IDS, kv_caches=3), ("error", ValueError, "kv_caches must be model.new_kv_caches()")),
    ("caches dict", lambda: MODEL(IDS, kv_caches={}), ("error", ValueError, "kv_caches must be model.new_kv_caches()")),
    ("caches mixed lengths", lambda: (lambda c: (c[0].append(*[torch.zeros(1, 2, 1, 4)] * 2), MODEL(IDS, kv_caches=c)))(
        MODEL.new_kv_caches()), ("error", ValueError, "all holding the same positions")),
    ("caches full", cached_then(torch.zeros(1, 8, dtype=torch.long), IDS[:, :1]),
     ("error", ValueError, "more than the 0 positions left")),
    ("caches untouched when full", lambda: refused_leaves_caches(torch.zeros(1, 6, dtype=torch.long), IDS,
                                                                  MODEL.new_kv_caches()), ("result", bool)),
    ("static batch 2 then 1", cached_then(IDS.repeat(2, 1), IDS[:, :1], [StaticKVCache(8), StaticKVCache(8)]),
     ("error", ValueError, "rows")),
    ("static batch 1 then 2", cached_then(IDS, IDS.repeat(2, 1)[:, :1], [StaticKVCache(8), StaticKVCache(8)]),
     ("error", ValueError, "rows")),
    ("caches batch 2 then 1", cached_then(IDS.repeat(2, 1), IDS[:, :1]), ("error", ValueError, "rows")),
    ("check caches batch", lambda: (lambda c: (MODEL(IDS.repeat(2, 1), kv_caches=c), forward_args(
        MODEL, IDS, c, False)))(MODEL.new_kv_caches()), ("error", ValueError, "rows")),
    # init_gpt2_weights
    ("init ok", lambda: gpt2_statistics(GPTModel(CFG)), ("result", bool)),
    ("init None", lambda: init_gpt2_weights(None), ("error", TypeError, "model must be a GPTModel")),
    ("init Linear", lambda: init_gpt2_weights(nn.Linear(2, 2)), ("error", TypeError, "model must be a GPTModel")),
    ("init config", lambda: init_gpt2_weights(CFG), ("error", TypeError, "model must be a GPTModel")),
    # trace_shapes
    ("trace all", lambda: trace_shapes(MODEL, IDS), ("result", lambda t: t[0] == ("embedding", (1, 3, 8))
                                                      and t[-1] == ("out_head", (1, 3, 50)))),
    ("trace depth 1", lambda: [name for name, _ in trace_shapes(MODEL, IDS, max_depth=1)],
     ("result", lambda names: names == ["embedding", "final_norm", "out_head"])),  # a ModuleList is never called
    ("trace depth 0", lambda: trace_shapes(MODEL, IDS, max_depth=0), ("error", ValueError, "max_depth must be >= 1")),
    ("trace depth -1", lambda: trace_shapes(MODEL, IDS, max_depth=-1), ("error", ValueError, "max_depth must be >= 1")),
    ("trace depth 1.5", lambda: trace_shapes(MODEL, IDS, max_depth=1.5), ("error", TypeError, "max_depth must be an int")),
    ("trace depth True", lambda: trace_shapes(MODEL, IDS, max_depth=True), ("error", TypeError, "max_depth must be an int")),
    ("trace depth '1'", lambda: trace_shapes(MODEL, IDS, max_depth="1"), ("error", TypeError, "max_depth must be an int")),
    ("trace list ids", lambda: trace_shapes(MODEL, [[1, 2]]), ("error", TypeError, "token_ids must be a torch.Tensor")),
    ("trace not a module", lambda: trace_shapes("gpt2", IDS), ("error", TypeError, "model must be a Module")),
    ("trace a function", lambda: trace_shapes(lambda ids: ids, IDS), ("error", TypeError, "model must be a Module")),
    ("trace removes hooks", no_hooks_after_failure, ("result", bool)),
    ("trace any module", lambda: trace_shapes(nn.Sequential(nn.Linear(2, 3)), torch.ones(1, 2)),
     ("result", lambda t: t == [("0", (1, 3))])),
]


test_door = door_tests(CASES)


if __name__ == "__main__":  # the counts of issue 30's closing note
    report(CASES)

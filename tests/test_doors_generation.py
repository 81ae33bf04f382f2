"""Issue 30: the doors of course_lib.generation (generate, decoding_loop, generate_text_simple, sample_next_token, scale_logits,
top_k_filter, top_p_filter, StaticKVCache, next_token_logits, eval_mode, and the doors in course_lib/doors/generation.py
that other lessons call: generation_args, sampling, cache_list), called as a user who has not read the code would
call them. Each case is a call and its expected outcome: ("error", type, a fragment of the message that names the argument) or ("result", check);
("error", type, fragment, "pytorch") is PyTorch's own error, which names no argument of ours.
`python tests/test_doors_generation.py` counts the outcomes as clear / correct / unclear / silent."""

import math

import torch
from torch import nn

from course_lib.attention import KVCache
from course_lib.config import GPTConfig
from course_lib.doors import generation as door
from course_lib.generation import (StaticKVCache, decoding_loop, eval_mode, generate, generate_text_simple,
                                   next_token_logits, sample_next_token, scale_logits, top_k_filter, top_p_filter)
from course_lib.model import GPTModel

from doors import door_tests, report

CFG = GPTConfig(vocab_size=50, context_length=8, emb_dim=8, n_heads=2, n_layers=2, drop_rate=0.0)
torch.manual_seed(0)
MODEL = GPTModel(CFG).eval()
IDS = torch.tensor([[1, 2, 3]])
GREEDY = generate(MODEL, IDS, 2)  # (1, 5)
L = torch.tensor([[1.0, 3.0, 2.0]])  # next-token logits of one row: token 1 is the most likely


def GREEDY_CHOICE(logits, token_ids):  # decoding_loop's choose: the argmax
    return sample_next_token(logits)


def equals(expected):
    return lambda result: torch.equal(result, expected) if isinstance(expected, torch.Tensor) else result == expected


def shape(*expected):
    return lambda result: tuple(result.shape) == expected


def mode_restored():
    model = GPTModel(CFG).train()
    model.final_norm.eval()
    with eval_mode(model):
        inside = not any(m.training for m in model.modules())
    return inside and model.training and not model.final_norm.training


def mode_restored_after_error():
    model = GPTModel(CFG).train()
    try:
        generate(model, torch.tensor([[60]]), 2)
    except ValueError:
        return model.training
    return False


def ntl_refills():
    caches = MODEL.new_kv_caches()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9]])
    first = next_token_logits(MODEL, ids[:, :8], caches, 8)  # a full window: fills the caches
    again = next_token_logits(MODEL, ids, caches, 8)  # full: refilled from the last 8 tokens
    return torch.allclose(first, MODEL(ids[:, :8])[:, -1]) and torch.allclose(again, MODEL(ids[:, 1:])[:, -1], atol=1e-6)


def refused_static_writes_nothing():
    caches = [StaticKVCache(3), StaticKVCache(2)]  # the second has no room for 3 positions
    try:
        MODEL(IDS, kv_caches=caches)
    except ValueError:
        return [len(cache) for cache in caches] == [0, 0] and caches[0].key_store is None
    return False


def cropped_then_another_batch():
    caches = MODEL.new_kv_caches()
    MODEL(IDS.repeat(2, 1), kv_caches=caches)
    for cache in caches:
        cache.crop(0)
    return MODEL(IDS, kv_caches=caches)  # 2 rows cached (none of them positions), 1 row fed


def half_scaled(logits, temperature):
    out = scale_logits(logits, temperature)
    finite = bool(torch.isfinite(out).all())
    return out.dtype == torch.float32 and finite and torch.equal(out, logits.float() / temperature)


CASES = [
    # generate_text_simple and its door, generation_args
    ("simple ok", lambda: generate_text_simple(MODEL, IDS, 2, None), ("result", equals(GREEDY))),
    ("simple cropped", lambda: generate_text_simple(MODEL, IDS, 7, 8), ("result", shape(1, 10))),
    ("simple int32", lambda: generate_text_simple(MODEL, IDS.int(), 2, None), ("result", equals(GREEDY.int()))),
    ("simple 0 new", lambda: generate_text_simple(MODEL, IDS, 0, None), ("result", equals(IDS))),
    ("simple list", lambda: generate_text_simple(MODEL, [[1, 2]], 2, None), ("error", TypeError, "token_ids must be a torch.Tensor")),
    ("simple 1-D", lambda: generate_text_simple(MODEL, IDS[0], 2, None), ("error", ValueError, "token_ids must be 2-D")),
    ("simple float ids", lambda: generate_text_simple(MODEL, IDS.float(), 2, None), ("error", TypeError, "token_ids must hold integer")),
    ("simple int16", lambda: generate_text_simple(MODEL, IDS.short(), 2, None), ("error", TypeError, "token_ids must hold integer token ids, got dtype torch.int16")),
    ("simple id too big", lambda: generate_text_simple(MODEL, torch.tensor([[50]]), 2, None), ("error", ValueError, ">= vocab_size 50")),
    ("simple meta ids", lambda: generate_text_simple(MODEL, IDS.to("meta"), 2, None), ("error", ValueError, "token_ids is on meta")),
    ("simple max -1", lambda: generate_text_simple(MODEL, IDS, -1, None), ("error", ValueError, "max_new_tokens must be >= 0")),
    ("simple max 2.0", lambda: generate_text_simple(MODEL, IDS, 2.0, None), ("error", TypeError, "max_new_tokens must be an int")),
    ("simple max True", lambda: generate_text_simple(MODEL, IDS, True, None), ("error", TypeError, "max_new_tokens must be an int")),
    ("simple too long", lambda: generate_text_simple(MODEL, IDS, 6, None), ("error", ValueError, "more than the model's context_length 8")),
    ("simple context 0", lambda: generate_text_simple(MODEL, IDS, 2, 0), ("error", ValueError, "context_length must be >= 1")),
    ("simple context 9", lambda: generate_text_simple(MODEL, IDS, 2, 9), ("error", ValueError, "context_length must be in [1, 8]")),
    ("simple context 2.0", lambda: generate_text_simple(MODEL, IDS, 2, 2.0), ("error", TypeError, "context_length must be an int")),
    ("simple not a GPT", lambda: generate_text_simple(nn.Linear(2, 2), IDS, 2, None), ("error", TypeError, "model.cfg must be a GPTConfig")),
    ("generation_args ok", lambda: door.generation_args(MODEL, IDS, 2, None), ("result", equals(8))),
    ("check eos -1", lambda: door.generation_args(MODEL, IDS, 2, None, -1), ("error", ValueError, "eos_id must be >= 0")),
    ("check eos 50", lambda: door.generation_args(MODEL, IDS, 2, None, 50), ("error", ValueError, "eos_id must be in [0, 49]")),
    # generate
    ("generate sampled", lambda: generate(MODEL, IDS, 3, temperature=1.0, top_k=5, top_p=0.9,
                                          generator=torch.Generator().manual_seed(1)), ("result", shape(1, 6))),
    ("generate no cache", lambda: generate(MODEL, IDS, 2, use_cache=False), ("result", equals(GREEDY))),
    ("generate batch", lambda: generate(MODEL, IDS.repeat(2, 1), 2)[1], ("result", equals(GREEDY[0]))),
    # use_cache only changes the cost, never the tokens: a truthy or falsy non-bool gives the right answer
    ("generate use_cache 'no'", lambda: generate(MODEL, IDS, 2, use_cache="no"), ("result", equals(GREEDY))),
    ("generate use_cache None", lambda: generate(MODEL, IDS, 2, use_cache=None), ("result", equals(GREEDY))),
    ("generate temperature -1", lambda: generate(MODEL, IDS, 2, temperature=-1), ("error", ValueError, "temperature must be in [0, inf)")),
    ("generate temperature nan", lambda: generate(MODEL, IDS, 2, temperature=math.nan), ("error", ValueError, "temperature must be in")),
    ("generate temperature str", lambda: generate(MODEL, IDS, 2, temperature="1"), ("error", TypeError, "temperature must be a number")),
    ("generate top_k 0", lambda: generate(MODEL, IDS, 2, temperature=1.0, top_k=0), ("error", ValueError, "top_k must be >= 1")),
    ("generate top_k 2.0", lambda: generate(MODEL, IDS, 2, temperature=1.0, top_k=2.0), ("error", TypeError, "top_k must be an int")),
    ("generate top_p 0", lambda: generate(MODEL, IDS, 2, temperature=1.0, top_p=0), ("error", ValueError, "top_p must be in (0, 1]")),
    ("generate top_p 1.5", lambda: generate(MODEL, IDS, 2, temperature=1.0, top_p=1.5), ("error", ValueError, "top_p must be in (0, 1]")),
    ("generate eos True", lambda: generate(MODEL, IDS, 2, eos_id=True), ("error", TypeError, "eos_id must be an int")),
    ("generate generator int", lambda: generate(MODEL, IDS, 2, temperature=1.0, generator=5), ("error", TypeError, "'generator' must be torch.Generator")),
    ("generate modes restored", mode_restored_after_error, ("result", bool)),
    # sample_next_token
    ("sample greedy", lambda: sample_next_token(L), ("result", equals(torch.tensor([[1]])))),
    ("sample top_k 1", lambda: sample_next_token(L, 1.0, top_k=1), ("result", equals(torch.tensor([[1]])))),
    ("sample bfloat16", lambda: sample_next_token(L.bfloat16(), 1.0, top_p=0.01), ("result", equals(torch.tensor([[1]])))),
    ("sample empty batch", lambda: sample_next_token(torch.zeros(0, 3)), ("result", shape(0, 1))),
    ("sample 1-D row", lambda: sample_next_token(L[0]), ("error", ValueError, "logits must be 2-D (batch, vocab_size)")),
    ("sample 1-D row hot", lambda: sample_next_token(L[0], 1.0), ("error", ValueError, "logits must be 2-D (batch, vocab_size)")),
    ("sample model output", lambda: sample_next_token(torch.zeros(1, 2, 3)), ("error", ValueError, "logits must be 2-D")),
    ("sample model output hot", lambda: sample_next_token(torch.zeros(1, 2, 3), 1.0), ("error", ValueError, "logits must be 2-D")),
    ("sample token ids", lambda: sample_next_token(torch.tensor([[1, 3, 2]])), ("error", TypeError, "logits must be a floating-point tensor")),
    ("sample list", lambda: sample_next_token([[1.0, 2.0]]), ("error", TypeError, "logits must be a floating-point tensor")),
    ("sample empty vocab", lambda: sample_next_token(torch.zeros(1, 0)), ("error", ValueError, "logits must be")),
    ("sample nan", lambda: sample_next_token(torch.tensor([[math.nan, 1.0]])), ("error", ValueError, "logits hold NaN")),
    ("sample all -inf", lambda: sample_next_token(torch.full((1, 3), -math.inf)), ("error", ValueError, "all -inf")),
    ("sample all -inf hot", lambda: sample_next_token(torch.full((1, 3), -math.inf), 1.0), ("error", ValueError, "all -inf")),
    ("sample generator int", lambda: sample_next_token(L, 1.0, generator=5), ("error", TypeError, "'generator' must be torch.Generator")),
    # scale_logits, top_k_filter, top_p_filter
    ("scale ok", lambda: scale_logits(L, 2.0), ("result", equals(L / 2))),
    ("scale 0", lambda: scale_logits(L, 0), ("error", ValueError, "temperature must be in (0, inf)")),
    # issue 41: a temperature the division overflows at is refused by the logits' dtype; half precision is divided in
    # float32, so 1e-5 (which overflowed float16: 3 / 1e-5 > 65,504) now gives finite float32 logits
    ("scale 1e-45 float32", lambda: scale_logits(L, 1e-45), ("error", ValueError, "temperature must be at least 1.19e-07 for torch.float32 logits, got 1e-45")),
    ("scale 1e-5 float16", lambda: half_scaled(L.half(), 1e-5), ("result", bool)),
    ("scale 1e-5 bfloat16", lambda: half_scaled(L.bfloat16(), 1e-5), ("result", bool)),
    ("scale 1e-8 float16", lambda: scale_logits(L.half(), 1e-8), ("error", ValueError, "temperature must be at least 1.19e-07 for torch.float16 logits")),
    ("scale 1e-10 float64", lambda: scale_logits(L.double(), 1e-10), ("result", lambda r: r.dtype == torch.float64 and bool(torch.isfinite(r).all()))),
    ("scale huge logit", lambda: scale_logits(torch.tensor([[1e35, 0.0]]), 1e-4), ("error", ValueError, "logits / temperature 0.0001 overflows")),
    ("scale -inf kept", lambda: scale_logits(torch.tensor([[-math.inf, 1.0]]), 1e-6), ("result", lambda r: r[0, 0] == -math.inf and r[0, 1] == 1e6)),
    ("sample 1e-45", lambda: sample_next_token(L, 1e-45), ("error", ValueError, "temperature must be at least")),
    ("sample float16 1e-5", lambda: sample_next_token(L.half(), 1e-5, generator=torch.Generator().manual_seed(0)), ("result", equals(torch.tensor([[1]])))),
    ("generate temperature 1e-45", lambda: generate(MODEL, IDS, 2, temperature=1e-45), ("error", ValueError, "temperature must be at least")),
    ("scale list", lambda: scale_logits([1.0, 2.0], 2.0), ("error", TypeError, "logits must be a floating-point tensor")),
    ("scale ids", lambda: scale_logits(torch.tensor([1, 2]), 2.0), ("error", TypeError, "logits must be a floating-point tensor")),
    ("top_k ok", lambda: top_k_filter(L, 2), ("result", equals(torch.tensor([[-math.inf, 3.0, 2.0]])))),
    ("top_k > vocab", lambda: top_k_filter(L, 10), ("result", equals(L))),
    ("top_k 0", lambda: top_k_filter(L, 0), ("error", ValueError, "top_k must be >= 1")),
    ("top_k ids", lambda: top_k_filter(torch.tensor([1, 2, 3]), 1), ("error", TypeError, "logits must be a floating-point tensor")),
    ("top_k 0-D", lambda: top_k_filter(torch.tensor(1.0), 1), ("error", ValueError, "logits must be")),
    ("top_k list", lambda: top_k_filter([1.0, 2.0], 1), ("error", TypeError, "logits must be a floating-point tensor")),
    ("top_p ok", lambda: top_p_filter(torch.log(torch.tensor([0.5, 0.3, 0.2])), 0.7),
     ("result", lambda r: r.isinf().tolist() == [False, False, True])),
    ("top_p 1", lambda: top_p_filter(L, 1), ("result", equals(L))),
    ("top_p nan", lambda: top_p_filter(L, math.nan), ("error", ValueError, "top_p must be in (0, 1]")),
    ("top_p ids", lambda: top_p_filter(torch.tensor([1, 2, 3]), 0.5), ("error", TypeError, "logits must be a floating-point tensor")),
    ("top_p 0-D", lambda: top_p_filter(torch.tensor(1.0), 0.5), ("error", ValueError, "logits must be")),
    ("top_p list", lambda: top_p_filter([1.0, 2.0], 0.5), ("error", TypeError, "logits must be a floating-point tensor")),
    # StaticKVCache
    ("static ok", lambda: MODEL(IDS, kv_caches=[StaticKVCache(3), StaticKVCache(3)]), ("result", lambda r: torch.allclose(r, MODEL(IDS)))),
    ("static capacity 0", lambda: StaticKVCache(0), ("error", ValueError, "capacity must be >= 1")),
    ("static capacity 2.5", lambda: StaticKVCache(2.5), ("error", TypeError, "capacity must be an int")),
    ("static capacity None", lambda: StaticKVCache(None), ("error", TypeError, "capacity must be an int")),
    ("static capacity str", lambda: StaticKVCache("8"), ("error", TypeError, "capacity must be an int")),
    ("static capacities differ", refused_static_writes_nothing, ("result", bool)),
    ("forward cropped caches, other batch", cropped_then_another_batch, ("error", ValueError, "kv_caches hold 2 rows (sequences) but token_ids has 1 rows")),
    ("static too small", lambda: MODEL(IDS, kv_caches=[StaticKVCache(2), StaticKVCache(2)]), ("error", ValueError, "> capacity 2")),
    # decoding_loop
    ("loop greedy", lambda: torch.cat([IDS, *decoding_loop(MODEL, IDS, 2, None, GREEDY_CHOICE)], dim=1), ("result", equals(GREEDY))),
    ("loop zero new", lambda: list(decoding_loop(MODEL, IDS, 0, None, GREEDY_CHOICE)), ("result", equals([]))),
    ("loop choose None", lambda: next(decoding_loop(MODEL, IDS, 2, None, None)), ("error", TypeError, "choose must be a function")),
    ("loop choose int", lambda: next(decoding_loop(MODEL, IDS, 2, None, 0)), ("error", TypeError, "choose must be a function")),
    ("loop model_args dict", lambda: next(decoding_loop(MODEL, IDS, 2, None, GREEDY_CHOICE, model_args={})), ("error", TypeError, "model_args must be None or a function")),
    ("loop list prompt", lambda: next(decoding_loop(MODEL, [[1, 2]], 2, None, GREEDY_CHOICE)), ("error", TypeError, "token_ids must be a torch.Tensor")),
    ("loop too long", lambda: next(decoding_loop(MODEL, IDS, 20, None, GREEDY_CHOICE)), ("error", ValueError, "more than the model's context_length")),
    ("loop context 0", lambda: next(decoding_loop(MODEL, IDS, 2, 0, GREEDY_CHOICE)), ("error", ValueError, "context_length must be >= 1")),
    ("loop eos -1", lambda: next(decoding_loop(MODEL, IDS, 2, None, GREEDY_CHOICE, eos_id=-1)), ("error", ValueError, "eos_id must be >= 0")),
    # next_token_logits
    ("next ok", lambda: next_token_logits(MODEL, IDS, MODEL.new_kv_caches(), 8), ("result", lambda r: torch.allclose(r, MODEL(IDS)[:, -1]))),
    ("next refills", ntl_refills, ("result", bool)),
    ("next caches None", lambda: next_token_logits(MODEL, IDS, None, 8), ("error", ValueError, "caches must be")),
    ("next caches []", lambda: next_token_logits(MODEL, IDS, [], 8), ("error", ValueError, "caches must be")),
    ("next context 0", lambda: next_token_logits(MODEL, IDS, MODEL.new_kv_caches(), 0), ("error", ValueError, "context_length must be >= 1")),
    ("next context -1", lambda: next_token_logits(MODEL, IDS, MODEL.new_kv_caches(), -1), ("error", ValueError, "context_length must be >= 1")),
    ("next context 2.0", lambda: next_token_logits(MODEL, IDS, MODEL.new_kv_caches(), 2.0), ("error", TypeError, "context_length must be an int")),
    ("next list ids", lambda: next_token_logits(MODEL, [[1]], MODEL.new_kv_caches(), 8), ("error", TypeError, "token_ids must be a torch.Tensor")),
    ("next 1-D ids", lambda: next_token_logits(MODEL, IDS[0], MODEL.new_kv_caches(), 8), ("error", ValueError, "token_ids must be 2-D")),
    # the doors sampling and cache_list, eval_mode
    ("sampling args ok", lambda: door.sampling(0.7, 40, 0.95), ("result", lambda r: r is None)),
    ("sampling top_k True", lambda: door.sampling(top_k=True), ("error", TypeError, "top_k must be an int")),
    ("kv caches None", lambda: door.cache_list(None, 2), ("result", lambda r: r is None)),
    ("kv caches str", lambda: door.cache_list("ab", 2), ("error", ValueError, "kv_caches must be model.new_kv_caches()")),
    ("kv caches of str", lambda: door.cache_list(["a", "b"], 2), ("error", ValueError, "kv_caches must be model.new_kv_caches()")),
    ("kv caches int", lambda: door.cache_list(3, 2), ("error", ValueError, "kv_caches must be model.new_kv_caches()")),
    ("kv caches ok", lambda: door.cache_list([KVCache(), StaticKVCache(4)], 2), ("result", lambda r: r is None)),
    ("eval_mode restores", mode_restored, ("result", bool)),
    ("eval_mode None", lambda: eval_mode(None).__enter__(), ("error", TypeError, "model must be a Module")),
    ("eval_mode str", lambda: eval_mode("gpt2").__enter__(), ("error", TypeError, "model must be a Module")),
]


test_door = door_tests(CASES)


if __name__ == "__main__":  # the counts of issue 30's closing note
    report(CASES)

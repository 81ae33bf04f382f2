import math
import re

import pytest
import torch
from torch import nn

from course_lib.attention import KVCache
from course_lib.config import GPTConfig
from course_lib.doors import generation as door
from course_lib.generation import (GraphedGreedyDecoder, StaticKVCache, eval_mode, generate, generate_text_simple,
                                   sample_next_token, scale_logits, top_k_filter, top_p_filter)
from course_lib.tokenization import EOS_ID
from course_lib.model import GPTModel

CFG = GPTConfig(vocab_size=97, context_length=16, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.1)
# A fixed next-token distribution over 8 tokens; most likely first: 3 (0.56), 0 (0.21), 5 (0.13), 2, ...
EXAMPLE = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0, 1.5, 0.0, -0.5])


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPTModel(CFG).eval()


def prompts(batch, tokens, seed):
    return torch.randint(0, CFG.vocab_size, (batch, tokens), generator=torch.Generator().manual_seed(seed))


# --- the KV cache changes the cost, never the tokens ------------------------------------------------------

@pytest.mark.parametrize("batch, tokens, new", [(1, 1, 15), (2, 3, 13), (3, 8, 8), (1, 15, 1), (2, 16, 0)])
def test_cache_gives_the_same_tokens_up_to_the_context_limit(model, batch, tokens, new):
    token_ids = prompts(batch, tokens, seed=tokens)
    cached = generate(model, token_ids, new, use_cache=True)
    plain = generate(model, token_ids, new, use_cache=False)
    assert cached.shape == (batch, tokens + new)
    assert torch.equal(cached[:, :tokens], token_ids)
    assert torch.equal(cached, plain)


@pytest.mark.parametrize("context_length", [1, 5, CFG.context_length])
@pytest.mark.parametrize("tokens, new", [(4, 30), (20, 10)])
def test_cache_gives_the_same_tokens_past_the_context_with_cropping(model, context_length, tokens, new):
    token_ids = prompts(2, tokens, seed=context_length)
    cached = generate(model, token_ids, new, context_length=context_length, use_cache=True)
    plain = generate(model, token_ids, new, context_length=context_length, use_cache=False)
    assert cached.shape == (2, tokens + new)
    assert torch.equal(cached, plain)


def test_cache_gives_the_same_samples_with_the_same_seed(model):
    token_ids = prompts(2, 3, seed=1)
    runs = [generate(model, token_ids, 20, context_length=10, temperature=1.0, top_k=20, use_cache=use_cache,
                     generator=torch.Generator().manual_seed(5)) for use_cache in (True, False)]
    assert torch.equal(*runs)


# --- the static cache: the growing cache's results, written in place ----------------------------------------

@pytest.mark.parametrize("chunks", [(5, 1, 1, 1, 1), (1,) * 9, (3, 4, 2), (9,)])
def test_static_cache_gives_bit_identical_logits_and_never_moves(model, chunks):
    token_ids = prompts(2, sum(chunks), seed=len(chunks))
    growing = model.new_kv_caches()
    static = [StaticKVCache(capacity=CFG.context_length) for _ in range(CFG.n_layers)]
    start, stores = 0, None
    with torch.no_grad():
        for size in chunks:
            piece = token_ids[:, start:start + size]
            assert torch.equal(model(piece, kv_caches=growing), model(piece, kv_caches=static))
            start += size
            if stores is None:
                stores = [(c.key_store.data_ptr(), c.value_store.data_ptr()) for c in static]
    assert [(c.key_store.data_ptr(), c.value_store.data_ptr()) for c in static] == stores
    for g, s in zip(growing, static):
        assert len(s) == len(g) == start
        assert torch.equal(s.keys, g.keys) and torch.equal(s.values, g.values)
        assert s.keys.data_ptr() == s.key_store.data_ptr(), "keys must be a view of the store"


def test_static_cache_select_and_crop_keep_matching_the_growing_cache(model):
    token_ids = prompts(3, 10, seed=4)
    growing = model.new_kv_caches()
    static = [StaticKVCache(capacity=12) for _ in range(CFG.n_layers)]
    rows = torch.tensor([2, 0, 0])  # beam search's pattern: reorder and repeat
    with torch.no_grad():
        for caches in (growing, static):
            model(token_ids[:, :6], kv_caches=caches)
            for cache in caches:
                cache.select(rows)
        for g, s in zip(growing, static):  # straight after select, before any append repairs the views
            assert torch.equal(s.keys, g.keys) and torch.equal(s.values, g.values)
        for caches in (growing, static):
            for cache in caches:
                cache.crop(4)  # speculative decoding's pattern: drop the rejected positions
        for g, s in zip(growing, static):
            assert len(s) == len(g) == 4 and torch.equal(s.keys, g.keys) and torch.equal(s.values, g.values)
        for t in range(4, 10):  # keep going after both, on the selected rows
            piece = token_ids[rows, t:t + 1]
            assert torch.equal(model(piece, kv_caches=growing), model(piece, kv_caches=static))
    assert len(static[0]) == 10 and static[0].key_store.shape == (3, CFG.n_heads, 12, CFG.emb_dim // CFG.n_heads)


def test_static_cache_refuses_more_positions_than_its_capacity(model):
    static = [StaticKVCache(capacity=5) for _ in range(CFG.n_layers)]
    with torch.no_grad():
        model(prompts(1, 4, seed=0), kv_caches=static)
        with pytest.raises(ValueError, match=re.escape(
                "4 cached + 2 new positions > capacity 5: create StaticKVCache(capacity) with room for the prompt "
                "and every new token, or crop() it")):
            model(prompts(1, 2, seed=1), kv_caches=static)
        assert len(static[0]) == 4, "the refused append left the cache as it was"
        for cache in static:
            cache.crop(3)
        model(prompts(1, 2, seed=1), kv_caches=static)  # 3 + 2 fits
    assert len(static[0]) == 5


# A capacity that holds nothing, or is not an int, is refused where it is given (issue 30; issue 29 had left it to
# the first append, where "8" failed in a comparison).
@pytest.mark.parametrize("capacity, error, message", [
    (0, ValueError, "capacity must be >= 1, got 0"),
    (-1, ValueError, "capacity must be >= 1, got -1"),
    ("8", TypeError, "capacity must be an int, got '8' (str)"),
])
def test_a_static_cache_without_room_is_refused(capacity, error, message):
    with pytest.raises(error, match=re.escape(message)):
        StaticKVCache(capacity)


def test_a_static_cache_refuses_another_batch(model):
    # issue 30: the new keys would broadcast into the stores of another batch, silently
    static = [StaticKVCache(8) for _ in range(CFG.n_layers)]
    model(prompts(2, 3, seed=0), kv_caches=static)
    with pytest.raises(ValueError, match=re.escape("kv_caches hold 2 rows (sequences) but token_ids has 1 rows")):
        model(prompts(1, 1, seed=1), kv_caches=static)  # the model's door sees it first
    keys = torch.zeros(1, CFG.n_heads, 1, CFG.emb_dim // CFG.n_heads)
    with pytest.raises(ValueError, match=re.escape("this StaticKVCache holds 2 rows (sequences), the new keys 1 rows")):
        static[0].append(keys, keys)  # and the cache itself, for a caller who appends directly
    assert [len(cache) for cache in static] == [3, 3], "the refused calls wrote nothing"


@pytest.mark.parametrize("cache_type", [KVCache, lambda: StaticKVCache(8)])
def test_a_model_that_changes_dtype_or_device_under_its_caches_fails_loudly(cache_type):
    # was: KVCache.check_new refusing keys of another dtype or device. Appending no longer checks: torch.cat (and the
    # static store's copy) casts the new keys to the cache's dtype, and SDPA then refuses queries of another dtype.
    torch.manual_seed(0)
    model = GPTModel(CFG).eval()
    caches = [cache_type() for _ in range(CFG.n_layers)]
    with torch.no_grad():
        model(prompts(1, 3, seed=0), kv_caches=caches)
        model.to(torch.bfloat16)
        with pytest.raises(RuntimeError, match=re.escape("Expected query, key, and value to have the same dtype, but "
                                                         "got query.dtype: c10::BFloat16 key.dtype: float")):
            model(prompts(1, 1, seed=1), kv_caches=caches)
        # block 0 appended before SDPA stopped, so the caches now differ in length: the model refuses them by name
        with pytest.raises(ValueError, match=re.escape("kv_caches must be model.new_kv_caches()")):
            model.to(torch.float32)(prompts(1, 1, seed=1), kv_caches=caches)
        caches = [cache_type() for _ in range(CFG.n_layers)]
        model(prompts(1, 3, seed=0), kv_caches=caches)
        model.to("meta")  # another device, without needing a GPU
        with pytest.raises((RuntimeError, NotImplementedError), match="meta"):
            model(prompts(1, 1, seed=1).to("meta"), kv_caches=caches)


def test_a_smaller_selection_shrinks_the_static_cache_at_once(model):
    static = [StaticKVCache(capacity=8) for _ in range(CFG.n_layers)]
    with torch.no_grad():
        model(prompts(3, 5, seed=2), kv_caches=static)
    kept = static[0].keys[[1, 2]].clone()
    static[0].select(torch.tensor([1, 2]))
    assert static[0].keys.shape[0] == static[0].values.shape[0] == static[0].key_store.shape[0] == 2
    assert torch.equal(static[0].keys, kept)


def test_generate_runs_every_cached_step_on_static_caches(model):
    seen = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append({type(c) for c in kwargs["kv_caches"]}), with_kwargs=True)
    try:
        generate(model, prompts(2, 3, seed=0), 6)
        generate(model, prompts(2, 3, seed=0), 12, context_length=5)  # refills the caches when the window is full
    finally:
        hook.remove()
    assert len(seen) == 6 + 12 and all(types == {StaticKVCache} for types in seen)


def test_generate_feeds_static_caches_that_fit_the_longest_window(model, monkeypatch):
    made = []
    original = StaticKVCache.__init__

    def record(self, capacity):
        made.append(capacity)
        original(self, capacity)

    monkeypatch.setattr(StaticKVCache, "__init__", record)
    generate(model, prompts(1, 3, seed=0), 5)  # 3 + 5 tokens fit: the caches need 8 positions at most
    generate(model, prompts(1, 3, seed=0), 40, context_length=6)  # the window holds 6
    assert made == [8] * CFG.n_layers + [6] * CFG.n_layers


@pytest.mark.parametrize("context_length, tokens, new", [(CFG.context_length, 4, 12), (6, 4, 20), (1, 2, 5)])
def test_greedy_generate_equals_generate_text_simple(model, context_length, tokens, new):
    token_ids = prompts(3, tokens, seed=7)
    simple = generate_text_simple(model, token_ids, new, context_length)
    assert torch.equal(generate(model, token_ids, new, context_length=context_length), simple)
    assert torch.equal(generate(model, token_ids, new, context_length=context_length, use_cache=False), simple)


def test_generate_text_simple_without_cropping_uses_the_whole_context(model):
    token_ids = prompts(1, 4, seed=3)
    assert torch.equal(generate_text_simple(model, token_ids, 12, None), generate(model, token_ids, 12))


def test_generation_runs_in_eval_mode_and_restores_every_module_mode(model):
    token_ids = prompts(2, 3, seed=2)
    expected = generate(model, token_ids, 10)
    model.train()
    model.trf_blocks[0].eval()  # a mixed state must come back as it was
    try:
        assert torch.equal(generate(model, token_ids, 10), expected)  # dropout was off
        assert torch.equal(generate_text_simple(model, token_ids, 10, 8),
                           generate(model, token_ids, 10, context_length=8))
        assert model.training and not model.trf_blocks[0].training and model.trf_blocks[1].training
        assert not model.trf_blocks[0].att.training and model.trf_blocks[1].att.training
    finally:
        model.eval()


def test_eval_mode_restores_the_mode_after_an_error():
    layer = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)).train()
    with pytest.raises(RuntimeError, match="inside"):
        with eval_mode(layer):
            assert not layer.training and not layer[1].training
            raise RuntimeError("inside")
    assert layer.training and layer[1].training


def test_generate_computes_no_gradients(model):
    out = generate(model, prompts(1, 2, seed=0), 3, temperature=1.0)
    assert not out.requires_grad and out.dtype == torch.long


def test_max_new_tokens_zero_returns_the_prompt(model):
    token_ids = prompts(2, 5, seed=4)
    assert torch.equal(generate(model, token_ids, 0), token_ids)
    assert torch.equal(generate_text_simple(model, token_ids, 0, 5), token_ids)


# --- the sampling pieces ------------------------------------------------------------------------------------

def test_temperature_divides_the_logits_exactly():
    logits = torch.randn(3, 50)
    for temperature in (0.1, 0.7, 1, 1.0, 2.5):
        assert torch.equal(scale_logits(logits, temperature), logits / temperature)


def test_temperature_above_one_flattens_and_below_one_sharpens():
    probs = {t: torch.softmax(scale_logits(EXAMPLE, t), dim=-1) for t in (0.5, 1.0, 2.0)}
    assert probs[0.5].max() > probs[1.0].max() > probs[2.0].max()
    for p in probs.values():
        assert torch.equal(p.argsort(descending=True), EXAMPLE.argsort(descending=True))  # order kept


def test_top_k_filter_keeps_exactly_the_k_largest():
    filtered = top_k_filter(EXAMPLE, 3)
    kept = torch.isfinite(filtered).nonzero().flatten().tolist()
    assert kept == [0, 3, 5]
    assert torch.equal(filtered[kept], EXAMPLE[kept])
    assert torch.equal(top_k_filter(EXAMPLE, 8), EXAMPLE) and torch.equal(top_k_filter(EXAMPLE, 100), EXAMPLE)
    ties = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 2.0, 2.0, 2.0]])
    assert torch.isfinite(top_k_filter(ties, 2)).sum(dim=-1).tolist() == [2, 2]


def test_top_p_filter_keeps_the_smallest_set_that_reaches_p():
    probs = torch.softmax(EXAMPLE, dim=-1)  # cumulative: 0.56, 0.77, 0.89, 0.94, ...
    for p, expected in ((0.01, [3]), (0.56, [3]), (0.57, [0, 3]), (0.85, [0, 3, 5]), (0.99, None)):
        kept = torch.isfinite(top_p_filter(EXAMPLE, p)).nonzero().flatten()
        order = probs.argsort(descending=True)
        smallest = order[: int((probs[order].cumsum(0) < p).sum()) + 1].sort().values
        assert torch.equal(kept, smallest)
        if expected is not None:
            assert kept.tolist() == expected
    logits = torch.randn(200, 30) * 2
    for p in (0.1, 0.5, 0.9):
        kept = torch.isfinite(top_p_filter(logits, p))
        mass = (torch.softmax(logits, dim=-1) * kept).sum(dim=-1)
        smallest_kept = torch.softmax(logits, dim=-1).masked_fill(~kept, 2.0).min(dim=-1).values
        assert (mass >= p - 1e-6).all() and (mass - smallest_kept < p).all()


def test_top_p_one_keeps_everything():
    logits = torch.tensor([[30.0, 0.0, -30.0, -60.0]])  # the last probabilities round to 0 in float32
    assert torch.equal(top_p_filter(logits, 1.0), logits)
    assert torch.equal(top_p_filter(logits, 1), logits)


def draws(logits, n=4000, seed=0, **sampling):
    """n tokens drawn from one row of logits, with a seeded generator."""
    batch = logits.expand(n, -1)  # (n, vocab_size): n independent draws in one call
    return sample_next_token(batch, generator=torch.Generator().manual_seed(seed), **sampling)[:, 0]


def test_top_k_never_samples_outside_its_set():
    tokens = draws(EXAMPLE, temperature=2.0, top_k=3)
    assert set(tokens.tolist()) == {0, 3, 5}


def test_top_p_never_samples_outside_its_set():
    tokens = draws(EXAMPLE, temperature=1.0, top_p=0.85)
    assert set(tokens.tolist()) == {0, 3, 5}
    tokens = draws(EXAMPLE, temperature=1.0, top_k=2, top_p=0.99)  # top-k first, then top-p
    assert set(tokens.tolist()) == {0, 3}


def test_sampling_frequencies_match_the_probabilities():
    for temperature in (0.5, 1.0, 2.0):
        tokens = draws(EXAMPLE, n=20000, temperature=temperature)
        freq = torch.bincount(tokens, minlength=8) / 20000
        probs = torch.softmax(EXAMPLE / temperature, dim=-1)
        assert (freq - probs).abs().max() < 0.015


def test_temperature_zero_is_argmax_whatever_the_filters():
    logits = torch.randn(5, 40)
    expected = logits.argmax(dim=-1, keepdim=True)
    assert torch.equal(sample_next_token(logits), expected)
    assert torch.equal(sample_next_token(logits, 0.0, top_k=3, top_p=0.5), expected)
    assert torch.equal(sample_next_token(logits, 1.0, top_k=1), expected)


def test_same_seed_same_tokens_other_seed_other_tokens(model):
    token_ids = prompts(2, 3, seed=9)

    def run(seed):
        return generate(model, token_ids, 12, temperature=1.5, top_p=0.95,
                        generator=torch.Generator().manual_seed(seed))

    assert torch.equal(run(1), run(1))
    assert not torch.equal(run(1), run(2))


# --- stopping at the end-of-text token ---------------------------------------------------------------------

def finish_at(rows: torch.Tensor, prompt_len: int, eos_id: int) -> list[list[int]]:
    """What eos handling must make of free-running rows: everything after the first eos_id becomes eos_id."""
    out = []
    for row in rows.tolist():
        new = row[prompt_len:]
        if eos_id in new:
            first = new.index(eos_id)
            new = new[: first + 1] + [eos_id] * (len(new) - first - 1)
        out.append(row[:prompt_len] + new)
    return out


@pytest.mark.parametrize("use_cache", [True, False])
def test_eos_fills_finished_rows_and_stops_when_all_are_done(model, use_cache):
    token_ids = prompts(4, 3, seed=11)
    free = generate(model, token_ids, 12, use_cache=use_cache)
    eos_id = free[0, 5].item()  # the third token row 0 produces plays the end-of-text token
    stopped = generate(model, token_ids, 12, eos_id=eos_id, use_cache=use_cache)
    assert stopped.shape == free.shape  # not every row produces eos_id, so all 12 steps run
    assert stopped.tolist() == finish_at(free, 3, eos_id)
    assert (stopped[0, 5:] == eos_id).all()
    assert any(eos_id not in row for row in stopped[:, 3:].tolist())


def test_generation_stops_early_once_every_row_finished(model):
    token_ids = prompts(1, 3, seed=11).repeat(2, 1)  # two copies: both finish at the same step
    free = generate(model, token_ids, 12)
    eos_id = free[0, 5].item()
    first = free[0, 3:].tolist().index(eos_id)  # eos_id may already come earlier than step 2
    stopped = generate(model, token_ids, 12, eos_id=eos_id)
    assert stopped.shape == (2, 3 + first + 1)
    assert torch.equal(stopped, free[:, : 3 + first + 1])


def test_eos_id_constant_is_gpt2_end_of_text():
    from course_lib.tokenization import gpt2_tokenizer
    assert gpt2_tokenizer().encode("<|endoftext|>", allowed_special={"<|endoftext|>"}) == [EOS_ID]


# --- every bad input, with its message ---------------------------------------------------------------------

GOOD = torch.tensor([[1, 2, 3]])


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(token_ids=torch.zeros(1, 0, dtype=torch.long)), ValueError,
     "token_ids is empty, shape (1, 0): pass at least one token (to start from nothing, use <|endoftext|>, id 50256)"),
    (dict(token_ids=torch.zeros(0, 3, dtype=torch.long)), ValueError,
     "token_ids is empty, shape (0, 3): pass at least one token"),
    (dict(token_ids=torch.tensor([[1, 97]])), ValueError, "token_ids holds token id 97 >= vocab_size 97"),
    (dict(token_ids=torch.tensor([[-1, 2]])), ValueError, "token_ids holds token id -1 < 0"),
    (dict(token_ids=torch.tensor([1, 2, 3])), ValueError, "token_ids must be 2-D (batch, tokens), got shape (3,)"),
    (dict(token_ids=torch.tensor([[1.0, 2.0]])), TypeError,
     "token_ids must hold integer token ids, got dtype torch.float32: convert with .long()"),
    (dict(token_ids=[[1, 2, 3]]), TypeError, "token_ids must be a torch.Tensor of token ids, got list: wrap a list"),
    (dict(max_new_tokens=-1), ValueError, "max_new_tokens must be >= 0, got -1"),
    (dict(max_new_tokens=2.0), TypeError, "max_new_tokens must be an int, got 2.0"),
    (dict(max_new_tokens=14), ValueError, "a prompt of 3 tokens + max_new_tokens 14 = 17 tokens, more than "
                                          "the model's context_length 16, and cropping is off: shorten the "
                                          "prompt or max_new_tokens, or pass context_length=16 to keep only "
                                          "the last 16 tokens"),
    (dict(token_ids=torch.zeros(1, 17, dtype=torch.long), max_new_tokens=0), ValueError,
     "a prompt of 17 tokens + max_new_tokens 0 = 17 tokens, more than the model's context_length 16"),
    (dict(context_length=0), ValueError, "context_length must be >= 1, got 0"),  # require_int's minimum comes first
    (dict(context_length=20), ValueError, "context_length must be in [1, 16], got 20: it is how many of the "
                                        "last tokens the model reads, at most the model's own context_length"),
    (dict(context_length=17), ValueError, "context_length must be in [1, 16], got 17"),
    (dict(context_length=4.0), TypeError, "context_length must be an int, got 4.0 (float)"),
    (dict(temperature=-0.5), ValueError, "temperature must be in [0, inf), got -0.5: 0 means greedy (argmax)"),
    (dict(temperature=float("nan")), ValueError, "temperature must be in [0, inf), got nan"),
    (dict(temperature="hot"), TypeError, "temperature must be a number, got 'hot' (str)"),
    (dict(top_k=0), ValueError, "top_k must be >= 1, got 0"),
    (dict(top_k=2.5), TypeError, "top_k must be an int, got 2.5 (float)"),
    (dict(top_p=0.0), ValueError, "top_p must be in (0, 1], got 0.0: top_p=0.9 keeps the most likely"),
    (dict(top_p=1.5), ValueError, "top_p must be in (0, 1], got 1.5"),
    (dict(top_p="0.9"), TypeError, "top_p must be a number, got '0.9' (str)"),
    (dict(eos_id=97), ValueError, "eos_id must be in [0, 96], got 97: for GPT-2's <|endoftext|> pass 50256"),
    (dict(eos_id=-1), ValueError, "eos_id must be >= 0, got -1"),
    (dict(eos_id=2.0), TypeError, "eos_id must be an int, got 2.0 (float)"),
    # was: use_cache=1 refused by require_bool (issue 29: use_cache is used by truthiness, as in Python)
    (dict(generator=123, temperature=1.0), TypeError,  # was our check_generator; greedy decoding draws nothing
     "multinomial(): argument 'generator' must be torch.Generator, not int"),
    (dict(model=nn.Linear(2, 2)), TypeError, "model.cfg must be a GPTConfig, got NoneType: pass a GPTModel, built "
                                             "with GPTModel(cfg)"),
])
def test_generate_rejects_bad_inputs(model, kwargs, error, message):
    args = dict(model=model, token_ids=GOOD, max_new_tokens=2) | kwargs
    with pytest.raises(error, match=re.escape(message)):
        generate(**args)


@pytest.mark.parametrize("token_ids, new, context_length, message", [
    (torch.zeros(1, 0, dtype=torch.long), 2, 4, "token_ids is empty"),
    (torch.tensor([[100]]), 2, 4, "token_ids holds token id 100 >= vocab_size 97"),
    (GOOD, -2, 4, "max_new_tokens must be >= 0, got -2"),
    (GOOD, 2, 0, "context_length must be >= 1, got 0"),
    (GOOD, 2, 17, "context_length must be in [1, 16], got 17"),
    (GOOD, 20, None, "a prompt of 3 tokens + max_new_tokens 20 = 23 tokens"),
])
def test_generate_text_simple_rejects_bad_inputs(model, token_ids, new, context_length, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        generate_text_simple(model, token_ids, new, context_length)


def test_the_generation_door_returns_the_context_length_it_uses(model):
    assert door.generation_args(model, GOOD, 5, None) == 16
    assert door.generation_args(model, GOOD, 100, 7) == 7


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device type for the generator")
def test_generator_on_another_device_is_refused_by_multinomial(model):
    # was: check_generator's message (issue 29); torch.multinomial checks the generator's device itself
    with pytest.raises(RuntimeError, match=re.escape("Expected a 'cpu' device type for generator but found 'cuda'")):
        generate(model, GOOD, 2, temperature=1.0, generator=torch.Generator(device="cuda"))


def test_token_ids_on_another_device_than_the_model_is_rejected(model):
    meta_token_ids = GOOD.to("meta")
    with pytest.raises(ValueError, match=re.escape("token_ids is on meta but the model is on cpu: move it with "
                                                   ".to(...)")):
        generate(model, meta_token_ids, 2)


@pytest.mark.parametrize("call, error, message", [
    (lambda: scale_logits(EXAMPLE, 0), ValueError, "temperature must be in (0, inf), got 0: temperature 0 stands for "
                                                   "greedy decoding, so take logits.argmax(dim=-1) instead of dividing "
                                                   "by zero"),
    (lambda: scale_logits(EXAMPLE, -1.0), ValueError, "temperature must be in (0, inf), got -1.0"),
    (lambda: scale_logits(EXAMPLE, float("inf")), ValueError, "temperature must be in (0, inf), got inf"),
    (lambda: top_k_filter(EXAMPLE, 0), ValueError, "top_k must be >= 1, got 0"),
    (lambda: top_k_filter(EXAMPLE, True), TypeError, "top_k must be an int, got True (bool)"),
    (lambda: top_p_filter(EXAMPLE, 0), ValueError, "top_p must be in (0, 1], got 0"),
    (lambda: top_p_filter(EXAMPLE, 1.01), ValueError, "top_p must be in (0, 1], got 1.01"),
    (lambda: door.sampling(top_p=float("nan")), ValueError, "top_p must be in (0, 1], got nan"),
    # the logits' door (issue 30): token ids or a list are refused by name; sample_next_token wants (batch, vocab_size),
    # since the model's output (batch, tokens, vocab_size) would give one greedy token per position, silently
    (lambda: top_k_filter(torch.tensor([1, 2]), 1), TypeError, "logits must be a floating-point tensor of scores "
                                                               "(..., vocab_size), got dtype torch.int64"),
    (lambda: top_p_filter([1.0, 2.0], 0.5), TypeError, "logits must be a floating-point tensor of scores (..., "
                                                       "vocab_size), got list"),
    (lambda: sample_next_token(EXAMPLE), ValueError, "logits must be 2-D (batch, vocab_size) with at least one token, "
                                                     "got shape (8,): for one row use logits.unsqueeze(0)"),
    (lambda: sample_next_token(EXAMPLE[None, None]), ValueError, "of the model's output (batch, tokens, vocab_size) "
                                                                 "take the last position, logits[:, -1, :]"),
    (lambda: sample_next_token(EXAMPLE[None], 1.0, generator="seed"), TypeError,
     "multinomial(): argument 'generator' must be torch.Generator, not str"),
])
def test_sampling_pieces_reject_bad_inputs(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call()


# ----------------------------------------------------------------------------- non-finite logits, half precision

@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_nan_or_plus_inf_logits_are_refused_by_name(bad, temperature):
    logits = torch.randn(3, 10)
    logits[1, 4] = bad
    with pytest.raises(ValueError, match=re.escape("logits hold NaN or +inf, or a row that is all -inf, so no token "
                                                   "can be chosen: the model's output is broken")):
        sample_next_token(logits, temperature, generator=torch.Generator().manual_seed(0))


def test_a_row_without_any_token_left_fails_loudly_when_sampled():
    # issue 30: read in the same look as NaN and +inf (on the CPU), since greedy decoding silently picked token 0
    logits = torch.randn(2, 10)
    logits[0] = -math.inf
    for temperature in (0.0, 1.0):
        with pytest.raises(ValueError, match=re.escape("or a row that is all -inf, so no token can be chosen")):
            sample_next_token(logits, temperature)
    logits[0, 3] = 0.0  # one token left: it is the only choice
    assert sample_next_token(logits, 1.0, generator=torch.Generator().manual_seed(0))[0, 0] == 3


def test_float16_logits_at_a_tiny_temperature_sample_the_argmax():
    logits = (torch.randn(4, 1000) * 100).half()  # logits / 0.001 would overflow float16 (largest 65,504)
    scaled = scale_logits(logits, 0.001)  # issue 41: divided in float32, where it cannot
    assert scaled.dtype == torch.float32 and torch.isfinite(scaled).all()
    assert torch.equal(scaled, logits.float() / 0.001)
    drawn = sample_next_token(logits, 0.001, generator=torch.Generator().manual_seed(0))
    assert torch.equal(drawn, logits.float().argmax(dim=-1, keepdim=True))


# issue 41: the accepted temperatures depend on the logits' dtype. The division runs in float32 at least, and a
# temperature below that dtype's epsilon is refused: above it, logits / temperature is finite for every logit up to
# finfo.max * eps (any float16 logit; 4e31 in float32), and on the CPU a larger logit that would still overflow is read
# and refused. No temperature the door accepts gives inf or NaN.
@pytest.mark.parametrize("dtype, smallest", [(torch.float16, 1.1920928955078125e-07),
                                             (torch.bfloat16, 1.1920928955078125e-07),
                                             (torch.float32, 1.1920928955078125e-07),
                                             (torch.float64, 2.220446049250313e-16)])
def test_the_smallest_temperature_follows_the_dtype_and_never_overflows(dtype, smallest):
    assert smallest == torch.finfo(torch.promote_types(dtype, torch.float32)).eps
    info = torch.finfo(dtype)
    largest = min(info.max, torch.finfo(torch.promote_types(dtype, torch.float32)).max * smallest / 2)  # any float16
    logits = torch.tensor([[largest, -largest, 0.0, 1.0]], dtype=torch.float64).to(dtype)
    assert torch.isfinite(scale_logits(logits, smallest)).all()
    with pytest.raises(ValueError, match=re.escape(f"temperature must be at least {smallest:.3g} for {dtype} logits")):
        scale_logits(logits, smallest / 2)
    with pytest.raises(ValueError, match="temperature must be at least"):
        sample_next_token(logits, smallest / 2)


@pytest.mark.parametrize("dtype, temperature", [(torch.float32, 1e-45), (torch.float16, 1e-5)])
def test_the_examples_of_issue_41_never_give_inf(dtype, temperature):
    logits = torch.tensor([[1.0, 3.0, 2.0]], dtype=dtype)
    try:
        scaled = scale_logits(logits, temperature)
    except ValueError as error:
        assert "temperature must be at least" in str(error)
    else:
        assert torch.isfinite(scaled).all()


def test_a_logit_the_division_would_still_overflow_is_refused_on_the_cpu():
    logits = torch.tensor([[3e38, 1.0]])
    assert torch.isfinite(scale_logits(logits, 1.0)).all()  # temperature 1 never overflows
    with pytest.raises(ValueError, match=re.escape("logits / temperature 0.5 overflows: the largest logit is 3e+38")):
        scale_logits(logits, 0.5)
    scale_logits(logits.to("meta"), 0.5)  # not read on another device: no value to look at without waiting


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_top_p_in_half_precision_keeps_what_float32_keeps(dtype):
    logits = (torch.randn(2, 50257, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    kept = torch.isfinite(top_p_filter(logits, 0.99))
    assert top_p_filter(logits, 0.99).dtype == dtype, "the logits keep their dtype"
    assert torch.equal(kept, torch.isfinite(top_p_filter(logits.float(), 0.99)))


def test_an_empty_prompt_is_called_empty_whatever_its_dtype():
    model = GPTModel(GPTConfig(vocab_size=50, context_length=8, emb_dim=8, n_heads=2, n_layers=1))
    with pytest.raises(ValueError, match="token_ids is empty"):
        generate(model, torch.tensor([[]]), 3)  # torch.tensor([[]]) is float32: the encoding of ""


# Issue 31: GraphedGreedyDecoder, the step of one fixed shape (a CUDA graph where there is a GPU)

@pytest.mark.parametrize("batch,prompt,new", [(1, 1, 15), (2, 4, 12), (3, 9, 7), (1, 16, 0), (2, 2, 14)])
def test_the_fixed_shape_step_gives_generates_tokens(model, batch, prompt, new):
    """The same greedy tokens as generate, from a one-token prompt up to a full context; the decoder is reused
    for a second, shorter prompt and still agrees (the position and the prompt length are reset on the device)."""
    generator = torch.Generator().manual_seed(batch * 100 + prompt)
    ids = torch.randint(0, CFG.vocab_size, (batch, prompt), generator=generator)
    decoder = GraphedGreedyDecoder(model, capacity=CFG.context_length, batch=batch)
    model.train()  # the decoder runs in eval mode whatever the model's mode, and restores it
    assert torch.equal(decoder.generate(ids, new), generate(model, ids, new))
    assert model.training
    shorter = ids[:, : max(1, prompt // 2)]
    assert torch.equal(decoder.generate(shorter, 5), generate(model, shorter, 5))


def test_the_fixed_shape_step_in_bfloat16(model):
    """In bfloat16 (the model converted with .to) the step's tokens are generate's on the same weights."""
    half = GPTModel(GPTConfig(vocab_size=97, context_length=16, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0))
    half = half.to(torch.bfloat16)
    ids = torch.randint(0, 97, (2, 3), generator=torch.Generator().manual_seed(5))
    decoder = GraphedGreedyDecoder(half, capacity=16, batch=2)
    assert decoder.caches[0].keys.dtype == torch.bfloat16
    agree = (decoder.generate(ids, 13) == generate(half, ids, 13)).float().mean()
    assert agree > 0.9  # bfloat16 roundings differ between the two attention paths only at near-ties


@pytest.mark.parametrize("build,error,message", [
    (lambda m: GraphedGreedyDecoder(m, capacity=17), ValueError, "capacity"),
    (lambda m: GraphedGreedyDecoder(m, capacity=1), ValueError, "capacity"),
    (lambda m: GraphedGreedyDecoder(m, capacity=8, batch=0), ValueError, "batch"),
    (lambda m: GraphedGreedyDecoder(m, capacity=8, compile="yes"), ValueError, "compile"),
    (lambda m: GraphedGreedyDecoder(m, capacity=8, compile="reduce-overhead"), ValueError, "compile"),
    (lambda m: GraphedGreedyDecoder(nn.Linear(2, 2), capacity=8), TypeError, "model"),
    (lambda m: GraphedGreedyDecoder(m, capacity=8).generate(torch.zeros(2, 3, dtype=torch.long), 2), ValueError,
     r"1 row\(s\) of up to 8 tokens.*capacity=5, batch=2"),
    (lambda m: GraphedGreedyDecoder(m, capacity=8).generate(torch.zeros(1, 3, dtype=torch.long), 6), ValueError,
     "capacity=9"),
    (lambda m: GraphedGreedyDecoder(m, capacity=8).generate(torch.full((1, 3), 97), 2), ValueError, "vocab_size"),
    (lambda m: GraphedGreedyDecoder(m, capacity=8).generate(torch.zeros(1, 3, dtype=torch.long), -1), ValueError,
     "max_new_tokens"),
])
def test_the_decoder_refuses_what_it_cannot_decode(model, build, error, message):
    with pytest.raises(error, match=message):
        build(model)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compile", [False, True])
def test_the_cuda_graph_replays_generates_tokens(compile):
    """On a GPU the first generate records one step in a CUDA graph; its replays give generate's tokens (float32,
    TF32 off), for a second prompt of another length too, without recording again."""
    torch.manual_seed(0)
    gpu_model = GPTModel(GPTConfig(vocab_size=500, context_length=64, emb_dim=64, n_heads=4, n_layers=2,
                                   drop_rate=0.0)).cuda().eval()
    ids = torch.randint(0, 500, (2, 5), device="cuda")
    decoder = GraphedGreedyDecoder(gpu_model, capacity=40, batch=2, compile=compile)
    assert torch.equal(decoder.generate(ids, 30), generate(gpu_model, ids, 30))
    graph = decoder.graph
    assert isinstance(graph, torch.cuda.CUDAGraph)
    assert torch.equal(decoder.generate(ids[:, :2], 20), generate(gpu_model, ids[:, :2], 20))
    assert decoder.graph is graph


def test_a_decoder_refuses_a_model_changed_under_it():
    """The caches (and on a GPU the graph) point at the weights the decoder was built for: a model converted or moved
    afterwards is refused with a clear error instead of decoding from freed memory."""
    changed = GPTModel(GPTConfig(vocab_size=97, context_length=16, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0))
    decoder = GraphedGreedyDecoder(changed, capacity=16)
    changed.to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="build a new GraphedGreedyDecoder"):
        decoder.generate(torch.zeros(1, 2, dtype=torch.long), 3)


@pytest.mark.parametrize("capacity,error", [(8.0, TypeError), (8.5, TypeError)])
def test_a_decoder_capacity_must_be_a_whole_number(model, capacity, error):
    with pytest.raises(error, match="capacity"):
        GraphedGreedyDecoder(model, capacity=capacity)


def test_a_prompt_too_long_for_the_context_says_so(model):
    with pytest.raises(ValueError, match="at most the model's context_length, 16"):
        GraphedGreedyDecoder(model, capacity=16).generate(torch.zeros(1, 10, dtype=torch.long), 10)

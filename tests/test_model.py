import math
import re
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from course_lib.attention import KVCache
from course_lib.config import GPT2_CONFIGS, GPTConfig
from course_lib.model import GPTModel, init_gpt2_weights, padding_may_attend, positions_after_padding, trace_shapes

SMALL = GPTConfig(vocab_size=500, context_length=16, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0)


def small_model(tie_weights=False, seed=0, cfg=SMALL):
    torch.manual_seed(seed)
    return GPTModel(replace(cfg, tie_weights=tie_weights)).eval()


def count(model):
    return sum(p.numel() for p in model.parameters())  # parameters() lists a shared Parameter once


def test_gpt2_parameter_counts_untied_and_tied():
    with torch.device("meta"):
        untied = GPTModel(replace(GPT2_CONFIGS["gpt2"], tie_weights=False))
        tied = GPTModel(GPT2_CONFIGS["gpt2"])  # tied by default, as GPT-2
    assert count(untied) == 163_037_184
    assert count(tied) == 124_439_808
    assert count(untied) - count(tied) == 50257 * 768


def test_tied_weights_share_storage_and_stay_equal_after_a_step():
    model = small_model(tie_weights=True).train()
    assert model.out_head.weight is model.embedding.tok_emb.weight
    ids = torch.randint(0, SMALL.vocab_size, (2, 8))
    loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    with torch.no_grad():
        torch.optim.SGD(model.parameters(), lr=0.5).step()
    assert torch.equal(model.out_head.weight, model.embedding.tok_emb.weight)
    assert model.out_head.weight.data_ptr() == model.embedding.tok_emb.weight.data_ptr()
    assert "out_head.weight" in model.state_dict()  # state_dict keeps both names


def test_untied_weights_are_separate_and_drift_apart():
    model = small_model()
    assert model.out_head.weight is not model.embedding.tok_emb.weight
    with torch.no_grad():
        model.out_head.weight.copy_(model.embedding.tok_emb.weight)
    ids = torch.randint(0, SMALL.vocab_size, (2, 8))
    F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
    with torch.no_grad():
        torch.optim.SGD(model.parameters(), lr=0.5).step()
    assert not torch.equal(model.out_head.weight, model.embedding.tok_emb.weight)


def test_logits_shape_and_last_only_equals_the_last_row():
    model = small_model()
    ids = torch.randint(0, SMALL.vocab_size, (3, 10))
    logits = model(ids)
    assert logits.shape == (3, 10, SMALL.vocab_size)
    last = model(ids, last_only=True)
    assert last.shape == (3, 1, SMALL.vocab_size)
    assert torch.allclose(last, logits[:, -1:], atol=1e-5)


@pytest.mark.parametrize("tie_weights", [False, True])
def test_kv_caches_token_by_token_equal_the_full_pass(tie_weights):
    model = small_model(tie_weights)
    ids = torch.randint(0, SMALL.vocab_size, (2, SMALL.context_length))
    full = model(ids)
    caches = model.new_kv_caches()
    assert len(caches) == SMALL.n_layers and all(isinstance(c, KVCache) and len(c) == 0 for c in caches)
    steps = [model(ids[:, :5], caches)]
    steps += [model(ids[:, i:i + 1], caches) for i in range(5, SMALL.context_length)]
    assert [len(c) for c in caches] == [SMALL.context_length] * SMALL.n_layers
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
    with pytest.raises(ValueError, match=re.escape(  # the door counts the positions the caches have left
            "token_ids has 1 tokens, more than the 0 positions left in the context")):
        model(ids[:, :1], caches)
    assert [len(c) for c in caches] == [SMALL.context_length] * SMALL.n_layers


def test_loss_at_init_is_close_to_ln_vocab_size():
    cfg = GPTConfig(vocab_size=50257, context_length=64, emb_dim=64, n_heads=4, n_layers=2, drop_rate=0.0)
    model = small_model(cfg=cfg)
    ids = torch.randint(0, cfg.vocab_size, (4, 64))
    with torch.no_grad():
        loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.1


def test_gpt2_initialisation_statistics():
    cfg = GPTConfig(vocab_size=500, context_length=16, emb_dim=256, n_heads=4, n_layers=8, drop_rate=0.0)
    model = small_model(cfg=cfg)
    block = model.trf_blocks[3]
    assert abs(block.att.W_query.weight.std().item() - 0.02) < 0.002
    assert abs(block.ff.fc.weight.std().item() - 0.02) < 0.002
    residual = 0.02 / math.sqrt(2 * cfg.n_layers)
    assert abs(block.att.out_proj.weight.std().item() - residual) < 0.1 * residual
    assert abs(block.ff.proj.weight.std().item() - residual) < 0.1 * residual
    assert abs(model.embedding.tok_emb.weight.std().item() - 0.02) < 0.002
    assert torch.equal(block.att.W_query.bias, torch.zeros(256))
    assert torch.equal(block.ff.fc.bias, torch.zeros(1024))
    assert torch.equal(model.final_norm.scale, torch.ones(256))
    assert torch.equal(model.final_norm.shift, torch.zeros(256))


def test_init_gpt2_weights_reinitialises_any_gpt_model():
    """init_gpt2_weights (notebook 07, module-level since issue 29) on a model whose parameters were all overwritten:
    N(0, 0.02) weights, N(0, 0.02 / sqrt(2 * n_layers)) on the two projections into the shortcut path, zero biases,
    LayerNorm scale 1 and shift 0; the tied head stays tied."""
    cfg = GPTConfig(vocab_size=500, context_length=64, emb_dim=256, n_heads=4, n_layers=6, drop_rate=0.0,
                    qkv_bias=True)
    model = GPTModel(cfg)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(3.0)
    torch.manual_seed(1)
    assert init_gpt2_weights(model) is None
    residual = 0.02 / math.sqrt(2 * cfg.n_layers)
    for block in model.trf_blocks:
        for weight in (block.att.W_query.weight, block.att.W_key.weight, block.att.W_value.weight, block.ff.fc.weight):
            assert abs(weight.std().item() - 0.02) < 0.002 and abs(weight.mean().item()) < 0.002
        for weight in (block.att.out_proj.weight, block.ff.proj.weight):
            assert abs(weight.std().item() - residual) < 0.1 * residual
        for bias in (block.att.W_query.bias, block.att.out_proj.bias, block.ff.fc.bias, block.ff.proj.bias):
            assert torch.equal(bias, torch.zeros_like(bias))
        for norm in (block.norm1, block.norm2):
            assert torch.equal(norm.scale, torch.ones(256)) and torch.equal(norm.shift, torch.zeros(256))
    for table in (model.embedding.tok_emb.weight, model.embedding.pos_emb.weight):
        assert abs(table.std().item() - 0.02) < 0.002
    assert torch.equal(model.final_norm.scale, torch.ones(256))
    assert torch.equal(model.final_norm.shift, torch.zeros(256))
    assert model.out_head.weight is model.embedding.tok_emb.weight


def test_the_constructor_initialises_with_init_gpt2_weights(monkeypatch):
    import course_lib.model

    seen = []
    monkeypatch.setattr(course_lib.model, "init_gpt2_weights",
                        lambda model: seen.append(model) or init_gpt2_weights(model))
    model = GPTModel(SMALL)
    assert seen == [model]


def test_trace_shapes_lists_every_stage_in_call_order_and_removes_its_hooks():
    model = small_model()
    ids = torch.randint(0, SMALL.vocab_size, (2, 4))
    top = trace_shapes(model, ids, max_depth=2)
    assert top == [("embedding", (2, 4, 32)), ("embedding.tok_emb", (2, 4, 32)),
                   ("embedding.pos_emb", (4, 32)), ("embedding.drop_emb", (2, 4, 32)),
                   ("trf_blocks.0", (2, 4, 32)), ("trf_blocks.1", (2, 4, 32)),
                   ("final_norm", (2, 4, 32)), ("out_head", (2, 4, SMALL.vocab_size))]
    assert [name for name, _ in trace_shapes(model, ids, max_depth=1)] == ["embedding", "final_norm", "out_head"]
    every = trace_shapes(model, ids)
    names = [name for name, _ in every]
    assert names.count("trf_blocks.1.drop_shortcut") == 2  # one dropout module, used after each sub-layer
    assert ("trf_blocks.0.ff.fc", (2, 4, 128)) in every
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    with pytest.raises(ValueError):
        trace_shapes(model, torch.tensor([[SMALL.vocab_size]]))
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("model, max_depth, error, message", [
    ("gpt2", None, TypeError, "model must be a Module, got str: pass the model itself, like GPTModel(cfg)"),
    # issue 30: max_depth 0 listed nothing and 1.5 every level, without an error
    (None, 0, ValueError, "max_depth must be >= 1, got 0"),
    (None, 1.5, TypeError, "max_depth must be an int, got 1.5 (float)"),
])
def test_trace_shapes_refuses_what_it_cannot_trace(model, max_depth, error, message):
    model = GPTModel(GPTConfig(vocab_size=50, context_length=8, emb_dim=8, n_heads=2, n_layers=1)) if model is None else model
    with pytest.raises(error, match=re.escape(message)):
        trace_shapes(model, torch.zeros(1, 2, dtype=torch.long), max_depth=max_depth)


def test_bad_constructor_arguments():
    with pytest.raises(TypeError, match=r"cfg must be a GPTConfig, got dict"):
        GPTModel({"emb_dim": 768})
    with pytest.raises(TypeError, match=r"takes 2 positional arguments"):  # tying is the config's business
        GPTModel(SMALL, True)


def test_the_head_is_tied_by_default_as_in_gpt2():
    assert GPTConfig().tie_weights is True
    model = GPTModel(SMALL)
    assert model.out_head.weight is model.embedding.tok_emb.weight


def test_kv_caches_that_do_not_fit_the_model_are_refused():
    """One cache per block, all holding the same positions: a missing cache (None), a short list, or caches of
    different lengths would silently give new tokens wrong positions or no memory, so check_kv_caches refuses them
    before any cache changes."""
    model = small_model()
    ids = torch.zeros(1, 3, dtype=torch.long)
    message = re.escape("kv_caches must be model.new_kv_caches(): one cache per block (2), all holding the same "
                        "positions; start again with new ones")
    uneven = model.new_kv_caches()
    uneven[0].append(torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 2, 8))  # block 0 holds 2 positions, block 1 none
    for caches in (KVCache(), [KVCache()], [KVCache(), None], uneven):
        with pytest.raises(ValueError, match=message):
            model(ids, caches)
    assert [len(c) for c in uneven] == [2, 0], "refused before any cache changed"
    # last_only is read by truthiness: a non-bool is not refused (issue 29 keeps no check for it)


BAD_IDS = [  # the model's door, GPTModel.forward's require_token_tensor (issue 29: was GPTEmbedding's and attention's)
    (torch.tensor([[1, 600, 2]]), ValueError,
     "token_ids holds token id 600 >= vocab_size 500: the ids come from a larger vocabulary than the model's; use "
     "the tokenizer the model was built for"),
    (torch.tensor([[500]]), ValueError, "token_ids holds token id 500 >= vocab_size 500"),
    (torch.tensor([[5, -1]]), ValueError, "token_ids holds token id -1 < 0: token ids index the vocabulary, 0 .. 499"),
    (torch.zeros(1, 17, dtype=torch.long), ValueError,
     "token_ids has 17 tokens, more than the 16 positions left in the context: crop the input to fit, or start "
     "again with empty KV caches"),
    (torch.tensor([1, 2, 3]), ValueError, "token_ids must be 2-D (batch, tokens), got shape (3,): for a single "
                                          "sequence add a batch dimension with .unsqueeze(0)"),
    (torch.zeros(1, 2, 3, dtype=torch.long), ValueError, "token_ids must be 2-D (batch, tokens), got shape (1, 2, 3)"),
    (torch.tensor([[1.0, 2.0]]), TypeError, "token_ids must hold integer token ids, got dtype torch.float32: convert "
                                            "with .long()"),
    (torch.tensor([[True, False]]), TypeError, "token_ids must hold integer token ids, got dtype torch.bool"),
    (torch.zeros(2, 0, dtype=torch.long), ValueError, "token_ids is empty, shape (2, 0): pass at least one token"),
    (torch.zeros(0, 4, dtype=torch.long), ValueError, "token_ids is empty, shape (0, 4)"),
    ([[1, 2, 3]], TypeError, "token_ids must be a torch.Tensor of token ids, got list: wrap a list of ids with "
                             "torch.tensor(...)"),
]


@pytest.mark.parametrize("ids, error, message", BAD_IDS)
def test_bad_token_ids_are_refused_at_the_model_door(ids, error, message):
    model = small_model()
    with pytest.raises(error, match=re.escape(message)):
        model(ids)
    caches = model.new_kv_caches()
    model(torch.zeros(1, 2, dtype=torch.long), caches)  # 2 cached: 14 positions left
    if "17 tokens" in message:
        message = message.replace("16 positions", "14 positions").replace("last 16", "last 14")
    with pytest.raises(error, match=re.escape(message)):
        model(ids, caches)  # with caches too: the door is the same
    assert [len(c) for c in caches] == [2] * SMALL.n_layers


def test_too_many_tokens_for_the_caches_are_refused_before_any_cache_changes():
    # was test_cache_plus_new_tokens_longer_than_context in test_attention.py: the layer now fails in SDPA after its
    # cache grew; the model refuses at its door, every cache as it was
    model = small_model()
    caches = model.new_kv_caches()
    model(torch.zeros(1, 14, dtype=torch.long), caches)
    with pytest.raises(ValueError, match=re.escape(
            "token_ids has 3 tokens, more than the 2 positions left in the context: crop the input to fit, or "
            "start again with empty KV caches")):
        model(torch.zeros(1, 3, dtype=torch.long), caches)
    assert [len(c) for c in caches] == [14] * SMALL.n_layers
    model(torch.zeros(1, 2, dtype=torch.long), caches)  # exactly context_length is fine
    assert [len(c) for c in caches] == [16] * SMALL.n_layers


def test_token_ids_on_another_device_than_the_model_are_refused():
    # was test_gpt_embedding_rejects_ids_on_another_device; "meta" stands for a GPU on a CPU-only machine
    message = "token_ids is on cpu but the model is on meta: move it with .to(...)"
    with pytest.raises(ValueError, match=re.escape(message)):
        GPTModel(SMALL).to("meta")(torch.tensor([[1, 2]]))


def test_the_door_errors_scale_to_gpt2_sizes():
    # was test_errors_scale_to_gpt2_sizes in test_embeddings.py
    model = GPTModel(GPTConfig(emb_dim=8, n_heads=2, n_layers=1))  # GPT-2's vocabulary and context, tiny width
    with pytest.raises(ValueError, match=re.escape("token_ids has 1025 tokens, more than the 1024 positions left in "
                                                   "the context: crop the input to fit")):
        model(torch.zeros(1, 1025, dtype=torch.long))
    with pytest.raises(ValueError, match="token id 50300 >= vocab_size 50257"):
        model(torch.tensor([[50300]]))


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8])
def test_narrow_integer_ids_are_refused_at_the_door(dtype):
    # nn.Embedding indexes with int64 and int32 only; the door names the ids and the fix before it
    with pytest.raises(TypeError, match=re.escape(f"token_ids must hold integer token ids, got dtype {dtype}: "
                                                  "convert with .long()")):
        small_model()(torch.tensor([[3, 1, 4]], dtype=dtype))


def test_a_left_padded_batch_gives_each_row_its_own_logits():
    torch.manual_seed(0)
    model = GPTModel(GPTConfig(vocab_size=50, context_length=16, emb_dim=32, n_heads=4, n_layers=2,
                               drop_rate=0.0)).eval()
    rows = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
    ids = torch.tensor([[0] * (5 - len(r)) + r for r in rows])  # (3, 5), padded on the left with id 0
    mask = torch.tensor([[0] * (5 - len(r)) + [1] * len(r) for r in rows])
    assert positions_after_padding(mask, 5).tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 0, 1], [0, 0, 0, 1, 2]]
    assert positions_after_padding(mask, 2).tolist() == [[3, 4], [0, 1], [1, 2]]  # the last 2 columns only
    with torch.no_grad():
        padded = model(ids, attention_mask=mask)
        for i, r in enumerate(rows):
            assert torch.allclose(padded[i, 5 - len(r):], model(torch.tensor([r]))[0], atol=1e-5)
        assert not torch.allclose(model(ids)[1, 3:], model(torch.tensor([rows[1]]))[0], atol=1e-3)  # no mask: wrong


def test_a_left_padded_batch_through_the_caches_gives_each_row_its_own_logits():
    """The forward with kv_caches and attention_mask together: the prompt, then one token at a time, each
    row equal to its own prompt run alone without a cache."""
    torch.manual_seed(0)
    model = GPTModel(GPTConfig(vocab_size=50, context_length=16, emb_dim=32, n_heads=4, n_layers=2,
                               drop_rate=0.0)).eval()
    rows = [[3, 4, 5, 6, 7, 20, 21, 22], [8, 9, 23, 24, 25], [10, 11, 12, 26, 27, 28]]  # prompts of 5, 2, 3 + 3 more
    prompt_len = [5, 2, 3]
    ids = torch.tensor([[0] * (5 - n) + r for r, n in zip(rows, prompt_len)])  # (3, 8): 5 prompt columns, 3 new
    mask = (torch.arange(8) >= torch.tensor([5 - n for n in prompt_len])[:, None]).long()  # (3, 8)
    caches = model.new_kv_caches()
    with torch.no_grad():
        steps = [model(ids[:, :5], kv_caches=caches, attention_mask=mask[:, :5])]
        steps += [model(ids[:, t:t + 1], kv_caches=caches, attention_mask=mask[:, :t + 1]) for t in range(5, 8)]
        stepped = torch.cat(steps, dim=1)  # (3, 8, vocab_size)
        for i, (r, n) in enumerate(zip(rows, prompt_len)):
            assert torch.allclose(stepped[i, 5 - n:], model(torch.tensor([r]))[0], atol=1e-5)
    with pytest.raises(ValueError, match=re.escape("attention_mask must be shaped (batch, tokens so far) = (3, 9)")):
        model(ids[:, :1], kv_caches=caches, attention_mask=mask)  # 8 cached + 1 new need 9 columns


def test_the_model_passes_padding_may_attend_to_every_block(monkeypatch):
    seen = []
    model = small_model()
    for i, block in enumerate(model.trf_blocks):
        original = block.forward
        monkeypatch.setattr(block, "forward", lambda x, kv_cache=None, may_attend=None, positions=None, _f=original:
                            seen.append(may_attend) or _f(x, kv_cache, may_attend, positions))
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    model(torch.tensor([[0, 5, 6], [7, 8, 9]]), attention_mask=mask)
    assert len(seen) == SMALL.n_layers and all(torch.equal(m, padding_may_attend(mask, 3)) for m in seen)
    seen.clear()
    model(torch.tensor([[7, 8, 9]]))
    assert seen == [None] * SMALL.n_layers  # no mask: the blocks keep SDPA's causal flag


def test_gpt_model_from_its_own_module_is_the_complete_class():
    """`from course_lib.model import GPTModel` alone, in a fresh interpreter, imports no later lesson (the package's
    __init__ imports nothing for a side effect, and no later module replaces the method): notebook 07's class
    itself takes kv_caches, last_only and attention_mask, and runs a cached, padded forward."""
    code = """
import inspect, sys, torch
from course_lib.model import GPTModel
from course_lib.config import GPTConfig
later = [name for name in ("course_lib.generation", "course_lib.decoding", "course_lib.modern") if name in sys.modules]
assert not later, later
assert "forward" in GPTModel.__dict__ and "new_kv_caches" in GPTModel.__dict__
assert list(inspect.signature(GPTModel.forward).parameters) == ["self", "token_ids", "kv_caches", "last_only",
                                                                "attention_mask"], inspect.signature(GPTModel.forward)
model = GPTModel(GPTConfig(vocab_size=50, context_length=8, emb_dim=8, n_heads=2, n_layers=1, drop_rate=0.0)).eval()
ids, mask = torch.tensor([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
with torch.no_grad():
    padded = model(ids, attention_mask=mask)
    assert torch.allclose(padded[0, 1:], model(torch.tensor([[5, 6]]))[0], atol=1e-5)
    assert model(ids, kv_caches=model.new_kv_caches(), last_only=True, attention_mask=mask).shape == (2, 1, 50)
    caches = model.new_kv_caches()  # a cached, padded batch: the prompt, then one token
    model(ids, kv_caches=caches, attention_mask=mask)
    step = model(torch.tensor([[4], [3]]), kv_caches=caches, attention_mask=torch.cat([mask, torch.ones(2, 1)], 1).long())
    full = model(torch.tensor([[0, 5, 6, 4], [7, 8, 9, 3]]), attention_mask=torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))
    assert torch.allclose(step[:, -1], full[:, -1], atol=1e-5)
later = [name for name in ("course_lib.generation", "course_lib.decoding", "course_lib.modern") if name in sys.modules]
assert not later, later
print("complete")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "complete", done.stderr[-2000:]


def test_the_forward_runs_as_one_compiled_graph_in_training_and_in_cached_decoding():
    """Nothing in GPTModel's forward reads a tensor back to the host under torch.compile (a graph break there is a
    host synchronisation on a GPU): one graph for a training forward and for each cached decoding step, with the
    growing cache of notebook 05 and the static one of notebook 08. Outside compile, on the CPU, the model still
    reads the ids and names one outside the vocabulary (test_bad_token_ids_are_refused_at_the_model_door)."""
    from course_lib.generation import StaticKVCache

    model = small_model(tie_weights=True)
    ids = torch.randint(0, SMALL.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    for mode in (model.train, model.eval):
        mode()
        explained = torch._dynamo.explain(model)(ids)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), [r.reason for r in explained.break_reasons]
    for cache_type in (KVCache, lambda: StaticKVCache(SMALL.context_length)):
        caches = [cache_type() for _ in range(SMALL.n_layers)]
        model(ids, kv_caches=caches)  # the prompt
        for step in range(3):  # then one token at a time, each step its own explanation
            explained = torch._dynamo.explain(model)(ids[:, step:step + 1], kv_caches=caches, last_only=True)
            assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from course_lib.attention import KVCache
from course_lib.config import GPT2_CONFIGS, GPTConfig
from course_lib.model import GPTModel, trace_shapes

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
    with pytest.raises(ValueError, match=r"start_pos 16 \+ 1 tokens need positions 16..16 but context_length is 16"):
        model(ids[:, :1], caches)


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


def test_trace_shapes_rejects_bad_arguments():
    model = small_model()
    ids = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(TypeError, match=r"^model must be a Module, got str: pass a GPTModel"):
        trace_shapes("gpt2", ids)
    for bad in (0, -1):
        with pytest.raises(ValueError, match=rf"^max_depth must be >= 1, got {bad}$"):
            trace_shapes(model, ids, max_depth=bad)
    for bad in (1.5, True):
        with pytest.raises(TypeError, match=rf"^max_depth must be an int, got {bad}"):
            trace_shapes(model, ids, max_depth=bad)


def test_bad_constructor_arguments():
    with pytest.raises(TypeError, match=r"cfg must be a GPTConfig, got dict"):
        GPTModel({"emb_dim": 768})
    with pytest.raises(TypeError, match=r"takes 2 positional arguments"):  # tying is the config's business
        GPTModel(SMALL, True)


def test_the_head_is_tied_by_default_as_in_gpt2():
    assert GPTConfig().tie_weights is True
    model = GPTModel(SMALL)
    assert model.out_head.weight is model.embedding.tok_emb.weight


def test_bad_kv_caches_and_last_only():
    model = small_model()
    ids = torch.zeros(1, 3, dtype=torch.long)
    fix = r"^kv_caches must be None or the list from model.new_kv_caches\(\): one KVCache per block \(2\), "
    with pytest.raises(ValueError, match=fix + r"all holding the same number of tokens; got KVCache$"):
        model(ids, KVCache())
    with pytest.raises(ValueError, match=fix + r".*got \['KVCache\(0\)'\]$"):
        model(ids, [KVCache()])
    with pytest.raises(ValueError, match=fix + r".*got \['KVCache\(0\)', 'NoneType'\]$"):
        model(ids, [KVCache(), None])
    caches = model.new_kv_caches()
    model(ids, caches)
    caches[1] = KVCache()
    with pytest.raises(ValueError, match=fix + r".*got \['KVCache\(3\)', 'KVCache\(0\)'\]$"):
        model(ids, caches)
    with pytest.raises(TypeError, match=r"last_only must be True or False, got 'no'"):
        model(ids, last_only="no")


def test_bad_token_ids_are_caught_by_the_embedding():
    model = small_model()
    with pytest.raises(ValueError, match=r"token id 500 >= vocab_size 500"):
        model(torch.tensor([[1, 500]]))
    with pytest.raises(ValueError, match=r"token_ids must be 2-D \(batch, tokens\)"):
        model(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"crop the input to the last 16 tokens"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_a_left_padded_batch_gives_each_row_its_own_logits():
    torch.manual_seed(0)
    model = GPTModel(GPTConfig(vocab_size=50, context_length=16, emb_dim=32, n_heads=4, n_layers=2,
                               drop_rate=0.0)).eval()
    rows = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
    ids = torch.tensor([[0] * (5 - len(r)) + r for r in rows])  # (3, 5), padded on the left with id 0
    mask = torch.tensor([[0] * (5 - len(r)) + [1] * len(r) for r in rows])
    assert GPTModel.positions_after_padding(mask, ids, 0).tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 0, 1],
                                                                       [0, 0, 0, 1, 2]]
    with torch.no_grad():
        padded = model(ids, attention_mask=mask)
        for i, r in enumerate(rows):
            assert torch.allclose(padded[i, 5 - len(r):], model(torch.tensor([r]))[0], atol=1e-5)
        assert not torch.allclose(model(ids)[1, 3:], model(torch.tensor([rows[1]]))[0], atol=1e-3)  # no mask: wrong


def test_the_forward_runs_as_one_compiled_graph_in_training_and_in_cached_decoding():
    """Nothing in GPTModel's forward reads a tensor back to the host under torch.compile (a graph break there is a
    host synchronisation on a GPU): one graph for a training forward and for each cached decoding step, with the
    growing cache of notebook 05 and the static one of notebook 08. Outside compile, on the CPU, the model still
    reads the ids and names one outside the vocabulary (test_bad_token_ids_are_caught_by_the_embedding)."""
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

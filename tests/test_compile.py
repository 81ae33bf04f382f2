"""Nothing in the model's forward makes a GPU wait or breaks a compiled graph (issue 29, item 6).

The model checks its token ids at the door, and reads their values only where that is free (a CPU tensor, outside
torch.compile); the layers behind the door check nothing per call. So torch.compile sees one graph per forward,
and compiled cached decoding does not compile a new graph for every token: the cache length is a shape that
dynamo marks dynamic after the first change, not a Python number it specialises on. (That the forward is one graph,
with no break, in training and in cached decoding: tests/test_model.py, test_the_forward_runs_as_one_compiled_graph_...)"""

import pytest
import torch
import torch._dynamo

from course_lib.config import GPTConfig
from course_lib.generation import StaticKVCache
from course_lib.model import GPTModel

CFG = GPTConfig(vocab_size=100, context_length=64, emb_dim=32, n_heads=2, n_layers=2, drop_rate=0.0)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPTModel(CFG).eval()


def caches_of(kind, model):
    return [StaticKVCache(CFG.context_length) for _ in model.trf_blocks] if kind == "static" else model.new_kv_caches()


@pytest.mark.parametrize("kind", ["static", "growing"])
def test_compiled_cached_decoding_does_not_recompile_at_every_token(model, kind):
    """26 calls (a prompt, then 25 single tokens) compile at most 3 graphs: the prompt, the first token (static
    shapes) and one graph with a dynamic cache length for every later token; the logits equal eager mode's."""
    torch._dynamo.reset()
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    compiled = torch.compile(model, backend=counting_backend)
    ids = torch.randint(0, CFG.vocab_size, (1, 30))
    compiled_caches, eager_caches = caches_of(kind, model), caches_of(kind, model)
    with torch.no_grad():
        for start, end in [(0, 5)] + [(t, t + 1) for t in range(5, 30)]:
            got = compiled(ids[:, start:end], kv_caches=compiled_caches, last_only=True)
            expected = model(ids[:, start:end], kv_caches=eager_caches, last_only=True)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert len(graphs) <= 3, f"{len(graphs)} graphs for 26 calls"
    torch._dynamo.reset()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_forward_never_synchronises_on_a_gpu():
    """Training forward, cached decoding and a padded batch on CUDA under set_sync_debug_mode('error'): any
    host-device synchronisation (an .item(), a bool() of a tensor) would raise."""
    torch.manual_seed(0)
    gpu_model = GPTModel(CFG).cuda().eval()
    ids = torch.randint(0, CFG.vocab_size, (2, 12), device="cuda")
    caches = [StaticKVCache(CFG.context_length) for _ in gpu_model.trf_blocks]
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.no_grad():
            gpu_model(ids)
            gpu_model(ids[:, :8], kv_caches=caches)
            gpu_model(ids[:, 8:9], kv_caches=caches, last_only=True)
            mask = torch.ones_like(ids)
            mask[1, :3] = 0  # a left-padded batch: the mask's values are read at stream_tokens' door, not here
            gpu_model(ids, attention_mask=mask)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_the_fixed_shape_decoding_step_compiles_as_one_graph(model):
    """GraphedGreedyDecoder(compile=True) compiles its step with fullgraph=True (a break would raise) and gives
    generate's greedy tokens; the position lives on the device, so later tokens reuse the graph."""
    from course_lib.generation import GraphedGreedyDecoder, generate
    torch._dynamo.reset()
    ids = torch.randint(0, CFG.vocab_size, (1, 4), generator=torch.Generator().manual_seed(3))
    decoder = GraphedGreedyDecoder(model, capacity=24, compile=True)
    assert torch.equal(decoder.generate(ids, 20), generate(model, ids, 20))
    assert torch.equal(decoder.generate(ids[:, :2], 10), generate(model, ids[:, :2], 10))


def test_the_training_loss_compiles_as_one_graph():
    """The pretraining loop compiles the forward pass and the loss together (issue 31): with fullgraph=True a graph
    break would raise; the padded vocabulary's slice is inside the graph, and the loss equals eager mode's."""
    from functools import partial

    from course_lib.distributed import padded_gpt, real_vocab
    from course_lib.training import batch_loss
    torch._dynamo.reset()
    model = padded_gpt(CFG, vocab_multiple=64)  # 100 tokens -> 128 rows
    loss_fn = partial(batch_loss, real_vocab(model, CFG.vocab_size))
    ids = torch.randint(0, CFG.vocab_size, (2, 17), generator=torch.Generator().manual_seed(4))
    compiled = torch.compile(loss_fn, fullgraph=True)(ids[:, :-1], ids[:, 1:])
    assert torch.allclose(compiled, loss_fn(ids[:, :-1], ids[:, 1:]), atol=1e-5)
    compiled.backward()
    assert model.out_head.weight.grad[CFG.vocab_size:].abs().max() == 0  # the padding rows get no gradient

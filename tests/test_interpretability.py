"""Notebook 12's hooks, scores, logit lens, attribution and the TransformerLens bridge."""

import pytest
import torch

from course_lib.config import GPTConfig
from course_lib.interpretability import (
    NoFeedForward,
    SecondOrderChain,
    attention_only,
    first_token_score,
    head_logit_attribution,
    hook_points,
    induction_score,
    logit_lens,
    previous_token_score,
    repeated_passages,
    run_with_cache,
    run_with_patches,
    to_transformer_lens,
)
from course_lib.model import GPTModel
from course_lib.pretrained import load_shakespeare_gpt

CFG = GPTConfig(vocab_size=37, context_length=16, emb_dim=24, n_heads=3, n_layers=2, drop_rate=0.0)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = GPTModel(CFG).eval()
    return model, torch.randint(0, CFG.vocab_size, (2, 11))


def test_every_block_has_its_hook_points(tiny):
    model, _ = tiny
    names = hook_points(model)
    assert len(names) == 2 + 7 * CFG.n_layers
    assert {"embed", "final_norm", "blocks.1.attn.z", "blocks.1.resid_post"} <= set(names)


def test_the_cache_reproduces_the_logits_and_the_attention(tiny):
    model, ids = tiny
    logits, cache = run_with_cache(model, ids)
    assert torch.equal(logits, model(ids).detach())
    assert torch.equal(model.out_head(model.final_norm(cache["blocks.1.resid_post"])), logits)
    assert torch.equal(cache["final_norm"], model.final_norm(cache["blocks.1.resid_post"]))
    # the stream adds up: resid_mid = resid_pre + attn_out, resid_post = resid_mid + mlp_out
    assert torch.allclose(cache["blocks.0.resid_mid"], cache["blocks.0.resid_pre"] + cache["blocks.0.attn_out"])
    assert torch.allclose(cache["blocks.0.resid_post"], cache["blocks.0.resid_mid"] + cache["blocks.0.mlp_out"])
    assert torch.equal(cache["blocks.0.resid_pre"], cache["embed"])
    pattern = cache["blocks.1.attn.pattern"]
    assert pattern.shape == (2, 3, 11, 11)
    assert torch.equal(pattern, model.trf_blocks[1].att.attention_weights(model.trf_blocks[1].norm1(
        cache["blocks.1.resid_pre"])))
    assert torch.allclose(pattern.sum(-1), torch.ones(2, 3, 11)) and (pattern.triu(1) == 0).all()
    assert cache["blocks.0.attn.z"].shape == (2, 11, 3, 8)
    _, some = run_with_cache(model, ids, names=["embed"])
    assert list(some) == ["embed"]


def test_patches_replace_activations(tiny):
    model, ids = tiny
    logits = model(ids).detach()
    assert torch.equal(run_with_patches(model, ids, {"blocks.0.attn.z": lambda z: z}), logits)

    def zero_head(z):
        z = z.clone()
        z[:, :, 1] = 0.0
        return z
    patched = run_with_patches(model, ids, {"blocks.0.attn.z": zero_head})
    att = model.trf_blocks[0].att
    handle = att.out_proj.register_forward_pre_hook(lambda m, a: (a[0].index_fill(-1, torch.arange(8, 16), 0.0),))
    try:
        expected = model(ids).detach()
    finally:
        handle.remove()
    assert torch.allclose(patched, expected, atol=1e-6) and not torch.allclose(patched, logits)
    # replacing the whole stream after block 0 by the cache of another input gives that input's logits
    other = torch.randint(0, CFG.vocab_size, (2, 11))
    _, other_cache = run_with_cache(model, other)
    swapped = run_with_patches(model, ids, {"blocks.1.resid_pre": lambda x: other_cache["blocks.1.resid_pre"]})
    assert torch.allclose(swapped, model(other).detach(), atol=1e-6)


def test_bad_names_and_patches_are_refused_and_hooks_never_stay(tiny):
    model, ids = tiny
    with pytest.raises(ValueError, match=r"no hook point named \['blocks.5.resid_post'\]"):
        run_with_cache(model, ids, names=["blocks.5.resid_post"])
    with pytest.raises(ValueError, match=r"patches\['blocks.0.attn_out'\] returned torch.Size\(\[2, 11\]\), not a "
                                         r"tensor of the activation's shape torch.Size\(\[2, 11, 24\]\), dtype "
                                         r"torch.float32 and device cpu"):
        run_with_patches(model, ids, {"blocks.0.attn_out": lambda x: x[..., 0]})
    with pytest.raises(ValueError, match="attn.pattern can be recorded but not patched"):
        run_with_patches(model, ids, {"blocks.0.attn.pattern": lambda p: p})
    with pytest.raises(TypeError, match=r"patches must be a dict \{hook point name: function\(activation\) -> new "
                                        r"activation\}, got \[\('blocks.0.attn_out', "):  # a list, not a dict
        run_with_patches(model, ids, [("blocks.0.attn_out", lambda x: x)])
    modules = list(model.modules())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in modules)


def test_scores_on_patterns_built_by_hand():
    tokens, period = 10, 4
    previous = torch.zeros(1, 2, tokens, tokens)
    previous[0, :, 0, 0] = 1.0
    previous[0, :, torch.arange(1, tokens), torch.arange(tokens - 1)] = 1.0
    assert torch.equal(previous_token_score(previous), torch.ones(2))
    first = torch.zeros(1, 1, tokens, tokens)
    first[..., 0] = 1.0
    assert torch.equal(first_token_score(first), torch.ones(1)) and previous_token_score(first).item() < 0.2
    induction = torch.zeros(3, 1, tokens, tokens)
    induction[:, 0, :period, 0] = 1.0  # the first copy has no earlier occurrence: its rows rest on position 0
    queries = torch.arange(period, tokens)
    induction[:, 0, queries, queries - period + 1] = 1.0
    assert torch.equal(induction_score(induction, period), torch.ones(1))
    assert induction_score(previous, period).max() == 0.0
    with pytest.raises(ValueError, match="period 6: the pattern covers 10 tokens, not two copies of the repeat"):
        induction_score(induction, 6)
    with pytest.raises(ValueError, match="period must be >= 1, got 0"):
        induction_score(induction, 0)


def test_logit_lens_ends_at_the_model_prediction(tiny):
    model, ids = tiny
    logits, cache = run_with_cache(model, ids)
    targets = torch.randint(0, CFG.vocab_size, ids.shape)
    probs, ranks = logit_lens(model, cache, targets)
    assert probs.shape == ranks.shape == (1 + CFG.n_layers, 2, 11)
    assert torch.allclose(probs[-1], logits.softmax(-1).gather(-1, targets[..., None])[..., 0])
    assert torch.equal(ranks[-1], (logits > logits.gather(-1, targets[..., None])).sum(-1))
    with pytest.raises(KeyError, match="blocks.0.resid_post"):  # Python's own error names the missing activation
        logit_lens(model, {"embed": cache["embed"]}, targets)


def test_head_attribution_and_the_other_terms_add_up_to_the_logit(tiny):
    model, ids = tiny
    with torch.no_grad():  # a final norm that is not the identity
        model.final_norm.scale.uniform_(0.5, 2.0)
        model.final_norm.shift.normal_()
    logits, cache = run_with_cache(model, ids)
    targets = torch.randint(0, CFG.vocab_size, ids.shape)
    dla = head_logit_attribution(model, cache, targets)
    assert dla.shape == (CFG.n_layers, CFG.n_heads, 2, 11)
    norm, stream = model.final_norm, cache["blocks.1.resid_post"]
    scale = (stream.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    directions = model.out_head.weight[targets] * norm.scale

    def direct(term):
        return (((term - term.mean(-1, keepdim=True)) / scale) * directions).sum(-1)
    total = dla.sum(dim=(0, 1)) + direct(cache["embed"]) + (model.out_head.weight[targets] * norm.shift).sum(-1)
    for i, block in enumerate(model.trf_blocks):
        total = total + direct(block.att.out_proj.bias.expand_as(stream)) + direct(cache[f"blocks.{i}.mlp_out"])
    assert torch.allclose(total.detach(), logits.gather(-1, targets[..., None])[..., 0], atol=1e-4)


def test_the_transformer_lens_bridge_computes_what_our_model_computes():
    model, tokenizer = load_shakespeare_gpt("cpu")
    text = "JULIET:\nO Romeo, Romeo, wherefore art thou Romeo?"
    ids = torch.tensor([tokenizer.encode(text)])
    bridge = to_transformer_lens(model, tokenizer)
    logits, cache = run_with_cache(model, ids)
    with torch.no_grad():
        theirs, their_cache = bridge.run_with_cache(ids)
    assert (theirs - logits).abs().max() < 1e-4
    for i in range(len(model.trf_blocks)):
        assert (their_cache[f"blocks.{i}.attn.hook_pattern"] - cache[f"blocks.{i}.attn.pattern"]).abs().max() < 1e-5
    assert torch.equal(bridge.to_tokens(text), ids)
    assert bridge.to_string(ids[0]) == text


def test_the_bridge_takes_gpt2_vocabulary_models_without_a_tokenizer_and_refuses_mismatches():
    torch.manual_seed(0)
    gpt2_like = GPTModel(GPTConfig(emb_dim=32, n_heads=2, n_layers=1, context_length=16, drop_rate=0.0)).eval()
    ids = torch.randint(0, 50257, (1, 7))
    bridge = to_transformer_lens(gpt2_like)
    with torch.no_grad():
        assert (bridge(ids) - gpt2_like(ids)).abs().max() < 1e-4
    char_model, tokenizer = load_shakespeare_gpt("cpu")
    with pytest.raises(ValueError, match="tokenizer: it has 50257 token ids, the model 65: pass the CharTokenizer"):
        to_transformer_lens(char_model)
    with pytest.raises(ValueError, match="tokenizer: it has 65 token ids, the model 50257"):
        to_transformer_lens(gpt2_like, tokenizer)
    with pytest.raises(TypeError, match="tokenizer"):
        to_transformer_lens(char_model, "abc")
    with pytest.raises(TypeError, match="model"):
        to_transformer_lens(bridge, tokenizer)


def test_attention_only_leaves_the_stream_to_the_heads():
    torch.manual_seed(0)
    model = attention_only(GPTModel(CFG)).eval()
    assert all(isinstance(block.ff, NoFeedForward) for block in model.trf_blocks)
    ids = torch.randint(0, CFG.vocab_size, (2, 9))
    logits, cache = run_with_cache(model, ids)
    for i in range(CFG.n_layers):
        assert torch.equal(cache[f"blocks.{i}.mlp_out"], torch.zeros(2, 9, CFG.emb_dim))
        assert torch.equal(cache[f"blocks.{i}.resid_post"], cache[f"blocks.{i}.resid_mid"])
    assert torch.equal(model.out_head(model.final_norm(cache["blocks.1.resid_post"])), logits)
    with pytest.raises(TypeError, match="model must be a GPTModel, got Linear"):
        attention_only(torch.nn.Linear(2, 2))


def test_the_chain_draws_each_token_from_the_two_before_it():
    chain = SecondOrderChain(vocab_size=11, strength=1000.0, seed=4)  # every draw is the argmax (gaps >= 29)
    ids = chain.sample(8, 20, torch.Generator().manual_seed(0))
    assert ids.shape == (8, 20) and ids.dtype == torch.long and 0 <= ids.min() and ids.max() < 11
    expected = (chain.after_one[ids[:, 1:-1]] + chain.after_two[ids[:, :-2]]).argmax(-1)  # (8, 18)
    assert torch.equal(ids[:, 2:], expected)
    again = chain.sample(8, 20, torch.Generator().manual_seed(0))
    assert torch.equal(ids, again), "the same generator state gives the same passages"
    uniform = SecondOrderChain(vocab_size=11, strength=0.0).sample(2000, 3, torch.Generator().manual_seed(1))
    counts = torch.bincount(uniform[:, 2], minlength=11).float()
    assert counts.min() > 120 and counts.max() < 250, "strength 0: every token equally likely (mean 182)"


@pytest.mark.parametrize("kwargs, error, match", [
    ({"vocab_size": 1}, ValueError, "vocab_size must be >= 2"),
    ({"vocab_size": 8, "strength": -1.0}, ValueError, "strength must be in"),
    ({"vocab_size": 8.0}, TypeError, "vocab_size must be an int"),
])
def test_the_chain_refuses_bad_settings(kwargs, error, match):
    with pytest.raises(error, match=match):
        SecondOrderChain(**kwargs)


def test_repeated_passages_repeat_one_passage_per_row():
    chain = SecondOrderChain(vocab_size=64, seed=0)
    generator = torch.Generator().manual_seed(5)
    periods_seen = set()
    for _ in range(20):
        rows = repeated_passages(chain, 4, 32, range(6, 17), generator)
        assert rows.shape == (4, 32)
        period = next(p for p in range(6, 17) if torch.equal(rows[:, p:], rows[:, :-p]))
        periods_seen.add(period)
    assert len(periods_seen) > 3, "the length is drawn anew for each batch"
    for periods, match in [(range(6, 20), "fit twice into context_length=32"), (range(0), r"range\(0, 0\) must be "),
                           (range(4), "lengths >= 1")]:
        with pytest.raises(ValueError, match=match):
            repeated_passages(chain, 4, 32, periods, generator)
    assert repeated_passages(chain, 4, 32, [6, 7], generator).shape == (4, 32)  # any sequence of lengths
    with pytest.raises(TypeError, match=r"periods must be a range or list of passage lengths \(ints\), got \{6, 7\}"):
        repeated_passages(chain, 4, 32, {6, 7}, generator)

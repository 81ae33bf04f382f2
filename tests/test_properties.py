"""Properties that must hold for every input, checked by Hypothesis on inputs it generates (and shrinks to the
smallest failing one): the tokenizers give back any text they encode, and generation with the KV cache gives
the same tokens as without it, for random small models and prompts."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course_lib.config import GPTConfig
from course_lib.generation import generate
from course_lib.model import GPTModel
from course_lib.tokenization import BPETokenizer, CharTokenizer, gpt2_merges, gpt2_tokenizer, train_bpe

# any Unicode: accents, CJK, emoji, lone combining marks, control characters. derandomize=True: the same
# examples on every run, so CI is reproducible; change the settings locally to explore further.
TEXT = st.text(max_size=60)
FIXED = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tokenizers():
    return {"gpt2 (tiktoken)": gpt2_tokenizer(), "gpt2 (from scratch)": BPETokenizer(gpt2_merges()),
            "small BPE": BPETokenizer(train_bpe("the cat sat on the mat; the dog ate the hat " * 4, 20))}


@settings(max_examples=200, **FIXED)
@given(text=TEXT)
def test_bpe_tokenizers_round_trip_any_unicode(tokenizers, text):
    for name, tokenizer in tokenizers.items():
        assert tokenizer.decode(tokenizer.encode(text)) == text, name


@settings(max_examples=200, **FIXED)
@given(text=TEXT)
def test_the_scratch_bpe_cuts_text_into_the_pieces_tiktoken_does(tokenizers, text):
    ours, theirs = tokenizers["gpt2 (from scratch)"], tokenizers["gpt2 (tiktoken)"]
    ours_ids, their_ids = ours.encode(text), theirs.encode(text)
    assert [ours.vocab[i] for i in ours_ids] == [theirs.decode_single_token_bytes(i) for i in their_ids]
    assert all(a == b for a, b in zip(ours_ids, their_ids) if a >= 256), "merged tokens share their ids"


@settings(max_examples=100, **FIXED)
@given(text=st.text(min_size=1, max_size=60))
def test_a_char_tokenizer_round_trips_the_text_it_was_built_from(text):
    tokenizer = CharTokenizer.from_text(text)
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text and max(ids) < tokenizer.vocab_size


@st.composite
def model_and_prompt(draw):
    n_heads = draw(st.sampled_from([1, 2, 4]))
    cfg = GPTConfig(vocab_size=draw(st.integers(2, 40)), context_length=draw(st.integers(2, 12)),
                    emb_dim=n_heads * draw(st.sampled_from([2, 4, 8])), n_heads=n_heads,
                    n_layers=draw(st.integers(1, 3)), drop_rate=draw(st.sampled_from([0.0, 0.1])),
                    qkv_bias=draw(st.booleans()), tie_weights=draw(st.booleans()))
    batch, tokens = draw(st.integers(1, 3)), draw(st.integers(1, cfg.context_length))
    prompt = draw(st.lists(st.integers(0, cfg.vocab_size - 1), min_size=batch * tokens, max_size=batch * tokens))
    return cfg, torch.tensor(prompt).view(batch, tokens), draw(st.integers(0, 2**16))


@settings(max_examples=60, **FIXED)
@given(case=model_and_prompt(), max_new_tokens=st.integers(0, 20), crop=st.booleans())
def test_the_kv_cache_never_changes_the_tokens(case, max_new_tokens, crop):
    cfg, prompt, seed = case
    torch.manual_seed(seed)
    model = GPTModel(cfg).double().train()  # train mode on purpose: generate must switch dropout off itself
    context_length = cfg.context_length if crop else None
    if not crop and prompt.shape[1] + max_new_tokens > cfg.context_length:
        max_new_tokens = cfg.context_length - prompt.shape[1]  # without cropping the context is the limit
    for sampling in ({}, {"temperature": 0.9, "top_k": 5, "top_p": 0.95}):
        runs = [generate(model, prompt, max_new_tokens, context_length, use_cache=use_cache,
                         generator=torch.Generator().manual_seed(seed), **sampling) for use_cache in (True, False)]
        assert torch.equal(runs[0], runs[1]), sampling
    assert model.training, "the model's mode is restored"

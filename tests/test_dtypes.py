"""The dtype matrix: every layer of the model, the model and generate in float32, float64, float16 and bfloat16
(and float32 weights under CPU autocast to bfloat16), each against the same layer in float64. The output keeps
the input's dtype; the numbers agree within a tolerance that fits the dtype's precision; a failure names the
dtype and the layer."""

import pytest
import torch

from course_lib.attention import MultiHeadAttention
from course_lib.block import TransformerBlock
from course_lib.config import GPTConfig
from course_lib.embeddings import GPTEmbedding
from course_lib.feedforward import FeedForward
from course_lib.generation import generate
from course_lib.model import GPTModel
from course_lib.normalization import LayerNorm

CFG = GPTConfig(vocab_size=97, context_length=16, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0)
# largest difference from float64, relative to the largest output: a few units of each dtype's precision
# (float16 has 11 significant bits, bfloat16 8) accumulated over the layers
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 1e-2, torch.bfloat16: 6e-2}
DTYPES = list(TOLERANCE)
IDS = torch.randint(0, CFG.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))  # (batch, tokens)


def vectors(shape=(2, 11, CFG.emb_dim)):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x[0, 0] *= 300  # |x| >= 256: where float16 sums of squares overflow if computed in float16
    return x


LAYERS = {  # name -> (build the layer, its input in float64; ids stay ids)
    "GPTEmbedding": (lambda: GPTEmbedding(CFG), lambda: IDS),
    "LayerNorm": (lambda: LayerNorm(CFG.emb_dim), vectors),
    "FeedForward": (lambda: FeedForward(CFG), lambda: vectors() / 300),
    "MultiHeadAttention": (lambda: MultiHeadAttention(CFG), lambda: vectors() / 300),
    "TransformerBlock": (lambda: TransformerBlock(CFG), vectors),
    "GPTModel": (lambda: GPTModel(CFG), lambda: IDS),
}


def reference_and_copy(build, dtype):
    torch.manual_seed(0)
    reference = build().double().eval()
    layer = build().eval()
    layer.load_state_dict(reference.state_dict())
    return reference, layer.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d).removeprefix("torch.") for d in DTYPES])
@pytest.mark.parametrize("name", LAYERS)
def test_each_layer_in_each_dtype_matches_float64(name, dtype):
    build, make_input = LAYERS[name]
    reference, layer = reference_and_copy(build, dtype)
    x = make_input()
    with torch.no_grad():
        expected = reference(x)
        got = layer(x if not x.is_floating_point() else x.to(dtype))
    assert got.dtype == dtype, f"{name} in {dtype} returned {got.dtype}"
    assert torch.isfinite(got).all(), f"{name} in {dtype} produced inf or NaN"
    error = ((got.double() - expected).abs().max() / expected.abs().max()).item()
    assert error < TOLERANCE[dtype], f"{name} in {dtype}: relative error {error:.2e} > {TOLERANCE[dtype]:.0e}"


@pytest.mark.parametrize("name", ["LayerNorm", "TransformerBlock", "GPTModel"])
def test_float32_weights_under_cpu_autocast_to_bfloat16(name):
    build, make_input = LAYERS[name]
    reference, layer = reference_and_copy(build, torch.float32)
    x = make_input()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = layer(x if not x.is_floating_point() else x.float())
    with torch.no_grad():
        expected = reference(x)
    assert torch.isfinite(got).all()
    error = ((got.double() - expected).abs().max() / expected.abs().max()).item()
    assert error < TOLERANCE[torch.bfloat16], f"{name} under autocast: relative error {error:.2e}"


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d).removeprefix("torch.") for d in DTYPES])
def test_generate_in_each_dtype(dtype):
    reference, model = reference_and_copy(lambda: GPTModel(CFG), dtype)
    prompt = IDS[:, :4]
    greedy = generate(model, prompt, 8)
    if dtype in (torch.float32, torch.float64):  # half precision may flip a near tie; these may not
        assert torch.equal(greedy, generate(reference, prompt, 8))
    assert torch.equal(greedy, generate(model, prompt, 8, use_cache=False)), "the cache changes nothing"
    sampled = generate(model, prompt, 8, temperature=0.001, top_k=5, top_p=0.9,
                       generator=torch.Generator().manual_seed(0))  # a tiny temperature: logits / T overflow half
    assert sampled.shape == (2, 12) and 0 <= int(sampled.min()) and int(sampled.max()) < CFG.vocab_size
    with torch.no_grad():
        first = model(prompt, last_only=True)[:, -1, :].float().argmax(dim=-1)
    assert torch.equal(sampled[:, 4], first), "at T = 0.001 sampling picks the argmax"


def test_layernorm_with_float32_parameters_on_large_float16_input():  # issue 14, item 1: was all zeros
    x = torch.tensor([[300.0, -300.0, 300.0, -300.0]]).half()  # x**2 = 90,000 > float16's largest, 65,504
    got = LayerNorm(4)(x)
    assert got.dtype == torch.float16
    assert torch.equal(got, torch.nn.LayerNorm(4)(x)) and torch.equal(got, torch.tensor([[1.0, -1, 1, -1]]).half())


# The bfloat16 decoding path (issue 16): the course's trained model with weights and KV cache in bfloat16 and the
# choice of each token in float32, against the same model in float32, greedy, on the prompts the notebooks use.
SHIPPED_PROMPTS = ["HAMLET:\nTo be, or not to be", "JULIET:\nO Romeo, Romeo,", "ROMEO:\nBut soft",
                   "First Citizen:\nWe are", "KING HENRY VI:\n"]


@pytest.mark.parametrize("prompt", SHIPPED_PROMPTS)
def test_bfloat16_greedy_decoding_agrees_with_float32_or_diverges_only_at_a_near_tie(prompt):
    """bfloat16's logits stay within 0.125 of float32's along the whole float32 text; and the tokens are identical,
    or, at the first token where they differ, bfloat16's choice scores within twice that error of float32's best
    token (each of the two logits may move by the error, in opposite directions): a near-tie that rounding decides,
    not a broken path."""
    from course_lib.pretrained import load_shakespeare_gpt
    model, tokenizer = load_shakespeare_gpt("cpu")
    model_bf16 = GPTModel(model.cfg).to(torch.bfloat16).eval()
    model_bf16.load_state_dict(model.state_dict())  # the same weights, rounded to bfloat16
    prompt_ids = torch.tensor([tokenizer.encode(prompt)])
    new = 80
    in_float32 = generate(model, prompt_ids, new)
    in_bfloat16 = generate(model_bf16, prompt_ids, new)
    assert in_bfloat16.dtype == torch.long and in_bfloat16.shape == in_float32.shape
    with torch.no_grad():
        logits32 = model(in_float32[:, :-1])[0]  # (tokens - 1, vocab_size): the scores behind every next token
        logits16 = model_bf16(in_float32[:, :-1])[0].float()
    error = (logits32 - logits16).abs().amax(dim=-1)  # per position
    assert float(error.max()) < 0.125, f"bfloat16 moved a logit by {float(error.max()):.3f}: more than rounding explains"
    differ = (in_float32 != in_bfloat16)[0].nonzero()
    if len(differ) == 0:
        return
    first = int(differ[0])
    best, chosen = int(in_float32[0, first]), int(in_bfloat16[0, first])
    gap = float(logits32[first - 1, best] - logits32[first - 1, chosen])  # bfloat16's token, judged in float32
    assert 0 <= gap <= 2 * float(error[first - 1]), (
        f"at token {first - prompt_ids.shape[1]} bfloat16 chose {tokenizer.decode([chosen])!r}, {gap:.3f} below "
        f"float32's {tokenizer.decode([best])!r}: more than twice the logit error {float(error[first - 1]):.3f}")

import re

import pytest
import torch
import torch.nn.functional as F

from course_lib.config import GPTConfig
from course_lib.feedforward import GELU, FeedForward

SMALL = GPTConfig(vocab_size=100, context_length=16, emb_dim=32, n_heads=4, n_layers=2)


def wide_range(dtype: torch.dtype) -> torch.Tensor:
    """Dense values around zero, where the curve bends, plus very large ones where x**3 overflows."""
    extremes = torch.tensor([1e2, 1e4, 1e8, 1e13, 1e30, 3e38], dtype=torch.float64)
    if dtype == torch.float64:
        extremes = torch.cat([extremes, torch.tensor([1e100, 1e300], dtype=torch.float64)])
    return torch.cat([torch.linspace(-20, 20, 40001, dtype=dtype), extremes.to(dtype), -extremes.to(dtype)])


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_gelu_equals_torch_tanh_gelu(dtype, tol):
    x = wide_range(dtype)
    gelu = GELU()
    got, expected = gelu(x), F.gelu(x, approximate="tanh")
    assert got.dtype == dtype and got.shape == x.shape
    assert torch.isfinite(got).all()
    assert torch.allclose(got, expected, atol=tol, rtol=tol), (got - expected).abs().max()


def test_gelu_is_the_tanh_form_not_the_exact_one():
    x = torch.linspace(-6, 6, 1201, dtype=torch.float64)
    gelu = GELU()
    gap = (gelu(x) - F.gelu(x)).abs().max()
    assert 4e-4 < gap < 5e-4  # the tanh approximation's known error, not zero


def test_gelu_keeps_shape_and_passes_gradients():
    x = torch.randn(2, 3, 4, requires_grad=True)
    gelu = GELU()
    y = gelu(x)
    assert y.shape == (2, 3, 4)
    y.sum().backward()
    expected = torch.autograd.grad(F.gelu(x, approximate="tanh").sum(), x)[0]
    assert torch.allclose(x.grad, expected, atol=1e-6)


def test_gelu_forward_is_one_call_to_the_tanh_kernel(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.nn.functional, "gelu", lambda x, approximate: calls.append((x, approximate)) or x)
    x = torch.randn(3)
    GELU()(x)
    assert len(calls) == 1 and calls[0][0] is x and calls[0][1] == "tanh"


@pytest.mark.parametrize("x, error, message", [  # was: check_activations' message (issue 29: no per-call checks)
    (torch.arange(5), NotImplementedError, '"GeluKernelImpl" not implemented for \'Long\''),
    ([0.0, 1.0], TypeError, "gelu(): argument 'input' (position 1) must be Tensor, not list"),
])
def test_gelu_fails_loudly_on_non_float_input(x, error, message):
    with pytest.raises(error, match=re.escape(message)):
        GELU()(x)


@pytest.mark.parametrize("shape", [(2, 5, 32), (1, 1, 32), (32,), (3, 2, 4, 32)])
def test_feedforward_preserves_shape(shape):
    ffn = FeedForward(SMALL)
    x = torch.randn(shape)
    assert ffn(x).shape == shape


def test_feedforward_is_linear_gelu_linear_with_fixed_names():
    ffn = FeedForward(SMALL)
    d = SMALL.emb_dim
    assert [name for name, _ in ffn.named_parameters()] == ["fc.weight", "fc.bias", "proj.weight", "proj.bias"]
    assert ffn.fc.weight.shape == (4 * d, d) and ffn.proj.weight.shape == (d, 4 * d)
    assert isinstance(ffn.gelu, GELU)
    x = torch.randn(2, 3, d)
    manual = F.linear(F.gelu(F.linear(x, ffn.fc.weight, ffn.fc.bias), approximate="tanh"),
                      ffn.proj.weight, ffn.proj.bias)
    assert torch.allclose(ffn(x), manual, atol=1e-5)


@pytest.mark.parametrize("emb_dim", [32, 768])
def test_feedforward_parameter_count(emb_dim):
    ffn = FeedForward(GPTConfig(emb_dim=emb_dim, n_heads=4))
    assert sum(p.numel() for p in ffn.parameters()) == 8 * emb_dim**2 + 5 * emb_dim


def test_gpt2_small_feedforward_has_4_722_432_parameters():
    ffn = FeedForward(GPTConfig())
    assert sum(p.numel() for p in ffn.parameters()) == 4_722_432


def test_feedforward_works_token_by_token():
    ffn = FeedForward(SMALL)
    x = torch.randn(2, 6, SMALL.emb_dim)
    with torch.no_grad():
        assert torch.allclose(ffn(x)[:, 4], ffn(x[:, 4:5])[:, 0], atol=1e-6)


def test_gradient_flows_to_every_parameter_and_the_input():
    ffn = FeedForward(SMALL)
    x = torch.randn(2, 5, SMALL.emb_dim, requires_grad=True)
    ffn(x).pow(2).sum().backward()
    for name, p in ffn.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert x.grad is not None and x.grad.abs().sum() > 0


# --- bad arguments ------------------------------------------------------------------------------------------------
# Issue 29: FeedForward checks nothing (GPTModel checks its config and its token ids); bad input still fails loudly,
# in the first PyTorch call that cannot take it, and these tests keep the fragment of PyTorch's message that says why.

@pytest.mark.parametrize("cfg", [{"emb_dim": 32}, 32, None])
def test_feedforward_fails_loudly_without_a_gptconfig(cfg):
    # was: "cfg must be a GPTConfig"; GPTModel(cfg) still says it
    with pytest.raises(AttributeError, match=f"'{type(cfg).__name__}' object has no attribute 'emb_dim'"):
        FeedForward(cfg)


def test_feedforward_fails_loudly_on_a_wrong_width():
    with pytest.raises(RuntimeError, match=re.escape("mat1 and mat2 shapes cannot be multiplied (10x64 and 32x128)")):
        FeedForward(SMALL)(torch.randn(2, 5, 64))


def test_feedforward_fails_loudly_on_a_scalar():
    with pytest.raises(RuntimeError, match="both arguments to linear need to be at least 1D"):
        FeedForward(SMALL)(torch.tensor(1.0))


@pytest.mark.parametrize("x, error, message", [
    (torch.zeros(2, 5, 32, dtype=torch.long), RuntimeError,
     "mat1 and mat2 must have the same dtype, but got Long and Float"),
    ([[0.0] * 32], TypeError, "linear(): argument 'input' (position 1) must be Tensor, not list"),
])
def test_feedforward_fails_loudly_on_non_float_input(x, error, message):
    with pytest.raises(error, match=re.escape(message)):
        FeedForward(SMALL)(x)


def test_a_dtype_other_than_the_weights_is_refused_by_matmul_not_cast():
    # was: our TypeError before the matmul; the matmul's own refusal names both dtypes, and nothing is cast silently
    ff = FeedForward(GPTConfig(emb_dim=8, n_heads=2))
    with pytest.raises(RuntimeError, match="mat1 and mat2 must have the same dtype, but got Double and Float"):
        ff(torch.randn(2, 3, 8, dtype=torch.float64))
    assert ff.double()(torch.randn(2, 3, 8, dtype=torch.float64)).dtype == torch.float64

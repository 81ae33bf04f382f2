import re

import pytest
import torch
from torch import nn

from course_lib.normalization import LayerNorm

# Both modules run the same kernel, F.layer_norm, on the same parameters: the results are bit-identical.
# (Notebook 03 proves the kernel equal to the step-by-step formula, within 1e-6 in float64.)


def pair(emb_dim: int, dtype: torch.dtype, seed: int, eps: float = 1e-5) -> tuple[LayerNorm, nn.LayerNorm]:
    """Our LayerNorm and PyTorch's, sharing the same random (non-trivial) scale and shift."""
    generator = torch.Generator().manual_seed(seed)
    ours = LayerNorm(emb_dim, eps=eps).to(dtype)
    theirs = nn.LayerNorm(emb_dim, eps=eps).to(dtype)
    with torch.no_grad():
        ours.scale.copy_(torch.randn(emb_dim, generator=generator, dtype=dtype) * 2 + 1)
        ours.shift.copy_(torch.randn(emb_dim, generator=generator, dtype=dtype))
        theirs.weight.copy_(ours.scale)
        theirs.bias.copy_(ours.shift)
    return ours, theirs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(7,), (768,), (2, 5, 16), (3, 4, 768), (1, 1, 1)])
@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_equals_nn_layernorm(dtype, shape, eps):
    ours, theirs = pair(shape[-1], dtype, seed=sum(shape), eps=eps)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape)), dtype=dtype) * 3 + 0.5
    expected = theirs(x)
    got = ours(x)
    assert got.shape == x.shape and got.dtype == dtype
    assert torch.equal(got, expected), (got - expected).abs().max()


def test_gradients_equal_nn_layernorm():
    ours, theirs = pair(32, torch.float64, seed=1)
    x = torch.randn(4, 6, 32, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(4, 6, 32, dtype=torch.float64)
    (grad_ours,) = torch.autograd.grad((ours(x) * weights).sum(), x)
    (grad_theirs,) = torch.autograd.grad((theirs(x) * weights).sum(), x)
    assert torch.allclose(grad_ours, grad_theirs, atol=1e-10)
    (ours(x) * weights).sum().backward()
    (theirs(x) * weights).sum().backward()
    assert torch.allclose(ours.scale.grad, theirs.weight.grad, atol=1e-10)
    assert torch.allclose(ours.shift.grad, theirs.bias.grad, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_have_mean_zero_and_variance_one_before_scale_and_shift(dtype):
    ln = LayerNorm(64).to(dtype)  # scale = 1, shift = 0: the output is the normalised input
    x = torch.randn(3, 10, 64, dtype=dtype) * 5 + 7
    y = ln(x)
    assert torch.allclose(y.mean(dim=-1), torch.zeros(3, 10, dtype=dtype), atol=1e-5)
    var = y.var(dim=-1, unbiased=False)
    # eps makes the variance var / (var + eps), a hair below 1
    assert torch.allclose(var, torch.ones(3, 10, dtype=dtype), atol=1e-5)
    assert (var < 1).all()


def test_parameters_are_named_scale_and_shift_and_start_as_identity():
    ln = LayerNorm(5)
    assert [name for name, _ in ln.named_parameters()] == ["scale", "shift"]
    assert torch.equal(ln.scale, torch.ones(5)) and torch.equal(ln.shift, torch.zeros(5))


def test_constant_row_gives_shift_not_nan():
    ln = LayerNorm(4)
    y = ln(torch.full((2, 4), 3.0))
    assert torch.equal(y, torch.zeros(2, 4))


def test_one_example_does_not_depend_on_the_rest_of_the_batch():
    ln = LayerNorm(8)
    x = torch.randn(4, 8)
    other = torch.cat([x[:1], torch.randn(3, 8) * 10])
    assert torch.allclose(ln(x)[0], ln(other)[0])


def test_forward_is_one_call_to_the_kernel(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.nn.functional, "layer_norm", lambda *args: calls.append(args) or args[0])
    ln = LayerNorm(4, eps=1e-3)
    x = torch.randn(2, 4)
    LayerNorm.forward(ln, x)
    [(got_x, shape, scale, shift, eps)] = calls
    assert got_x is x and shape == (4,) and scale is ln.scale and shift is ln.shift and eps == 1e-3


def test_half_precision_input_with_float32_parameters_keeps_its_dtype_and_does_not_overflow():
    x = torch.tensor([[300.0, -300, 300, -300]]).half()  # its variance, 90,000, overflows float16
    got = LayerNorm(4)(x)
    assert got.dtype == torch.float16
    assert torch.equal(got, nn.LayerNorm(4)(x))
    assert torch.allclose(got.float(), torch.tensor([[1.0, -1, 1, -1]]), atol=1e-3)


# --- bad arguments ------------------------------------------------------------------------------------------------
# Issue 29: LayerNorm checks nothing, in its constructor or per call (GPTModel builds it from a checked GPTConfig and
# checks its token ids at its door). Bad sizes and inputs still fail loudly, with PyTorch's own message; eps values
# PyTorch takes without a word (0, negative, NaN, inf, True) are no longer tested here.

@pytest.mark.parametrize("emb_dim, error, message", [
    (-3, RuntimeError, "Trying to create tensor with negative dimension -3"),
    (4.0, TypeError, "ones(): argument 'size' (position 1) must be tuple of ints, not float"),
    ("4", TypeError, "must be tuple of ints, not str"),
    (True, TypeError, "must be tuple of ints, not bool"),
])
def test_a_bad_emb_dim_fails_loudly_in_the_constructor(emb_dim, error, message):
    with pytest.raises(error, match=re.escape(message)):
        LayerNorm(emb_dim)


def test_emb_dim_zero_fails_loudly_at_the_first_vector():
    with pytest.raises(RuntimeError, match=re.escape("Given normalized_shape=[0], expected input with shape [*, 0]")):
        LayerNorm(0)(torch.randn(2, 4))


@pytest.mark.parametrize("eps", ["1e-5", None])
def test_an_eps_that_is_not_a_number_fails_loudly(eps):
    with pytest.raises(TypeError, match=re.escape("layer_norm(): argument 'eps' (position 5) must be float, not ")):
        LayerNorm(4, eps=eps)(torch.randn(2, 4))


def test_wrong_last_dimension_names_both_sizes():
    # was our message; PyTorch's names both sizes too
    ln = LayerNorm(768)
    with pytest.raises(RuntimeError, match=re.escape("Given normalized_shape=[768], expected input with shape "
                                                     "[*, 768], but got input of size[2, 3, 512]")):
        ln(torch.randn(2, 3, 512))


def test_scalar_input_fails_loudly():
    with pytest.raises(RuntimeError, match=re.escape("Given normalized_shape=[1], expected input with shape [*, 1], "
                                                     "but got input of size[]")):
        LayerNorm(1)(torch.tensor(2.0))


@pytest.mark.parametrize("x, error, message", [
    (torch.arange(4), RuntimeError, "mixed dtype (CPU): all inputs must share same datatype"),
    ([1.0, 2.0, 3.0, 4.0], TypeError, "layer_norm(): argument 'input' (position 1) must be Tensor, not list"),
])
def test_non_float_input_fails_loudly(x, error, message):
    with pytest.raises(error, match=re.escape(message)):
        LayerNorm(4)(x)

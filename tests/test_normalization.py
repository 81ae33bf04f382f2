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


@pytest.mark.parametrize("emb_dim", [0, -3])
def test_emb_dim_must_be_positive(emb_dim):
    with pytest.raises(ValueError, match=f"^emb_dim must be >= 1, got {emb_dim}$"):
        LayerNorm(emb_dim)


@pytest.mark.parametrize("emb_dim", [4.0, "4", True])
def test_emb_dim_must_be_an_int(emb_dim):
    with pytest.raises(TypeError, match="emb_dim must be an int"):
        LayerNorm(emb_dim)


@pytest.mark.parametrize("eps", [0, -1e-5, float("nan"), float("inf")])
def test_eps_must_be_positive_and_finite(eps):
    with pytest.raises(ValueError, match=r"^eps must be in \(0, inf\), got .*: it keeps the division finite"):
        LayerNorm(4, eps=eps)


@pytest.mark.parametrize("eps", ["1e-5", None, True])
def test_eps_must_be_a_number(eps):
    with pytest.raises(TypeError, match="^eps must be a number, got "):
        LayerNorm(4, eps=eps)


def test_wrong_last_dimension_names_both_sizes():
    ln = LayerNorm(768)
    with pytest.raises(ValueError, match=r"^x must be shaped \(\.\.\., 768\), got shape \(2, 3, 512\): the layer "
                                         r"was built for vectors of 768 numbers$"):
        ln(torch.randn(2, 3, 512))


def test_scalar_input_is_rejected():
    with pytest.raises(ValueError, match=r"^x must be shaped \(\.\.\., 1\), got shape \(\)"):
        LayerNorm(1)(torch.tensor(2.0))


@pytest.mark.parametrize("x", [torch.arange(4), [1.0, 2.0, 3.0, 4.0]])
def test_non_float_input_is_rejected(x):
    with pytest.raises(TypeError, match="^x must be a floating-point tensor of vectors, got "):
        LayerNorm(4)(x)

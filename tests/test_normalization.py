import pytest
import torch
from torch import nn

from course_lib.normalization import LayerNorm

# nn.LayerNorm uses a fused kernel that sums in a different order, so float32 results differ in the
# last bits (measured: about 1.5e-6 for outputs of size ~10); float64 agrees to ~1e-14.
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


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


@pytest.mark.parametrize("fused", [False, True])  # the formula step by step, and F.layer_norm
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(7,), (768,), (2, 5, 16), (3, 4, 768), (1, 1, 1)])
@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_equals_nn_layernorm(dtype, shape, eps, fused):
    ours, theirs = pair(shape[-1], dtype, seed=sum(shape), eps=eps)
    ours.fused = fused
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape)), dtype=dtype) * 3 + 0.5
    expected = theirs(x)
    got = ours(x)
    assert got.shape == x.shape and got.dtype == dtype
    tol = TOLERANCE[dtype]
    assert torch.allclose(got, expected, atol=tol, rtol=tol), (got - expected).abs().max()


@pytest.mark.parametrize("fused", [False, True])
def test_gradients_equal_nn_layernorm(fused):
    ours, theirs = pair(32, torch.float64, seed=1)
    ours.fused = fused
    x = torch.randn(4, 6, 32, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(4, 6, 32, dtype=torch.float64)
    (grad_ours,) = torch.autograd.grad((ours(x) * weights).sum(), x)
    (grad_theirs,) = torch.autograd.grad((theirs(x) * weights).sum(), x)
    assert torch.allclose(grad_ours, grad_theirs, atol=1e-10)
    (ours(x) * weights).sum().backward()
    (theirs(x) * weights).sum().backward()
    assert torch.allclose(ours.scale.grad, theirs.weight.grad, atol=1e-10)
    assert torch.allclose(ours.shift.grad, theirs.bias.grad, atol=1e-10)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_have_mean_zero_and_variance_one_before_scale_and_shift(dtype, fused):
    ln = LayerNorm(64).to(dtype)  # scale = 1, shift = 0: the output is the normalised input
    ln.fused = fused
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


@pytest.mark.parametrize("fused", [False, True])
def test_constant_row_gives_shift_not_nan(fused):
    ln = LayerNorm(4)
    ln.fused = fused
    y = ln(torch.full((2, 4), 3.0))
    assert torch.equal(y, torch.zeros(2, 4))


def test_one_example_does_not_depend_on_the_rest_of_the_batch():
    ln = LayerNorm(8)
    x = torch.randn(4, 8)
    other = torch.cat([x[:1], torch.randn(3, 8) * 10])
    assert torch.allclose(ln(x)[0], ln(other)[0])


def test_fused_is_the_default_and_both_paths_agree_forward_and_backward():
    assert LayerNorm.fused is True  # what every model of the course runs
    ln, _ = pair(48, torch.float64, seed=3)
    x = torch.randn(3, 7, 48, dtype=torch.float64, requires_grad=True) * 4 - 1
    upstream = torch.randn(3, 7, 48, dtype=torch.float64)
    results = {}
    for fused in (False, True):
        ln.fused = fused
        out = ln(x)
        results[fused] = (out, *torch.autograd.grad((out * upstream).sum(), [x, ln.scale, ln.shift]))
    for formula, kernel in zip(results[False], results[True]):
        assert torch.allclose(formula, kernel, atol=1e-12, rtol=0), (formula - kernel).abs().max()


def test_fused_path_is_taken_by_default(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.nn.functional, "layer_norm", lambda *args: calls.append(args) or args[0])
    LayerNorm(4)(torch.randn(2, 4))
    assert len(calls) == 1
    off = LayerNorm(4)
    off.fused = False
    off(torch.randn(2, 4))
    assert len(calls) == 1  # the step-by-step formula does not call it


def test_mixed_dtypes_fall_back_to_the_formula():
    ln, _ = pair(16, torch.float32, seed=4)  # float32 parameters
    x = torch.randn(5, 16, dtype=torch.float64)
    formula = LayerNorm(16)
    formula.load_state_dict(ln.state_dict())
    formula.fused = False
    got = ln(x)  # F.layer_norm would refuse float64 x with float32 weights; the formula promotes
    assert got.dtype == torch.float64
    assert torch.equal(got, formula(x))


@pytest.mark.parametrize("emb_dim", [0, -3])
def test_emb_dim_must_be_positive(emb_dim):
    with pytest.raises(ValueError, match=f"emb_dim must be a positive int, got {emb_dim}"):
        LayerNorm(emb_dim)


@pytest.mark.parametrize("emb_dim", [4.0, "4", True])
def test_emb_dim_must_be_an_int(emb_dim):
    with pytest.raises(TypeError, match="emb_dim must be an int"):
        LayerNorm(emb_dim)


@pytest.mark.parametrize("eps", [0, -1e-5, float("nan"), float("inf")])
def test_eps_must_be_positive_and_finite(eps):
    with pytest.raises(ValueError, match="eps must be a positive finite number"):
        LayerNorm(4, eps=eps)


@pytest.mark.parametrize("eps", ["1e-5", None, True])
def test_eps_must_be_a_number(eps):
    with pytest.raises(TypeError, match="eps must be a float"):
        LayerNorm(4, eps=eps)


def test_wrong_last_dimension_names_both_sizes():
    ln = LayerNorm(768)
    with pytest.raises(ValueError, match=r"built for emb_dim 768 but got last dimension 512 "
                                         r"\(shape \(2, 3, 512\)\)"):
        ln(torch.randn(2, 3, 512))


def test_scalar_input_is_rejected():
    with pytest.raises(ValueError, match="built for emb_dim 1 but got a 0-d tensor"):
        LayerNorm(1)(torch.tensor(2.0))


@pytest.mark.parametrize("x", [torch.arange(4), [1.0, 2.0, 3.0, 4.0]])
def test_non_float_input_is_rejected(x):
    with pytest.raises(TypeError, match="LayerNorm expects a floating-point tensor"):
        LayerNorm(4)(x)

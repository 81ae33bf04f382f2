import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.config import GPTConfig
from course_lib.embeddings import GPTEmbedding, SinusoidalPositionalEmbedding

CFG = GPTConfig(vocab_size=50257, context_length=32, emb_dim=16, n_heads=4, n_layers=2, drop_rate=0.5)


@pytest.fixture
def layer():
    torch.manual_seed(0)
    return GPTEmbedding(CFG)


def test_one_hot_times_weight_equals_lookup():
    torch.manual_seed(0)
    emb = nn.Embedding(50257, 8)
    ids = torch.tensor([[464, 3290, 50256], [0, 7, 1]])  # (2, 3)
    one_hot = F.one_hot(ids, num_classes=50257).float()  # (2, 3, 50257)
    assert torch.allclose(one_hot @ emb.weight, emb(ids), atol=1e-6)


@pytest.mark.parametrize("emb_dim", [6, 7, 16, 1])
def test_sinusoidal_values_match_the_formula(emb_dim):
    table = SinusoidalPositionalEmbedding(emb_dim, context_length=200)(200)
    assert table.shape == (200, emb_dim)
    for p in (0, 1, 5, 63, 199):
        for j in range(emb_dim):
            angle = p / 10000 ** (2 * (j // 2) / emb_dim)
            expected = math.sin(angle) if j % 2 == 0 else math.cos(angle)
            assert table[p, j].item() == pytest.approx(expected, abs=1e-6), (p, j)


def test_sinusoidal_odd_dim_is_the_even_formula_with_the_last_column_a_sine():
    odd = SinusoidalPositionalEmbedding(7, context_length=50)(50)
    assert torch.allclose(odd[:, 6], torch.sin(torch.arange(50.0) / 10000 ** (6 / 7)), atol=1e-6)
    assert torch.equal(odd[0], torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]))


def test_sinusoidal_start_pos_slices_the_table():
    pe = SinusoidalPositionalEmbedding(10, context_length=20)
    assert torch.equal(pe(4, start_pos=7), pe(20)[7:11])


def test_sinusoidal_table_is_a_buffer_not_a_parameter():
    pe = SinusoidalPositionalEmbedding(8, context_length=16)
    assert list(pe.parameters()) == []
    assert [name for name, _ in pe.named_buffers()] == ["table"]
    assert "table" not in pe.state_dict()  # recomputed, never saved
    assert not pe.table.requires_grad


def test_sinusoidal_table_moves_with_to():
    pe = SinusoidalPositionalEmbedding(8, context_length=16).to(torch.float64)
    assert pe(3).dtype == torch.float64
    meta = SinusoidalPositionalEmbedding(8, context_length=16).to("meta")
    assert meta(3).device.type == "meta"


def test_sinusoidal_similarity_depends_only_on_distance():
    table = SinusoidalPositionalEmbedding(64, context_length=300)(300)
    sims = torch.stack([table[p] @ table[p : p + 50].T for p in (0, 30, 100, 250)])  # (4, 50)
    assert torch.allclose(sims, sims[0].expand_as(sims), atol=1e-4)


# Issue 29: the sinusoidal table (a lesson piece, not part of GPTModel) checks only start_pos, whose negative values
# would silently count from the end of the table. Sizes that PyTorch cannot build or index still fail loudly; those it
# takes without a word (emb_dim 0, context_length True, num_tokens 0 or a 0-d tensor) are no longer tested here.
def test_sinusoidal_sizes_pytorch_cannot_use_fail_loudly():
    with pytest.raises(TypeError, match="tuple of ints"):
        SinusoidalPositionalEmbedding(8.0, 10)
    with pytest.raises(IndexError, match="index is out of bounds for dimension with size 0"):
        SinusoidalPositionalEmbedding(8, 0)(1)  # an empty table has no position 0


@pytest.mark.parametrize("args, error, message", [
    ((3, -1), ValueError, "^start_pos must be >= 0, got -1$"),
    ((3, 1.0), TypeError, r"^start_pos must be an int, got 1.0 \(float\)$"),
    ((17,), IndexError, "index 16 is out of bounds for dimension 0 with size 16"),  # was: a named ValueError
    ((2, 15), IndexError, "index 16 is out of bounds for dimension 0 with size 16"),  # an index fails, a slice not
])
def test_sinusoidal_forward_rejects_bad_arguments(args, error, message):
    with pytest.raises(error, match=message):
        SinusoidalPositionalEmbedding(8, context_length=16)(*args)


def test_gpt_embedding_names_and_sizes(layer):
    assert isinstance(layer.tok_emb, nn.Embedding) and layer.tok_emb.weight.shape == (50257, 16)
    assert isinstance(layer.pos_emb, nn.Embedding) and layer.pos_emb.weight.shape == (32, 16)
    assert isinstance(layer.drop_emb, nn.Dropout) and layer.drop_emb.p == 0.5
    assert set(layer.state_dict()) == {"tok_emb.weight", "pos_emb.weight"}


def test_gpt_embedding_shape_and_value(layer):
    layer.eval()
    ids = torch.tensor([[464, 3290, 1643, 262], [50256, 0, 1, 2]])  # (2, 4)
    out = layer(ids)
    assert out.shape == (2, 4, 16)
    expected = layer.tok_emb.weight[ids] + layer.pos_emb.weight[:4]  # (2, 4, 16)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_gpt_embedding_accepts_the_index_dtypes(layer, dtype):
    layer.eval()
    ids = torch.tensor([[3, 1, 4]])
    assert torch.equal(layer(ids.to(dtype)), layer(ids))


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8])
def test_narrower_integer_ids_fail_loudly_in_nn_embedding(layer, dtype):
    # was: accepted and converted with .long(); the layer now hands the ids to nn.Embedding as they are
    with pytest.raises(RuntimeError, match="Expected tensor for argument #1 'indices' to have one of the following "
                                           "scalar types: Long, Int"):
        layer(torch.tensor([[3, 1, 4]], dtype=dtype))


def test_start_pos_equals_slicing_a_longer_input(layer):
    layer.eval()
    ids = torch.randint(0, 50257, (2, 6))
    full = layer(ids)  # (2, 6, 16)
    assert torch.equal(layer(ids[:, 3:5], start_pos=3), full[:, 3:5])
    assert torch.equal(layer(ids[:, 5:6], start_pos=5), full[:, 5:6])  # one new token, as a KV cache feeds it
    assert not torch.equal(layer(ids[:, 3:5]), full[:, 3:5])  # positions 0..1 are not 3..4


def test_the_last_position_is_usable(layer):
    layer.eval()
    out = layer(torch.zeros(1, 1, dtype=torch.long), start_pos=31)
    assert torch.equal(out[0, 0], layer.tok_emb.weight[0] + layer.pos_emb.weight[31])
    assert layer(torch.zeros(1, 32, dtype=torch.long)).shape == (1, 32, 16)


def test_dropout_only_in_training(layer):
    ids = torch.randint(0, 50257, (4, 32))
    layer.eval()
    clean = layer(ids)
    assert torch.equal(layer(ids), clean)
    layer.train()
    noisy = layer(ids)
    zeroed = noisy == 0
    assert 0.4 < zeroed.float().mean().item() < 0.6  # drop_rate 0.5 of 2048 values
    assert torch.allclose(noisy[~zeroed], clean[~zeroed] / 0.5)  # survivors scaled by 1 / (1 - p)


def test_gradients_reach_only_the_rows_used(layer):
    layer.eval()
    layer(torch.tensor([[7, 9, 7]])).sum().backward()
    touched = layer.tok_emb.weight.grad.abs().sum(dim=1).nonzero().flatten().tolist()
    assert touched == [7, 9]
    assert layer.pos_emb.weight.grad[:3].abs().sum(dim=1).gt(0).all()
    assert layer.pos_emb.weight.grad[3:].eq(0).all()


# --- bad input ------------------------------------------------------------------------------------------------
# Issue 29: GPTEmbedding checks nothing; GPTModel checks the token ids at its door, with the messages this file used to
# test here (test_model.py: test_bad_token_ids_are_refused_at_the_model_door, ..._on_another_device_..., and
# test_the_door_errors_scale_to_gpt2_sizes). Called directly, the layer still fails loudly in PyTorch or Python.

def test_gpt_embedding_fails_loudly_on_a_dict_config():
    # was: "cfg must be a GPTConfig, got dict"; GPTModel(cfg) still says it
    with pytest.raises(AttributeError, match=re.escape("'dict' object has no attribute 'vocab_size'")):
        GPTEmbedding({"vocab_size": 10, "emb_dim": 4, "context_length": 8, "drop_rate": 0.0})


@pytest.mark.parametrize("ids, kwargs, error, message", [
    (torch.tensor([[1, 50300, 2]]), {}, IndexError, "index out of range in self"),  # past the vocabulary
    (torch.tensor([[5, -1]]), {}, IndexError, "index out of range in self"),
    (torch.zeros(1, 33, dtype=torch.long), {}, IndexError, "index out of range in self"),  # past the positions
    (torch.zeros(2, 3, dtype=torch.long), {"start_pos": 30}, IndexError, "index out of range in self"),
    (torch.zeros(1, 1, dtype=torch.long), {"start_pos": -1}, IndexError, "index out of range in self"),
    (torch.tensor([[1.0, 2.0]]), {}, RuntimeError, "Expected tensor for argument #1 'indices' to have one of the "
                                                   "following scalar types: Long, Int; but got torch.FloatTensor"),
    (torch.tensor([[True, False]]), {}, RuntimeError, "scalar types: Long, Int; but got CPUBoolType"),
    (torch.tensor([1, 2, 3]), {}, IndexError, "tuple index out of range"),  # 1-D: no token dimension
    (torch.zeros(1, 2, 3, dtype=torch.long), {}, RuntimeError, "The size of tensor a (3) must match the size of "
                                                               "tensor b (2)"),
    ([[1, 2, 3]], {}, AttributeError, "'list' object has no attribute 'shape'"),
])
def test_gpt_embedding_fails_loudly_on_bad_input(layer, ids, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        layer(ids, **kwargs)


def test_positions_per_row_equal_start_pos_and_each_row_its_own(layer):
    layer.eval()
    ids = torch.randint(0, 50257, (2, 5))
    same = torch.arange(3, 8).expand(2, 5)  # (2, 5): both rows at positions 3..7
    assert torch.equal(layer(ids, positions=same), layer(ids, start_pos=3))
    own = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]])  # row 1: two pads at position 0, then 0, 1, 2
    out = layer(ids, positions=own)
    assert torch.equal(out[1, 2:], layer(ids[1:, 2:])[0]) and torch.equal(out[0], layer(ids[:1])[0])


# was: check_positions' messages. Positions now come only from positions_after_padding (notebook 07), which derives
# them from an attention_mask the model checks at its door; bad ones handed to the layer directly fail in PyTorch.
@pytest.mark.parametrize("positions, error, message", [
    (torch.zeros(2, 5), RuntimeError, "scalar types: Long, Int; but got torch.FloatTensor"),
    ([[0, 1, 2, 3, 4]] * 2, TypeError, "embedding(): argument 'indices' (position 2) must be Tensor, not list"),
    (torch.zeros(2, 4, dtype=torch.long), RuntimeError, "The size of tensor a (5) must match the size of tensor b (4)"),
    (torch.full((2, 5), 32), IndexError, "index out of range in self"),
    (torch.full((2, 5), -1), IndexError, "index out of range in self"),
])
def test_bad_positions_fail_loudly(layer, positions, error, message):
    with pytest.raises(error, match=re.escape(message)):
        layer(torch.zeros(2, 5, dtype=torch.long), positions=positions)

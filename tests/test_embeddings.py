import math

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


@pytest.mark.parametrize("args, error, message", [
    ((0, 10), ValueError, "emb_dim must be >= 1, got 0"),
    ((8, 0), ValueError, "context_length must be >= 1, got 0"),
    ((8.0, 10), TypeError, r"emb_dim must be an int, got 8.0 \(float\)"),
    ((8, True), TypeError, r"context_length must be an int, got True \(bool\)"),
])
def test_sinusoidal_rejects_bad_sizes(args, error, message):
    with pytest.raises(error, match=message):
        SinusoidalPositionalEmbedding(*args)


@pytest.mark.parametrize("args, error, message", [
    ((0,), ValueError, "num_tokens must be >= 1, got 0"),
    ((3, -1), ValueError, "start_pos must be >= 0, got -1"),
    ((17,), ValueError, r"start_pos 0 \+ 17 tokens need positions 0..16 but context_length is 16; "
                        r"build the module with context_length >= 17"),
    ((2, 15), ValueError, "need positions 15..16 but context_length is 16"),
    ((torch.tensor(3),), TypeError, r"num_tokens must be an int, got tensor\(3\) \(Tensor\)"),
    ((3, 1.0), TypeError, r"start_pos must be an int, got 1.0 \(float\)"),
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


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_gpt_embedding_accepts_integer_dtypes(layer, dtype):
    layer.eval()
    ids = torch.tensor([[3, 1, 4]])
    assert torch.equal(layer(ids.to(dtype)), layer(ids))


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


def test_gpt_embedding_rejects_a_dict_config():
    with pytest.raises(TypeError, match=r"cfg must be a GPTConfig, got dict: build one with GPTConfig\(...\) or take "
                                        r"one from GPT2_CONFIGS"):
        GPTEmbedding({"vocab_size": 10, "emb_dim": 4, "context_length": 8, "drop_rate": 0.0})


@pytest.mark.parametrize("ids, kwargs, error, message", [
    (torch.tensor([[1, 50300, 2]]), {}, ValueError,
     "token_ids holds token id 50300 >= vocab_size 50257: the ids come from a larger vocabulary"),
    (torch.tensor([[50257]]), {}, ValueError, "token_ids holds token id 50257 >= vocab_size 50257"),
    (torch.tensor([[5, -1]]), {}, ValueError,
     r"token_ids holds token id -1 < 0: token ids index the vocabulary, 0 \.\. 50256$"),
    (torch.zeros(1, 33, dtype=torch.long), {}, ValueError,
     r"start_pos 0 \+ 33 tokens need positions 0..32 but context_length is 32; "
     r"crop the input to the last 32 tokens$"),
    (torch.zeros(2, 3, dtype=torch.long), {"start_pos": 30}, ValueError,
     r"start_pos 30 \+ 3 tokens need positions 30..32 but context_length is 32; crop the input to the last "
     r"32 tokens and restart at start_pos 0 \(reset the KV cache\)"),
    (torch.zeros(1, 1, dtype=torch.long), {"start_pos": -1}, ValueError, "start_pos must be >= 0, got -1"),
    (torch.zeros(1, 1, dtype=torch.long), {"start_pos": 2.0}, TypeError,
     r"^start_pos must be an int, got 2.0 \(float\)$"),
    (torch.zeros(1, 1, dtype=torch.long), {"start_pos": torch.tensor(2)}, TypeError,
     r"start_pos must be an int, got tensor\(2\) \(Tensor\)"),
    (torch.tensor([1, 2, 3]), {}, ValueError,
     r"token_ids must be 2-D \(batch, tokens\), got shape \(3,\): for a single sequence add a batch "
     r"dimension with \.unsqueeze\(0\)"),
    (torch.zeros(1, 2, 3, dtype=torch.long), {}, ValueError, r"got shape \(1, 2, 3\)"),
    (torch.tensor([[1.0, 2.0]]), {}, TypeError,
     r"token_ids must hold integer token ids, got dtype torch.float32: convert with \.long\(\)"),
    (torch.tensor([[True, False]]), {}, TypeError, "got dtype torch.bool"),
    (torch.zeros(2, 0, dtype=torch.long), {}, ValueError,
     r"token_ids is empty, shape \(2, 0\): pass at least one token"),
    (torch.zeros(0, 4, dtype=torch.long), {}, ValueError, r"token_ids is empty, shape \(0, 4\)"),
    ([[1, 2, 3]], {}, TypeError,
     r"token_ids must be a torch.Tensor of token ids, got list: wrap a list of ids with torch.tensor"),
])
def test_gpt_embedding_rejects_bad_input(layer, ids, kwargs, error, message):
    with pytest.raises(error, match=message):
        layer(ids, **kwargs)


def test_gpt_embedding_rejects_ids_on_another_device(layer):
    with pytest.raises(ValueError, match=r"token_ids is on cpu but the model is on meta: move it with \.to\(\.\.\.\)"):
        layer.to("meta")(torch.tensor([[1, 2]]))


def test_errors_scale_to_gpt2_sizes():
    small_gpt2 = GPTConfig(emb_dim=8, n_heads=2, n_layers=1)  # GPT-2's vocabulary and context, tiny width
    layer = GPTEmbedding(small_gpt2)
    with pytest.raises(ValueError, match=r"positions 0..1024 but context_length is 1024; crop the input to "
                                         r"the last 1024 tokens"):
        layer(torch.zeros(1, 1025, dtype=torch.long))
    with pytest.raises(ValueError, match="token id 50300 >= vocab_size 50257"):
        layer(torch.tensor([[50300]]))


def test_positions_per_row_equal_start_pos_and_each_row_its_own(layer):
    layer.eval()
    ids = torch.randint(0, 50257, (2, 5))
    same = torch.arange(3, 8).expand(2, 5)  # (2, 5): both rows at positions 3..7
    assert torch.equal(layer(ids, positions=same), layer(ids, start_pos=3))
    own = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]])  # row 1: two pads at position 0, then 0, 1, 2
    out = layer(ids, positions=own)
    assert torch.equal(out[1, 2:], layer(ids[1:, 2:])[0]) and torch.equal(out[0], layer(ids[:1])[0])


@pytest.mark.parametrize("positions, error, message", [
    (torch.zeros(2, 5), TypeError, "positions must be an integer tensor"),
    ([[0, 1, 2, 3, 4]] * 2, TypeError, "positions must be an integer tensor"),
    (torch.zeros(2, 4, dtype=torch.long), ValueError, r"positions must have the shape and device of token_ids \(2, 5\)"),
    (torch.full((2, 5), 32), ValueError, r"positions must be in \[0, 31\]"),
    (torch.full((2, 5), -1), ValueError, r"positions must be in \[0, 31\]"),
])
def test_bad_positions_are_named(layer, positions, error, message):
    with pytest.raises(error, match=message):
        layer(torch.zeros(2, 5, dtype=torch.long), positions=positions)

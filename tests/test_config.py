import dataclasses
import re

import pytest
import torch

from course_lib.config import GPT2_CONFIGS, GPTConfig, get_device

SIZES = ["vocab_size", "context_length", "emb_dim", "n_heads", "n_layers"]


@pytest.mark.parametrize("name, emb_dim, n_heads, n_layers", [
    ("gpt2", 768, 12, 12),
    ("gpt2-medium", 1024, 16, 24),
    ("gpt2-large", 1280, 20, 36),
    ("gpt2-xl", 1600, 25, 48),
])
def test_presets_have_the_published_shapes(name, emb_dim, n_heads, n_layers):
    cfg = GPT2_CONFIGS[name]
    assert (cfg.emb_dim, cfg.n_heads, cfg.n_layers) == (emb_dim, n_heads, n_layers)
    assert (cfg.vocab_size, cfg.context_length) == (50257, 1024)
    assert (cfg.drop_rate, cfg.qkv_bias) == (0.1, True)


def test_presets_are_exactly_the_four_gpt2_sizes():
    assert list(GPT2_CONFIGS) == ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"]
    assert all(isinstance(cfg, GPTConfig) for cfg in GPT2_CONFIGS.values())


def test_defaults_are_gpt2_124m_with_fields_in_order():
    assert GPTConfig() == GPT2_CONFIGS["gpt2"]
    assert [f.name for f in dataclasses.fields(GPTConfig)] == [
        "vocab_size", "context_length", "emb_dim", "n_heads", "n_layers", "drop_rate", "qkv_bias", "tie_weights"]
    assert GPTConfig().tie_weights is True  # GPT-2's head shares the token embedding


def test_valid_edge_cases_are_accepted():
    tiny = GPTConfig(vocab_size=1, context_length=1, emb_dim=1, n_heads=1, n_layers=1, drop_rate=0)
    assert tiny.emb_dim == 1 and tiny.drop_rate == 0
    assert GPTConfig(emb_dim=8, n_heads=8, drop_rate=0.999, qkv_bias=False).n_heads == 8


def test_emb_dim_not_divisible_by_n_heads():
    with pytest.raises(ValueError, match=r"^emb_dim 770 is not divisible by n_heads 12: .*divisors of 770$"):
        GPTConfig(emb_dim=770)
    with pytest.raises(ValueError, match=r"^emb_dim 768 is not divisible by n_heads 7"):
        GPTConfig(n_heads=7)


@pytest.mark.parametrize("value", [0, -1])
@pytest.mark.parametrize("name", SIZES)
def test_non_positive_sizes_are_rejected(name, value):
    with pytest.raises(ValueError, match=f"^{name} must be >= 1, got {value}$"):
        GPTConfig(**{name: value})


@pytest.mark.parametrize("value", [2.5, True, "12", None])
@pytest.mark.parametrize("name", SIZES)
def test_non_int_sizes_are_rejected(name, value):
    expected = f"{name} must be an int, got {value!r} ({type(value).__name__})"
    with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
        GPTConfig(**{name: value})


@pytest.mark.parametrize("value", [-0.1, 1, 1.0, 1.5, float("nan")])
def test_drop_rate_outside_zero_one_is_rejected(value):
    with pytest.raises(ValueError, match=rf"^drop_rate must be in \[0, 1\), got {value}: .*probability"):
        GPTConfig(drop_rate=value)


@pytest.mark.parametrize("value", ["0.1", True, None])
def test_drop_rate_of_the_wrong_type_is_rejected(value):
    expected = f"drop_rate must be a number, got {value!r} ({type(value).__name__})"
    with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
        GPTConfig(drop_rate=value)


@pytest.mark.parametrize("value", [1, 0, "True", None])
@pytest.mark.parametrize("name", ["qkv_bias", "tie_weights"])
def test_non_bool_switches_are_rejected(name, value):
    with pytest.raises(TypeError, match=f"^{re.escape(f'{name} must be True or False, got {value!r}')}$"):
        GPTConfig(**{name: value})


def test_config_is_frozen_and_replace_revalidates():
    cfg = GPTConfig()
    with pytest.raises(dataclasses.FrozenInstanceError, match="emb_dim"):
        cfg.emb_dim = 1024
    assert cfg.emb_dim == 768
    short = dataclasses.replace(cfg, context_length=256)
    assert (short.context_length, cfg.context_length) == (256, 1024)
    with pytest.raises(ValueError, match="not divisible by n_heads 7"):
        dataclasses.replace(cfg, n_heads=7)


def test_configs_are_hashable_values():
    assert GPTConfig(**dataclasses.asdict(GPT2_CONFIGS["gpt2-xl"])) == GPT2_CONFIGS["gpt2-xl"]
    assert len({GPTConfig(), GPT2_CONFIGS["gpt2"], GPT2_CONFIGS["gpt2-medium"]}) == 2


def test_get_device_returns_a_usable_device():
    device = get_device()
    assert isinstance(device, torch.device)
    assert device.type in {"cuda", "mps", "cpu"}
    assert torch.zeros(2, device=device).device.type == device.type


@pytest.mark.parametrize("cuda, mps, expected", [
    (True, True, "cuda"),
    (True, False, "cuda"),
    (False, True, "mps"),
    (False, False, "cpu"),
])
def test_get_device_prefers_cuda_then_mps_then_cpu(monkeypatch, cuda, mps, expected):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)  # a learner's run: not the test session's cpu (test_device.py)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    assert get_device() == torch.device(expected)

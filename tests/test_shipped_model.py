"""The course's own trained model, course_lib/data/shakespeare_gpt: its files against its card, both loaders
on the same logits, the card's numbers reproduced, and the script that made it resuming on the same path."""

import hashlib
import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import GPT2LMHeadModel

from course_lib.config import GPTConfig
from course_lib.model import GPTModel
from course_lib.pretrained import SHAKESPEARE_GPT_DIR, load_gpt2, load_shakespeare_gpt
from course_lib.tokenization import CharTokenizer
from course_lib.training import TrainConfig, load_shakespeare, sample_text

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "course_lib" / "data" / "make_shakespeare_gpt.py"


def load_script():
    spec = importlib.util.spec_from_file_location("make_shakespeare_gpt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script():
    return load_script()


@pytest.fixture(scope="module")
def card():
    return json.loads((SHAKESPEARE_GPT_DIR / "card.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def shipped():
    return load_shakespeare_gpt("cpu")


def test_every_shipped_file_matches_the_hash_on_the_card(card):
    assert set(card["sha256"]) == {"config.json", "generation_config.json", "model.safetensors", "chars.json"}
    for name, digest in card["sha256"].items():
        assert hashlib.sha256((SHAKESPEARE_GPT_DIR / name).read_bytes()).hexdigest() == digest, name


def test_the_readme_is_the_card_rendered(script, card):
    assert (SHAKESPEARE_GPT_DIR / "README.md").read_text(encoding="utf-8") == script.render_card(card, script.RECIPES["model"])


def test_the_card_describes_the_script_and_meets_the_goals(script, card):
    recipe = script.RECIPES["model"]
    assert GPTConfig(**card["model_config"]) == recipe.model_config and card["seed"] == recipe.seed
    assert TrainConfig(**card["train_config"]) == recipe.train_config
    assert card["parameters"] == sum(p.numel() for p in GPTModel(recipe.model_config).parameters())
    assert card["parameters"] <= 5_000_000
    assert sum(f.stat().st_size for f in SHAKESPEARE_GPT_DIR.iterdir()) <= 20_000_000
    assert card["loss"]["val"] <= 1.60, "issue 15's goal: validation loss at most 1.60 nats"
    assert card["history"]["eval_step"][-1] == recipe.train_config.total_steps


def test_the_vocabulary_is_the_corpus_characters(shipped):
    _, tokenizer = shipped
    assert tokenizer.chars == CharTokenizer.from_text(load_shakespeare()).chars


def test_our_loader_and_transformers_give_the_same_logits(script, shipped):
    model, _ = shipped
    hf_model = GPT2LMHeadModel.from_pretrained(SHAKESPEARE_GPT_DIR).eval()
    _, _, val_data = script.corpus()
    windows = val_data[: 4 * 128].view(4, 128)  # (4, 128): a full context, four times
    with torch.no_grad():
        ours, theirs = model(windows), hf_model(windows).logits
    assert (ours - theirs).abs().max().item() < 1e-4
    assert torch.equal(model.trf_blocks[0].att.W_query.bias, torch.zeros(256)), "qkv_bias=False: zero biases"


def test_load_gpt2_reads_the_folder_like_any_other(shipped):
    model, _ = shipped
    again = load_gpt2(SHAKESPEARE_GPT_DIR, "cpu")
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


def test_the_validation_subset_loss_on_the_card_is_reproduced(script, card, shipped):
    model, _ = shipped
    _, _, val_data = script.corpus()
    loss = script.split_loss(model, val_data, model.cfg.context_length, script.SUBSET_WINDOWS)
    assert abs(loss - card["loss"]["val_subset"]) < 1e-4


def test_the_seeded_sample_on_the_card_is_reproduced(script, card, shipped):
    model, tokenizer = shipped
    assert sample_text(model, tokenizer, **script.SAMPLE) == card["sample"]


def small_run(script, monkeypatch):
    """The script at a tiny size on the first 20,000 characters: a run of 6 steps in two pieces."""
    recipe = script.RECIPES["model"]
    tiny = replace(recipe, model_config=replace(recipe.model_config, context_length=16, emb_dim=16, n_heads=2, n_layers=1),
                   train_config=TrainConfig(total_steps=6, batch_size=4, warmup_steps=1, eval_every=3, eval_batches=1),
                   checkpoint_every=3)
    monkeypatch.setitem(script.RECIPES, "model", tiny)
    full_corpus = script.corpus

    def short_corpus():
        tokenizer, train_data, val_data = full_corpus()
        return tokenizer, train_data[:18_000], val_data[:2_000]

    monkeypatch.setattr(script, "corpus", short_corpus)


def test_an_interrupted_build_resumes_on_the_same_trajectory(tmp_path, monkeypatch):
    straight, resumed = load_script(), load_script()
    small_run(straight, monkeypatch)
    straight.main(["--out", str(tmp_path / "straight"), "--work", str(tmp_path / "straight.pt")])

    small_run(resumed, monkeypatch)
    real_train, calls = resumed.train, []

    def train_then_die(*args, **kwargs):
        if calls:
            raise KeyboardInterrupt  # the session ends after the first piece and its checkpoint
        calls.append(1)
        return real_train(*args, **kwargs)

    monkeypatch.setattr(resumed, "train", train_then_die)
    with pytest.raises(KeyboardInterrupt):
        resumed.main(["--out", str(tmp_path / "resumed"), "--work", str(tmp_path / "resumed.pt")])
    assert not (tmp_path / "resumed").exists() and (tmp_path / "resumed.pt").is_file()
    monkeypatch.setattr(resumed, "train", real_train)
    resumed.main(["--out", str(tmp_path / "resumed"), "--work", str(tmp_path / "resumed.pt")])

    cards = [json.loads((tmp_path / run / "card.json").read_text()) for run in ("straight", "resumed")]
    assert cards[0]["sha256"] == cards[1]["sha256"], "bit-identical weights"
    assert cards[0]["loss"] == cards[1]["loss"] and cards[0]["sample"] == cards[1]["sample"]
    assert cards[0]["history"]["eval_step"] == [3, 6]


# ------------------------------------------------------------------ the draft: notebook 09's small model, shipped
DRAFT_DIR = ROOT / "course_lib" / "data" / "shakespeare_draft"


def test_the_draft_folder_matches_its_card_and_recipe(script):
    card = json.loads((DRAFT_DIR / "card.json").read_text(encoding="utf-8"))
    recipe = script.RECIPES["draft"]
    for name, digest in card["sha256"].items():
        assert hashlib.sha256((DRAFT_DIR / name).read_bytes()).hexdigest() == digest, name
    assert (DRAFT_DIR / "README.md").read_text(encoding="utf-8") == script.render_card(card, recipe)
    assert GPTConfig(**card["model_config"]) == recipe.model_config and card["seed"] == recipe.seed
    assert TrainConfig(**card["train_config"]) == recipe.train_config
    assert card["command"] == "python course_lib/data/make_shakespeare_gpt.py --recipe draft --threads 1"
    assert card["loss"]["val"] < 1.9, "notebook 09's goal for this model"
    model = load_gpt2(DRAFT_DIR, "cpu")
    tokenizer = CharTokenizer(json.loads((DRAFT_DIR / "chars.json").read_text(encoding="utf-8"))["chars"])
    _, _, val_data = script.corpus()
    windows = val_data[: 4 * 64].view(4, 64)
    with torch.no_grad():
        ours, theirs = model(windows), GPT2LMHeadModel.from_pretrained(DRAFT_DIR).eval()(windows).logits
    assert (ours - theirs).abs().max().item() < 1e-4
    loss = script.split_loss(model, val_data, model.cfg.context_length, script.SUBSET_WINDOWS)
    assert abs(loss - card["loss"]["val_subset"]) < 1e-4
    assert sample_text(model, tokenizer, **script.SAMPLE) == card["sample"]

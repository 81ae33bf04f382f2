import hashlib
import math

import pytest
import torch
import torch.nn.functional as F

from course_lib import training
from course_lib.config import GPTConfig
from course_lib.model import GPTModel
from course_lib.tokenization import CharTokenizer, gpt2_tokenizer
from course_lib.training import (
    SHAKESPEARE_FILE, SHAKESPEARE_SHA256, TrainConfig, batch_loss, cross_entropy, evaluate, get_batch,
    load_checkpoint, load_shakespeare, lr_at, make_optimizer, sample_text, save_checkpoint, split_by_position,
    train,
)

TINY = dict(context_length=16, emb_dim=32, n_heads=2, n_layers=2, qkv_bias=False)


@pytest.fixture(scope="module")
def corpus():
    text = load_shakespeare()
    tokenizer = CharTokenizer.from_text(text)
    data = torch.tensor(tokenizer.encode(text))
    return text, tokenizer, data


def tiny_model(tokenizer, drop_rate=0.0, tie_weights=False, seed=0):
    torch.manual_seed(seed)
    return GPTModel(GPTConfig(vocab_size=tokenizer.vocab_size, drop_rate=drop_rate, tie_weights=tie_weights, **TINY))


TCFG = TrainConfig(total_steps=12, batch_size=4, max_lr=3e-3, min_lr=3e-4, warmup_steps=3, eval_every=4,
                   eval_batches=2)


# The corpus and its split

def test_corpus_file_is_the_recorded_one(corpus):
    raw = SHAKESPEARE_FILE.read_bytes()
    assert len(raw) == 960_211
    assert hashlib.sha256(raw).hexdigest() == SHAKESPEARE_SHA256
    text, tokenizer, _ = corpus
    assert len(text) == 960_211 and tokenizer.vocab_size == 65
    assert text.startswith("BERNARDO:\nWho's there?\n\n") and text.endswith("Assist.\n\n")


def test_a_damaged_corpus_is_refused(tmp_path, monkeypatch):
    damaged = tmp_path / "shakespeare.txt"
    damaged.write_bytes(SHAKESPEARE_FILE.read_bytes()[:-1])
    monkeypatch.setattr(training, "SHAKESPEARE_FILE", damaged)
    with pytest.raises(ValueError, match=r"shakespeare.txt is damaged: sha256 \w+, not dffdc9cb\w+; restore it"):
        load_shakespeare()


def test_split_is_by_position(corpus):
    _, _, data = corpus
    train_data, val_data = split_by_position(data)
    assert (len(train_data), len(val_data)) == (864_189, 96_022)
    assert torch.equal(torch.cat([train_data, val_data]), data)
    train_data, val_data = split_by_position(torch.arange(10), val_fraction=0.3)
    assert train_data.tolist() == [0, 1, 2, 3, 4, 5, 6] and val_data.tolist() == [7, 8, 9]


@pytest.mark.parametrize("token_ids, fraction, error, message", [
    ([1, 2, 3], 0.1, TypeError, r"token_ids must be a torch.Tensor of token ids, got list"),
    (torch.rand(5), 0.1, TypeError, r"token_ids must hold integer token ids, got dtype torch.float32"),
    (torch.zeros(2, 5, dtype=torch.long), 0.1, ValueError, r"token_ids must be 1-D \(tokens,\), got shape \(2, 5\)"),
    (torch.arange(10), 0.0, ValueError, r"val_fraction must be in \(0, 1\), got 0.0: the share kept for validation"),
    (torch.arange(10), 1, ValueError, r"val_fraction must be in \(0, 1\), got 1"),
    (torch.arange(10), 1.5, ValueError, r"val_fraction must be in \(0, 1\), got 1.5"),
    (torch.arange(10), -0.5, ValueError, r"val_fraction must be in \(0, 1\), got -0.5"),
    (torch.arange(10), float("nan"), ValueError, r"val_fraction must be in \(0, 1\), got nan"),
    (torch.arange(1), 0.1, ValueError, r"val_fraction 0.1 of 1 tokens leaves one part empty"),
    (torch.arange(10), 1e-17, ValueError, r"val_fraction 1e-17 of 10 tokens leaves one part empty"),
])
def test_split_errors(token_ids, fraction, error, message):
    with pytest.raises(error, match=message):
        split_by_position(token_ids, fraction)


def test_get_batch_cuts_shifted_windows(corpus):
    _, _, data = corpus
    inputs, targets = get_batch(data, 5, 8, torch.Generator().manual_seed(1))
    assert inputs.shape == targets.shape == (5, 8) and inputs.dtype == torch.long
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    again, _ = get_batch(data, 5, 8, torch.Generator().manual_seed(1))
    assert torch.equal(inputs, again)
    stream = torch.arange(100)
    inputs, targets = get_batch(stream, 50, 7, torch.Generator().manual_seed(2))
    assert torch.equal(inputs + 1, targets) and torch.equal(inputs[:, 1:] - inputs[:, :-1], torch.ones(50, 6).long())
    assert int(targets.max()) <= 99  # a window never runs past the end


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(batch_size=0), ValueError, r"batch_size must be >= 1, got 0"),
    (dict(context_length=2.0), TypeError, r"context_length must be an int, got 2.0 \(float\)"),
    (dict(generator=123), TypeError, r"generator must be a Generator, got int: draw the windows with "
                                     r"torch.Generator\(\).manual_seed\(0\)"),
    (dict(context_length=10), ValueError, r"context_length must be in \[1, 9\], got 10: a window holds context_length \+ 1"),
])
def test_get_batch_errors(kwargs, error, message):
    args = dict(token_ids=torch.arange(10), batch_size=2, context_length=4, generator=torch.Generator()) | kwargs
    with pytest.raises(error, match=message):
        get_batch(**args)


# The loss

def test_cross_entropy_equals_pytorch():
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 11) * 4
    targets = torch.randint(0, 11, (3, 7))
    ours = cross_entropy(logits, targets)
    assert torch.allclose(ours, F.cross_entropy(logits.flatten(0, 1), targets.flatten()), atol=1e-6, rtol=0)
    by_hand = -torch.log(torch.softmax(logits.double(), -1)).gather(-1, targets.unsqueeze(-1)).mean()
    assert abs(ours.item() - by_hand.item()) < 1e-5


def test_cross_entropy_takes_any_integer_dtype_of_targets():
    logits = torch.randn(2, 3, 7)
    targets = torch.randint(0, 7, (2, 3))
    assert torch.equal(cross_entropy(logits, targets.int()), cross_entropy(logits, targets))


def test_cross_entropy_is_stable_where_log_of_softmax_is_not():
    logits = torch.tensor([[[0.0, 200.0]]])  # the target (id 0) gets probability e^-200: float32 gives 0
    naive = -torch.log(torch.softmax(logits, -1))[0, 0, 0]
    assert naive.item() == math.inf
    assert cross_entropy(logits, torch.tensor([[0]])).item() == pytest.approx(200.0)


@pytest.mark.parametrize("logits, targets, error, message", [
    (torch.zeros(2, 3, 5, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long), TypeError,
     r"logits must be a floating-point tensor \(batch, tokens, vocab_size\), got torch.int64 \(2, 3, 5\)"),
    (torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long), TypeError,
     r"logits must be a floating-point tensor \(batch, tokens, vocab_size\), got torch.float32 \(2, 3\)"),
    (torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long), ValueError, r"targets has shape \(2, 4\), logits \(2, 3, 5\): one id per position"),
    (torch.zeros(2, 3, 5), torch.zeros(2, 3), TypeError, r"targets must hold integer token ids, got dtype torch.float32: convert with .long\(\)"),
    (torch.zeros(1, 2, 5), torch.tensor([[0, 5]]), ValueError, r"targets holds token id 5 >= vocab_size 5"),
    (torch.zeros(1, 2, 5), torch.tensor([[0, -1]]), ValueError, r"targets holds token id -1 < 0"),
    (torch.zeros(1, 2, 5), torch.tensor([0, 1]), ValueError, r"targets must be 2-D \(batch, tokens\), got shape \(2,\)"),
])
def test_cross_entropy_errors(logits, targets, error, message):
    with pytest.raises(error, match=message):
        cross_entropy(logits, targets)


def test_untrained_loss_is_about_ln_vocab(corpus):
    _, tokenizer, data = corpus
    model = tiny_model(tokenizer)
    inputs, targets = get_batch(data, 8, 16, torch.Generator().manual_seed(0))
    with torch.no_grad():
        loss = batch_loss(model, inputs, targets).item()
    assert abs(loss - math.log(65)) < 0.05


# Training

def test_lr_schedule_values():
    tcfg = TrainConfig(total_steps=101, max_lr=1e-3, min_lr=1e-4, warmup_steps=10)
    assert lr_at(0, tcfg) == pytest.approx(1e-4)  # max_lr / warmup_steps
    assert lr_at(9, tcfg) == pytest.approx(1e-3)  # end of the warmup
    assert lr_at(10, tcfg) == pytest.approx(1e-3)  # the cosine starts at the top
    assert lr_at(55, tcfg) == pytest.approx(5.5e-4)  # half way down: the mean of max and min
    assert lr_at(100, tcfg) == pytest.approx(1e-4)  # the last step
    lrs = [lr_at(s, tcfg) for s in range(101)]
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10])) and all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    with pytest.raises(ValueError, match=r"step 101 is past the run's last step 100"):
        lr_at(101, tcfg)  # the cosine would silently rise again
    with pytest.raises(ValueError, match=r"step must be >= 0, got -1"):
        lr_at(-1, tcfg)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(total_steps=0), ValueError, r"total_steps must be >= 1, got 0"),
    (dict(batch_size=2.5), TypeError, r"batch_size must be an int, got 2.5"),
    (dict(warmup_steps=1000), ValueError, r"warmup_steps must be in \[0, 1000\), got 1000: it is in the run"),
    (dict(max_lr=-1.0), ValueError, r"max_lr must be in \(0, inf\), got -1.0"),
    (dict(max_lr=0.0, min_lr=0.0), ValueError, r"max_lr must be in \(0, inf\), got 0.0"),
    (dict(max_lr=math.inf), ValueError, r"max_lr must be in \(0, inf\), got inf"),
    (dict(min_lr=1.0), ValueError, r"min_lr must be in \[0, 0.004\], got 1.0: the rate falls from max_lr to min_lr"),
    (dict(weight_decay=-0.1), ValueError, r"weight_decay must be in \[0, inf\), got -0.1"),
    (dict(grad_clip=0), ValueError, r"grad_clip must be in \(0, inf\], got 0: the largest gradient norm"),
    (dict(grad_clip=float("nan")), ValueError, r"grad_clip must be in \(0, inf\], got nan"),
])
def test_train_config_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        TrainConfig(**kwargs)


def test_no_clipping_is_allowed():
    assert TrainConfig(grad_clip=math.inf).grad_clip == math.inf


def test_weight_decay_spares_biases_and_norms(corpus):
    model = tiny_model(corpus[1], tie_weights=True)
    decayed, spared = make_optimizer(model, TCFG).param_groups
    assert decayed["weight_decay"] == 0.1 and spared["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decayed["params"]) and all(p.dim() == 1 for p in spared["params"])
    assert len(decayed["params"]) + len(spared["params"]) == len(list(model.parameters()))  # tied: once


def test_a_few_steps_reduce_the_loss(corpus):
    _, tokenizer, data = corpus
    train_data, val_data = split_by_position(data)
    model = tiny_model(tokenizer)
    tcfg = TrainConfig(total_steps=40, batch_size=8, max_lr=1e-2, min_lr=1e-3, warmup_steps=5, eval_every=20,
                       eval_batches=4)
    history = train(model, make_optimizer(model, tcfg), train_data, val_data, tcfg, torch.Generator().manual_seed(0),
                    progress=False)
    assert len(history["loss"]) == len(history["lr"]) == 40 and history["eval_step"] == [20, 40]
    assert history["val_loss"][-1] < history["val_loss"][0] < math.log(65) - 0.5
    assert sum(history["loss"][-5:]) / 5 < history["loss"][0] - 0.7
    assert history["lr"][4] == pytest.approx(1e-2) and history["lr"][-1] == pytest.approx(1e-3)
    assert model.training  # train() leaves the model in training mode; evaluation did not change that


def test_a_single_batch_can_be_memorised(corpus):
    _, tokenizer, data = corpus
    model = tiny_model(tokenizer)
    inputs, targets = get_batch(data, 4, 16, torch.Generator().manual_seed(3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(100):
        loss = batch_loss(model, inputs, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05


@pytest.mark.parametrize("kwargs, message", [
    (dict(stop_step=13), r"stop_step must be in \[0, 12\], got 13: the schedule ends at total_steps"),
    (dict(start_step=5, stop_step=4), r"stop_step must be in \[5, 12\], got 4"),
    (dict(start_step=-1), r"start_step must be >= 0, got -1"),
])
def test_train_errors(corpus, kwargs, message):
    model = tiny_model(corpus[1])
    with pytest.raises(ValueError, match=message):
        train(model, make_optimizer(model, TCFG), corpus[2], corpus[2], TCFG, torch.Generator(), **kwargs)


def test_evaluate_and_sampling_are_repeatable(corpus):
    _, tokenizer, data = corpus
    model = tiny_model(tokenizer)
    first = evaluate(model, {"a": data[:5000], "b": data[5000:10000]}, 4, 2)
    assert first == evaluate(model, {"a": data[:5000], "b": data[5000:10000]}, 4, 2) and list(first) == ["a", "b"]
    with pytest.raises(ValueError, match=r"num_batches must be >= 1, got 0"):
        evaluate(model, {"a": data[:5000]}, 4, 0)  # no batches, no mean loss
    text = sample_text(model, tokenizer, "ROMEO:\n", 30, seed=5)
    assert text.startswith("ROMEO:\n") and len(text) == 37 and text == sample_text(model, tokenizer, "ROMEO:\n", 30, seed=5)


# Checkpoints

def run(model, optimizer, data, tcfg, generator, start, stop, history=None):
    train_data, val_data = split_by_position(data[:20_000])
    return train(model, optimizer, train_data, val_data, tcfg, generator, start, stop, history, progress=False)


@pytest.mark.parametrize("tie_weights", [False, True])
def test_checkpoint_round_trip_is_bit_exact(corpus, tmp_path, tie_weights):
    _, tokenizer, data = corpus
    model = tiny_model(tokenizer, tie_weights=tie_weights)
    optimizer = make_optimizer(model, TCFG)
    generator = torch.Generator().manual_seed(0)
    history = run(model, optimizer, data, TCFG, generator, 0, 3)
    path = save_checkpoint(tmp_path / "ckpt" / "run.pt", model, optimizer, tokenizer, TCFG, 3, generator, history)
    assert path.is_file() and [p.name for p in path.parent.iterdir()] == ["run.pt"]  # no partial file left
    ckpt = load_checkpoint(path)
    inputs, _ = get_batch(data, 2, 16, torch.Generator().manual_seed(9))
    assert torch.equal(ckpt.model(inputs), model(inputs))
    assert ckpt.model.cfg == model.cfg and ckpt.step == 3 and ckpt.train_config == TCFG
    assert ckpt.tokenizer.chars == tokenizer.chars and ckpt.history == history
    assert (ckpt.model.out_head.weight is ckpt.model.embedding.tok_emb.weight) == tie_weights
    assert ckpt.model.cfg.tie_weights == tie_weights
    assert "tie_weights" not in torch.load(path, weights_only=True)  # the config carries it (format v2)
    assert torch.equal(ckpt.generator.get_state(), generator.get_state())
    assert ckpt.optimizer.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()


def test_resume_continues_the_same_trajectory(corpus, tmp_path):
    _, tokenizer, data = corpus
    model = tiny_model(tokenizer, drop_rate=0.1)  # dropout: the resumed run must also get the same masks
    straight = run(model, make_optimizer(model, TCFG), data, TCFG, torch.Generator().manual_seed(0), 0, 12)

    model = tiny_model(tokenizer, drop_rate=0.1)
    optimizer = make_optimizer(model, TCFG)
    generator = torch.Generator().manual_seed(0)
    history = run(model, optimizer, data, TCFG, generator, 0, 5)
    save_checkpoint(tmp_path / "half.pt", model, optimizer, tokenizer, TCFG, 5, generator, history)
    torch.manual_seed(999)  # whatever happens between the sessions
    ckpt = load_checkpoint(tmp_path / "half.pt")
    resumed = run(ckpt.model, ckpt.optimizer, data, ckpt.train_config, ckpt.generator, ckpt.step, 12, ckpt.history)
    assert resumed["loss"] == straight["loss"] and resumed["val_loss"] == straight["val_loss"]
    assert resumed["eval_step"] == [4, 8, 12]


def test_gpt2_tokenizer_is_stored_by_name(tmp_path):
    torch.manual_seed(0)
    model = GPTModel(GPTConfig(vocab_size=50257, context_length=4, emb_dim=8, n_heads=2, n_layers=1))
    path = save_checkpoint(tmp_path / "bpe.pt", model, make_optimizer(model, TCFG), gpt2_tokenizer(), TCFG, 0,
                           torch.Generator())
    assert load_checkpoint(path).tokenizer is gpt2_tokenizer()


def saved(tmp_path, corpus, name="good.pt"):
    model = tiny_model(corpus[1])
    return save_checkpoint(tmp_path / name, model, make_optimizer(model, TCFG), corpus[1], TCFG, 0, torch.Generator())


def edited(tmp_path, corpus, change):
    payload = torch.load(saved(tmp_path, corpus), weights_only=True)
    change(payload)
    torch.save(payload, tmp_path / "edited.pt")
    return tmp_path / "edited.pt"


def test_missing_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"No such file or directory: '.*nowhere.pt'"):  # Python's own
        load_checkpoint(tmp_path / "nowhere.pt")


def test_truncated_checkpoint(tmp_path, corpus):
    raw = saved(tmp_path, corpus).read_bytes()
    (tmp_path / "cut.pt").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match=r"checkpoint .*cut.pt cannot be read \(.*\): the file is truncated"):
        load_checkpoint(tmp_path / "cut.pt")


def test_a_file_that_is_no_checkpoint(tmp_path):
    (tmp_path / "notes.pt").write_text("hello")
    with pytest.raises(ValueError, match=r"notes.pt cannot be read"):
        load_checkpoint(tmp_path / "notes.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"other.pt has format None, not this version's "
                                         r"'course_lib.training checkpoint v2'; save it again"):
        load_checkpoint(tmp_path / "other.pt")


def test_a_version_1_checkpoint_is_refused_clearly(tmp_path, corpus):
    payload = torch.load(saved(tmp_path, corpus), weights_only=True)
    payload["format"] = "course_lib.training checkpoint v1"
    payload["tie_weights"] = payload["model_config"].pop("tie_weights")  # how v1 stored it
    torch.save(payload, tmp_path / "old.pt")
    with pytest.raises(ValueError, match=r"old.pt has format 'course_lib.training checkpoint v1', not this "
                                         r"version's 'course_lib.training checkpoint v2'; save it again with "
                                         r"save_checkpoint"):
        load_checkpoint(tmp_path / "old.pt")


@pytest.mark.parametrize("change, message", [
    (lambda p: p["model_config"].update(emb_dim=33), r"edited.pt holds a config this version cannot build "
                                                     r"\(emb_dim 33 is not divisible by n_heads 2"),
    (lambda p: p["model"].pop("final_norm.scale"), r"edited.pt is damaged: the stored weights do not fit its own config "
                                                   r"\(Missing key\(s\) in state_dict: \"final_norm.scale\""),
    (lambda p: p["tokenizer"]["chars"].pop(), r"edited.pt is inconsistent: a tokenizer of 64 tokens, a model of 65"),
])
def test_damaged_checkpoints(tmp_path, corpus, change, message):
    with pytest.raises(ValueError, match=message):
        load_checkpoint(edited(tmp_path, corpus, change))


def test_a_checkpoint_without_an_entry_names_it(tmp_path, corpus):
    with pytest.raises(ValueError, match=r"edited.pt lacks optimizer: it is damaged"):
        load_checkpoint(edited(tmp_path, corpus, lambda p: p.pop("optimizer")))


def test_a_checkpoint_of_another_shape_or_vocabulary(tmp_path, corpus):
    path = saved(tmp_path, corpus)
    other = GPTConfig(vocab_size=65, drop_rate=0.0, tie_weights=False, **(TINY | dict(emb_dim=64)))
    with pytest.raises(ValueError, match=r"good.pt holds a model with emb_dim 32 \(you expect 64\); build"):
        load_checkpoint(path, expected_config=other)
    with pytest.raises(ValueError, match=r"good.pt holds another vocabulary than expected_tokenizer; use ckpt.tokenizer"):
        load_checkpoint(path, expected_tokenizer=CharTokenizer.from_text("abc"))
    ckpt = load_checkpoint(path, expected_config=ckpt_cfg(corpus), expected_tokenizer=corpus[1])
    assert ckpt.step == 0


def ckpt_cfg(corpus):
    return GPTConfig(vocab_size=corpus[1].vocab_size, drop_rate=0.0, tie_weights=False, **TINY)


def test_save_checkpoint_errors(tmp_path, corpus):
    model = tiny_model(corpus[1])
    optimizer = make_optimizer(model, TCFG)
    with pytest.raises(TypeError, match=r"model must be a GPTModel, got Linear: save a course_lib GPTModel"):
        save_checkpoint(tmp_path / "x.pt", torch.nn.Linear(2, 2), optimizer, corpus[1], TCFG, 0, torch.Generator())
    with pytest.raises(TypeError, match=r"tokenizer must be a CharTokenizer or gpt2_tokenizer\(\), got dict"):
        save_checkpoint(tmp_path / "x.pt", model, optimizer, {}, TCFG, 0, torch.Generator())
    assert not list(tmp_path.iterdir())


# Checkpoints that save and then cannot load, and misleading messages (issue 14, item 4)

def test_a_history_that_could_not_be_loaded_back_is_refused_at_save(tmp_path, corpus):
    import numpy as np
    model = tiny_model(corpus[1])
    history = training.new_history()
    history["loss"].append(np.float32(2.5))  # e.g. from a float32 array's mean
    with pytest.raises(TypeError, match=r"history\['loss'\]\[0\] is a float32 \(2.5\): store lists of float\(x\)"):
        save_checkpoint(tmp_path / "x.pt", model, make_optimizer(model, TCFG), corpus[1], TCFG, 0,
                        torch.Generator(), history)
    assert not list(tmp_path.iterdir()), "nothing written"
    history["loss"][0] = np.float64(2.5)  # a subclass of float: stored as the plain float 2.5
    ckpt = load_checkpoint(save_checkpoint(tmp_path / "x.pt", model, make_optimizer(model, TCFG), corpus[1], TCFG,
                                           0, torch.Generator(), history))
    assert ckpt.history["loss"] == [2.5] and type(ckpt.history["loss"][0]) is float


def test_any_torch_optimizer_is_saved_and_rebuilt(tmp_path, corpus):
    model = tiny_model(corpus[1])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    path = save_checkpoint(tmp_path / "x.pt", model, optimizer, corpus[1], TCFG, 0, torch.Generator())
    ckpt = load_checkpoint(path)
    assert type(ckpt.optimizer) is torch.optim.SGD and ckpt.optimizer.param_groups[0]["momentum"] == 0.9
    with pytest.raises(ValueError, match=r"optimizer holds a tensor of shape \(65, 32\) that is not a parameter of "
                                         r"the model"):
        save_checkpoint(tmp_path / "y.pt", tiny_model(corpus[1]), optimizer, corpus[1], TCFG, 0, torch.Generator())
    assert not (tmp_path / "y.pt").exists()


def test_directories_are_named_as_directories(tmp_path, corpus):
    model = tiny_model(corpus[1])
    (tmp_path / "runs").mkdir()
    with pytest.raises(IsADirectoryError, match=r"path .*runs is a folder, not a file: save_checkpoint writes one "
                                                r"file; name a file in it, e.g. .*runs/checkpoint.pt"):
        save_checkpoint(tmp_path / "runs", model, make_optimizer(model, TCFG), corpus[1], TCFG, 0, torch.Generator())
    assert list(tmp_path.iterdir()) == [tmp_path / "runs"], "no .partial left behind"
    with pytest.raises(IsADirectoryError, match=r"Is a directory: '.*runs'"):  # Python's own
        load_checkpoint(tmp_path / "runs")


def test_a_failed_save_leaves_no_partial_file(tmp_path, corpus, monkeypatch):
    model = tiny_model(corpus[1])

    def disk_full(payload, path):
        open(path, "wb").write(b"half a checkpoint")
        raise OSError("No space left on device")

    monkeypatch.setattr(training.torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(tmp_path / "x.pt", model, make_optimizer(model, TCFG), corpus[1], TCFG, 0, torch.Generator())
    assert not list(tmp_path.iterdir())


def test_a_device_name_that_does_not_exist_is_named(tmp_path, corpus):
    with pytest.raises(ValueError, match=r"device must be None, a torch.device or a name like 'cpu' or 'cuda', "
                                         r"got 'gpu'"):
        load_checkpoint(saved(tmp_path, corpus), device="gpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_this_machine_lacks_is_not_called_damage(tmp_path, corpus):
    with pytest.raises(ValueError, match=r"cannot move the model to device cuda .*load it with device='cpu'"):
        load_checkpoint(saved(tmp_path, corpus), device="cuda")


def test_an_unknown_tokenizer_kind_is_refused_not_read_as_gpt2(tmp_path, corpus):
    path = edited(tmp_path, corpus, lambda p: p.update(tokenizer={"kind": "sentencepiece"}))
    with pytest.raises(ValueError, match=r"holds a tokenizer this version cannot rebuild \(unknown tokenizer kind "
                                         r"'sentencepiece'"):
        load_checkpoint(path)

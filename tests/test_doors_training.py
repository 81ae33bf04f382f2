"""Issue 30: every public door of course_lib.training, called the way a user who has not read the code might.
One table of cases: ("error", type, fragment of our message naming the argument) or ("result", check).
`python tests/test_doors_training.py` prints how many cases are clear errors, correct results, unclear errors
(an error that does not name the argument) and silent wrong answers."""

import math
import tempfile
from pathlib import Path

import numpy as np
import torch

from course_lib.config import GPTConfig
from course_lib.model import GPTModel
from course_lib.tokenization import CharTokenizer
from course_lib.doors.training import checkpoint_error
from course_lib.training import (
    Checkpoint, TrainConfig, batch_loss, cross_entropy, evaluate, get_batch, load_checkpoint,
    lr_at, make_optimizer, new_history, read_checkpoint, restore_model, sample_text, save_checkpoint,
    split_by_position, tokenizer_from_state, tokenizer_state, train,
)

from doors import door_tests, report

TOK = CharTokenizer("abcdefgh")
CFG = GPTConfig(vocab_size=8, context_length=8, emb_dim=16, n_heads=2, n_layers=1, drop_rate=0.0, qkv_bias=False,
                tie_weights=False)
TCFG = TrainConfig(total_steps=4, batch_size=2, warmup_steps=1, eval_every=2, eval_batches=1)
DATA = torch.arange(64) % 8


def model():
    torch.manual_seed(0)
    return GPTModel(CFG)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def tmp():
    return Path(tempfile.mkdtemp())


def saved(**overrides):
    "A checkpoint path written with the given arguments to save_checkpoint replaced."
    m = model()
    args = dict(path=tmp() / "c.pt", model=m, optimizer=make_optimizer(m, TCFG), tokenizer=TOK, tcfg=TCFG, step=1,
                generator=gen(), history=None)
    args.update(overrides)
    return save_checkpoint(**args)


def save_refused(**overrides):
    "save_checkpoint with a bad argument; the error, and that no file (nor .partial) was written."
    path = tmp() / "c.pt"
    try:
        saved(path=path, **overrides)
    finally:
        assert list(path.parent.iterdir()) == [], "a refused save left a file"


def damaged(data: bytes) -> Path:
    path = tmp() / "c.pt"
    path.write_bytes(data)
    return path


def truncated():
    raw = saved().read_bytes()
    return damaged(raw[: len(raw) // 2])


def history_round_trip(history):
    return load_checkpoint(saved(history=history)).history


def train_untouched(**overrides):
    "train with a bad argument must leave the model's weights as they were."
    m = model()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    args = dict(model=m, optimizer=make_optimizer(m, TCFG), train_data=DATA, val_data=DATA, tcfg=TCFG,
                generator=gen(), progress=False)
    args.update(overrides)
    try:
        return train(**args)
    finally:
        assert all(torch.equal(before[k], v) for k, v in m.state_dict().items()), "a refused train changed the model"


LOGITS = torch.randn(2, 3, 8)
TARGETS = torch.randint(0, 8, (2, 3))
REF_LOSS = torch.nn.functional.cross_entropy(LOGITS.flatten(0, 1), TARGETS.flatten())

CASES = [
    # cross_entropy
    ("ce ok", lambda: cross_entropy(LOGITS, TARGETS), "result", lambda r: torch.allclose(r, REF_LOSS)),
    ("ce logits list", lambda: cross_entropy(LOGITS.tolist(), TARGETS), "error", TypeError, "logits"),
    ("ce logits int", lambda: cross_entropy(LOGITS.long(), TARGETS), "error", TypeError, "logits"),
    ("ce logits 2-D", lambda: cross_entropy(LOGITS[0], TARGETS[0]), "error", TypeError, "logits must be"),
    ("ce targets float", lambda: cross_entropy(LOGITS, TARGETS.float()), "error", TypeError, "targets"),
    ("ce targets too big", lambda: cross_entropy(LOGITS, TARGETS + 8), "error", ValueError, "targets holds token id"),
    ("ce targets shape", lambda: cross_entropy(LOGITS, TARGETS[:, :2]), "error", ValueError, "targets has shape"),
    ("ce bf16", lambda: cross_entropy(LOGITS.bfloat16(), TARGETS), "result",
     lambda r: abs(r.float() - REF_LOSS) < 0.05),
    # split_by_position
    ("split ok", lambda: split_by_position(torch.arange(10), 0.2), "result", lambda r: [len(t) for t in r] == [8, 2]),
    ("split list", lambda: split_by_position(list(range(10))), "error", TypeError, "token_ids"),
    ("split 2-D", lambda: split_by_position(torch.arange(10).view(2, 5)), "error", ValueError, "token_ids"),
    ("split frac 0", lambda: split_by_position(torch.arange(10), 0.0), "error", ValueError, "val_fraction"),
    ("split frac 1.5", lambda: split_by_position(torch.arange(10), 1.5), "error", ValueError, "val_fraction"),
    ("split frac nan", lambda: split_by_position(torch.arange(10), math.nan), "error", ValueError, "val_fraction"),
    ("split frac str", lambda: split_by_position(torch.arange(10), "0.1"), "error", TypeError, "val_fraction"),
    ("split frac True", lambda: split_by_position(torch.arange(10), True), "error", TypeError, "val_fraction"),
    # get_batch
    ("batch ok", lambda: get_batch(DATA, 3, 5, gen()), "result",
     lambda r: r[0].shape == (3, 5) and torch.equal(r[0][:, 1:], r[1][:, :-1])),
    ("batch float ids", lambda: get_batch(DATA.float(), 3, 5, gen()), "error", TypeError, "token_ids"),
    ("batch size 0", lambda: get_batch(DATA, 0, 5, gen()), "error", ValueError, "batch_size"),
    ("batch size 2.0", lambda: get_batch(DATA, 2.0, 5, gen()), "error", TypeError, "batch_size"),
    ("batch ctx float", lambda: get_batch(DATA, 2, 5.0, gen()), "error", TypeError, "context_length"),
    ("batch ctx too long", lambda: get_batch(DATA, 2, 64, gen()), "error", ValueError, "context_length"),
    ("batch gen None", lambda: get_batch(DATA, 2, 5, None), "error", TypeError, "generator"),
    ("batch gen int", lambda: get_batch(DATA, 2, 5, 123), "error", TypeError, "generator"),
    ("batch device bad", lambda: get_batch(DATA, 2, 5, gen(), "gpu0"), "error", ValueError, "device"),
    ("batch device meta", lambda: get_batch(DATA, 2, 5, gen(), "meta"), "result", lambda r: r[0].is_meta),
    # batch_loss
    ("loss ok", lambda: batch_loss(model(), DATA[:6].view(2, 3), DATA[1:7].view(2, 3)), "result",
     lambda r: r.ndim == 0 and math.isfinite(r.item())),
    ("loss targets shape", lambda: batch_loss(model(), DATA[:6].view(2, 3), DATA[1:5].view(2, 2)),
     "error", ValueError, "targets"),
    ("loss targets float", lambda: batch_loss(model(), DATA[:6].view(2, 3), DATA[1:7].view(2, 3).float()),
     "error", TypeError, "targets"),
    ("loss targets big", lambda: batch_loss(model(), DATA[:6].view(2, 3), DATA[1:7].view(2, 3) + 8),
     "error", ValueError, "targets"),
    ("loss inputs list", lambda: batch_loss(model(), [[1, 2]], DATA[1:3].view(1, 2)), "error", TypeError, "token_ids"),
    # sample_text
    ("sample ok", lambda: sample_text(model(), TOK, "abc", 4), "result",
     lambda r: r.startswith("abc") and len(r) == 7 and r == sample_text(model(), TOK, "abc", 4)),
    ("sample prompt list", lambda: sample_text(model(), TOK, ["abc"], 4), "error", TypeError, "prompt"),
    ("sample prompt empty", lambda: sample_text(model(), TOK, "", 4), "error", ValueError, "prompt"),
    ("sample seed float", lambda: sample_text(model(), TOK, "abc", 4, seed=1.5), "error", TypeError, "seed"),
    ("sample new -1", lambda: sample_text(model(), TOK, "abc", -1), "error", ValueError, "max_new_tokens"),
    ("sample temp nan", lambda: sample_text(model(), TOK, "abc", 2, temperature=math.nan), "error", ValueError,
     "temperature"),
    # TrainConfig
    ("tcfg steps 0", lambda: TrainConfig(total_steps=0), "error", ValueError, "total_steps"),
    ("tcfg lr nan", lambda: TrainConfig(max_lr=math.nan), "error", ValueError, "max_lr"),
    ("tcfg min>max", lambda: TrainConfig(max_lr=1e-3, min_lr=1e-2), "error", ValueError, "min_lr"),
    ("tcfg warmup>=total", lambda: TrainConfig(total_steps=10, warmup_steps=10), "error", ValueError, "warmup_steps"),
    ("tcfg clip 0", lambda: TrainConfig(grad_clip=0), "error", ValueError, "grad_clip"),
    ("tcfg decay inf", lambda: TrainConfig(weight_decay=math.inf), "error", ValueError, "weight_decay"),
    ("tcfg batch 2.0", lambda: TrainConfig(batch_size=2.0), "error", TypeError, "batch_size"),
    # lr_at
    ("lr ok", lambda: [lr_at(s, TCFG) for s in range(4)], "result",
     lambda r: r[1] == TCFG.max_lr and math.isclose(r[-1], TCFG.min_lr)),
    ("lr step -1", lambda: lr_at(-1, TCFG), "error", ValueError, "step"),
    ("lr step past", lambda: lr_at(4, TCFG), "error", ValueError, "step 4"),
    ("lr step float", lambda: lr_at(1.0, TCFG), "error", TypeError, "step"),
    ("lr tcfg dict", lambda: lr_at(0, {"total_steps": 4}), "error", TypeError, "tcfg"),
    # make_optimizer
    ("optim ok", lambda: make_optimizer(model(), TCFG), "result",
     lambda r: [g["weight_decay"] for g in r.param_groups] == [0.1, 0.0]),
    ("optim tcfg None", lambda: make_optimizer(model(), None), "error", TypeError, "tcfg"),
    ("optim model str", lambda: make_optimizer("gpt2", TCFG), "error", TypeError, "model"),
    # evaluate
    ("eval ok", lambda: evaluate(model(), {"val": DATA}, 2, 2), "result",
     lambda r: set(r) == {"val"} and r == evaluate(model(), {"val": DATA}, 2, 2)),
    ("eval batches 0", lambda: evaluate(model(), {"val": DATA}, 2, 0), "error", ValueError, "num_batches"),
    ("eval splits tensor", lambda: evaluate(model(), DATA, 2, 1), "error", TypeError, "splits"),
    ("eval split list", lambda: evaluate(model(), {"val": DATA.tolist()}, 2, 1), "error", TypeError, "token_ids"),
    ("eval seed float", lambda: evaluate(model(), {"val": DATA}, 2, 1, seed=0.5), "error", TypeError, "seed"),
    # train
    ("train ok", lambda: train_untouched(stop_step=0), "result", lambda r: r["loss"] == []),
    ("train history {}", lambda: train_untouched(history={}), "error", ValueError, "history"),
    ("train history list", lambda: train_untouched(history=[]), "error", ValueError, "history"),
    ("train stop>total", lambda: train_untouched(stop_step=5), "error", ValueError, "stop_step"),
    ("train start -1", lambda: train_untouched(start_step=-1), "error", ValueError, "start_step"),
    ("train gen None", lambda: train_untouched(generator=None), "error", TypeError, "generator"),
    ("train data 2-D", lambda: train_untouched(train_data=DATA.view(8, 8)), "error", ValueError, "train_data"),
    ("train val float", lambda: train_untouched(val_data=DATA.float()), "error", TypeError, "val_data"),
    ("train data big ids", lambda: train_untouched(train_data=DATA + 8), "error", ValueError, "train_data"),
    ("train optim None", lambda: train_untouched(optimizer=None), "error", TypeError, "optimizer"),
    # tokenizer_state / tokenizer_from_state
    ("tokstate ok", lambda: tokenizer_from_state(tokenizer_state(TOK)).chars, "result", lambda r: r == TOK.chars),
    ("tokstate str", lambda: tokenizer_state("gpt2"), "error", TypeError, "tokenizer"),
    ("tokfrom None", lambda: tokenizer_from_state(None), "error", ValueError, "in state None"),
    ("tokfrom no chars", lambda: tokenizer_from_state({"kind": "char"}), "error", ValueError, "chars"),
    ("tokfrom kind", lambda: tokenizer_from_state({"kind": "bpe"}), "error", ValueError, "unknown tokenizer kind"),
    # save_checkpoint
    ("save ok", lambda: load_checkpoint(saved(step=3)).step, "result", lambda r: r == 3),
    ("save other vocab", lambda: save_refused(tokenizer=CharTokenizer("abc")), "error", ValueError, "tokenizer"),
    ("save step -1", lambda: save_refused(step=-1), "error", ValueError, "step"),
    ("save step past", lambda: save_refused(step=5), "error", ValueError, "step"),
    ("save gen None", lambda: save_refused(generator=None), "error", TypeError, "generator"),
    ("save model str", lambda: save_refused(model="m"), "error", TypeError, "model"),
    ("save tcfg dict", lambda: save_refused(tcfg={}), "error", TypeError, "tcfg"),
    ("save history tensor", lambda: save_refused(history={"loss": [torch.tensor(1.0)]}), "error", TypeError,
     "history"),
    ("save history int keys", lambda: save_refused(history={1: [2.0]}), "error", TypeError, "history"),
    ("save history list", lambda: save_refused(history=[1.0]), "error", TypeError, "history"),
    ("save history tuple", lambda: save_refused(history={"loss": (1.0, 2.0)}), "error", TypeError,
     "history['loss'] is a tuple"),  # JSON would bring it back as a list
    ("save history np32", lambda: save_refused(history={"loss": [np.float32(0.5)]}), "error", TypeError,
     "history['loss'][0] is a float32"),
    ("save history np64", lambda: history_round_trip({"loss": [np.float64(0.5)]}), "result",
     lambda r: r == {"loss": [0.5]} and type(r["loss"][0]) is float),  # a float subclass: the same value
    ("save history new", lambda: history_round_trip(new_history()), "result", lambda r: r == new_history()),
    ("save optim sgd", lambda: load_checkpoint(saved_with(lambda m: torch.optim.SGD(m.parameters(), 0.1))).optimizer,
     "result", lambda r: type(r) is torch.optim.SGD),
    # any torch.optim optimizer (and notebook 16's Muon) round-trips: the next step is the uninterrupted run's
    ("resume adamw 1 group", lambda: resumes_exactly(lambda m: torch.optim.AdamW(m.parameters())), "result", bool),
    ("resume sgd momentum", lambda: resumes_exactly(lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)),
     "result", bool),
    ("resume adam", lambda: resumes_exactly(lambda m: torch.optim.Adam(m.parameters(), lr=1e-3)), "result", bool),
    ("resume make_optimizer", lambda: resumes_exactly(lambda m: make_optimizer(m, TCFG)), "result", bool),
    ("resume muon", lambda: resumes_exactly(muon), "result", bool),
    ("save optim foreign", lambda: save_refused(optimizer=torch.optim.SGD(model().parameters(), 0.1)), "error",
     ValueError, "not a parameter of the model"),
    ("save optim misses one", lambda: save_refused(**partial_optimizer()), "error", ValueError,
     "optimizer lacks the model's parameter out_head.weight"),
    ("save optim twice", lambda: save_refused(**doubled_optimizer()), "error", ValueError, "twice"),
    ("save optim not one", lambda: save_refused(optimizer="adamw"), "error", TypeError, "optimizer must be"),
    ("save optim local class", lambda: save_refused(optimizer=local_optimizer()), "error", TypeError,
     "would not import"),
    ("save onto a folder", lambda: save_onto_folder(), "error", IsADirectoryError, "is a folder"),
    # read_checkpoint / load_checkpoint / restore_model / checkpoint_error
    ("load truncated", lambda: load_checkpoint(truncated()), "error", ValueError, "cannot be read"),
    ("load json", lambda: load_checkpoint(damaged(b'{"a": 1}')), "error", ValueError, "cannot be read"),
    ("load empty", lambda: load_checkpoint(damaged(b"")), "error", ValueError, "cannot be read"),
    ("load missing", lambda: load_checkpoint(tmp() / "none.pt"), "error", FileNotFoundError, "none.pt"),
    ("load other format", lambda: load_checkpoint(damaged_payload(format="x")), "error", ValueError, "format"),
    ("load no tokenizer", lambda: load_checkpoint(damaged_payload(tokenizer=None)), "error", ValueError,
     "tokenizer"),
    ("load no step", lambda: load_checkpoint(damaged_payload(drop="step")), "error", ValueError, "step"),
    ("load no generator", lambda: load_checkpoint(damaged_payload(drop="generator")), "error", ValueError,
     "generator"),
    ("load bad device", lambda: load_checkpoint(saved(), device="gpu"), "error", ValueError, "device"),
    ("load device meta", lambda: load_checkpoint(saved(), device="meta"), "error", ValueError, "meta"),
    ("load step -5", lambda: load_checkpoint(damaged_payload(step=-5)), "error", ValueError, "step -5"),
    ("load step past", lambda: load_checkpoint(damaged_payload(step=9)), "error", ValueError, "step 9"),
    ("load history str", lambda: load_checkpoint(damaged_payload(history="abc")), "error", ValueError,
     "holds history str 'abc'"),
    ("load generator str", lambda: load_checkpoint(damaged_payload(generator="x")), "error", ValueError,
     "generator"),
    ("load model list", lambda: load_checkpoint(damaged_payload(model=[1])), "error", ValueError, "model"),
    ("load optim class os", lambda: load_checkpoint(damaged_payload(optimizer_class="os:system")), "error",
     ValueError, "optimizer class"),
    ("load optim groups short", lambda: load_checkpoint(damaged_payload(optimizer_groups=[["out_head.weight"]])),
     "error", ValueError, "optimizer_groups"),
    ("load optim groups unknown", lambda: load_checkpoint(renamed_group()), "error", ValueError, "optimizer_groups"),
    ("load old v2 file", lambda: load_checkpoint(old_v2()).optimizer, "result",
     lambda r: type(r) is torch.optim.AdamW and [g["weight_decay"] for g in r.param_groups] == [0.1, 0.0]),
    ("load expected cfg dict", lambda: load_checkpoint(saved(), expected_config={}), "error", TypeError,
     "expected_config"),
    ("load expected other", lambda: load_checkpoint(saved(), expected_config=GPTConfig()), "error", ValueError,
     "you expect"),
    ("load expected tok", lambda: load_checkpoint(saved(), expected_tokenizer=CharTokenizer("abcdefgi")), "error",
     ValueError, "expected_tokenizer"),
    ("read ok", lambda: read_checkpoint(saved())["step"], "result", lambda r: r == 1),
    ("restore ok", lambda: restore_model("p", torch.load(saved(), weights_only=True), CFG, TCFG,
                                         torch.device("cpu"))[0].cfg, "result", lambda r: r == CFG),
    ("ckpt error", lambda: str(checkpoint_error("p", "is odd")), "result", lambda r: r.startswith("checkpoint p")),
    ("ckpt dataclass", lambda: Checkpoint(None, None, None, TCFG, 0, gen(), None).step, "result", lambda r: r == 0),
]


def saved_with(make_optimizer_of):
    m = model()
    return saved(model=m, optimizer=make_optimizer_of(m))


def muon(m):
    from course_lib.modern import make_muon  # notebook 16's optimizer: Muon for the blocks' matrices, AdamW else
    return make_muon(m, TCFG)


INPUTS = DATA[:12].view(2, 6)


def one_step(m, optimizer):
    optimizer.zero_grad()
    batch_loss(m, INPUTS, (INPUTS + 1) % 8).backward()
    optimizer.step()


def same(a, b) -> bool:
    "Equal values, tensors bit for bit, in nested dicts, lists and tuples."
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def resumes_exactly(make_optimizer_of) -> bool:
    "Train 2 steps, save, load; the loaded optimizer equals the saved one and the next step gives the same weights."
    m = model()
    optimizer = make_optimizer_of(m)
    one_step(m, optimizer)
    one_step(m, optimizer)
    ckpt = load_checkpoint(saved(model=m, optimizer=optimizer, step=2))
    assert type(ckpt.optimizer) is type(optimizer), type(ckpt.optimizer)
    assert same(ckpt.optimizer.state_dict(), optimizer.state_dict()), "groups' hyperparameters and state"
    one_step(m, optimizer)
    one_step(ckpt.model, ckpt.optimizer)
    return all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), ckpt.model.state_dict().values()))


def partial_optimizer():
    m = model()
    kept = [p for name, p in m.named_parameters() if name != "out_head.weight"]
    return dict(model=m, optimizer=torch.optim.AdamW(kept))


def doubled_optimizer():
    m = model()
    params = list(m.parameters())
    optimizer = torch.optim.AdamW(params)
    optimizer.param_groups[0]["params"].append(params[0])  # torch only warns of this at construction
    return dict(model=m, optimizer=optimizer)


def local_optimizer():
    class MySGD(torch.optim.SGD):
        pass
    return MySGD(model().parameters(), lr=0.1)


def save_onto_folder():
    folder = tmp() / "runs"
    folder.mkdir()
    try:
        saved(path=folder)
    finally:
        assert list(folder.parent.iterdir()) == [folder] and not list(folder.iterdir()), "a refused save wrote"


def renamed_group():
    payload = torch.load(saved(), weights_only=True)
    payload["optimizer_groups"][0][0] = "no.such.weight"
    path = tmp() / "c.pt"
    torch.save(payload, path)
    return path


def old_v2():
    "A checkpoint as save_checkpoint wrote it before optimizers were described (the format is the same v2)."
    payload = torch.load(saved(), weights_only=True)
    for key in ("optimizer_class", "optimizer_groups", "optimizer_defaults"):
        del payload[key]
    path = tmp() / "c.pt"
    torch.save(payload, path)
    return path


def damaged_payload(drop=None, **changes):
    payload = torch.load(saved(), weights_only=True)
    payload.update(changes)
    payload.pop(drop, None)
    path = tmp() / "c.pt"
    torch.save(payload, path)
    return path


test_door = door_tests(CASES)


if __name__ == "__main__":  # the counts of issue 30's closing note
    report(CASES)

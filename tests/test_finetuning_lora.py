"""Issue 32, LoRA from scratch: course_lib.finetuning equals Hugging Face's PEFT, its doors give clear errors, and
check_lora_linear names each planted LoRA bug.

The PEFT twin of a course model: the model is written with save_gpt2, read back by transformers'
GPT2LMHeadModel, and wrapped by peft.get_peft_model with the same rank and alpha on the layers that map one to one,

    att.out_proj <-> attn.c_proj,   ff.fc <-> mlp.c_fc,   ff.proj <-> mlp.c_proj

(Hugging Face's layers are Conv1D, weights stored (in, out), hence fan_in_fan_out=True). Not the attention's
queries, keys and values: GPT-2 fuses them into one c_attn layer, and one LoRA on c_attn has a single A of shape
(r, emb_dim) shared by the three and one B of shape (3 * emb_dim, r), while LoRA on W_query, W_key and W_value has
three A matrices of their own: the same trainable shapes hold different functions, so neither can be set equal to
the other. Both sides then get the same A and B, and go through the same AdamW steps on the same batch."""

import copy
import math
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.checks import CheckFailed, check_lora_linear
from course_lib.config import GPTConfig
from course_lib.finetuning import (LoRALinear, apply_lora, find_lora_targets, load_lora_state_dict, lora_layers,
                                   lora_state_dict, merge_lora, unmerge_lora)
from course_lib.model import GPTModel
from course_lib.pretrained import load_shakespeare_gpt, save_gpt2

from doors import door_tests, report

PAIRS = {"att.out_proj": "attn.c_proj", "ff.fc": "mlp.c_fc", "ff.proj": "mlp.c_proj"}  # ours -> Hugging Face's
ALL_SIX = ["att.W_query", "att.W_key", "att.W_value", "att.out_proj", "ff.fc", "ff.proj"]
CFG = GPTConfig(vocab_size=50, context_length=16, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0)


def small_model(seed: int = 0, **changes) -> GPTModel:
    """A small GPTModel with weights large enough (std 0.2) that its logits differ clearly from token to token."""
    torch.manual_seed(seed)
    model = GPTModel(GPTConfig(**{**CFG.__dict__, **changes}))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    return model.eval()


def peft_twin(model: GPTModel, r: int, alpha: float):
    """The model as Hugging Face GPT-2 (written by save_gpt2), wrapped by PEFT's LoRA on the three paired layers."""
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2LMHeadModel

    folder = save_gpt2(model, Path(tempfile.mkdtemp()) / "gpt")
    hf = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=list(PAIRS.values()), fan_in_fan_out=True,
                        lora_dropout=0.0)
    return get_peft_model(hf, config).to(model.out_head.weight.dtype).eval()  # the adapters too


def paired_layers(ours: GPTModel, twin) -> list[tuple[LoRALinear, nn.Module]]:
    """(our LoRALinear, PEFT's LoRA layer) for every paired layer of every block."""
    blocks = twin.base_model.model.transformer.h
    return [(ours.get_submodule(f"trf_blocks.{i}.{mine}"), blocks[i].get_submodule(theirs))
            for i in range(len(blocks)) for mine, theirs in PAIRS.items()]


def lora_pair(model: GPTModel, r: int = 4, alpha: float = 8, b_start: str = "random"):
    """Our LoRA model and its PEFT twin with equal A and B: B random (std 0.1, so the adapters change the output
    from the first step) or zero (LoRA's own start)."""
    twin = peft_twin(model, r, alpha)
    ours = copy.deepcopy(model)
    apply_lora(ours, list(PAIRS), r=r, alpha=alpha)
    torch.manual_seed(1)
    with torch.no_grad():
        for mine, theirs in paired_layers(ours, twin):
            if b_start == "random":
                mine.lora_B.normal_(0.0, 0.1)
            theirs.lora_A["default"].weight.copy_(mine.lora_A)  # (r, in) on both sides
            theirs.lora_B["default"].weight.copy_(mine.lora_B)  # (out, r) on both sides
    return ours, twin


def logits_of(model, ids):
    return model(ids) if isinstance(model, GPTModel) else model(input_ids=ids).logits


def train_steps(model, ids, steps: int = 3) -> None:
    """`steps` AdamW steps on next-token cross-entropy over one batch, on the trainable parameters only."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    for _ in range(steps):
        logits = logits_of(model, ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def max_diff(a, b) -> float:
    return (a.detach() - b.detach()).abs().max().item()


# ------------------------------------------------------------------------------------------------ equal to PEFT

# Float32 forwards agree to rounding (about 1e-6 here). Adam divides each gradient by its own running size, so a
# rounding-level difference in a near-zero gradient becomes a difference of the order of the learning rate in the
# step: the training comparisons run in float64, where both sides agree to about 1e-14.
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("b_start", ["zero", "random"])
def test_lora_equals_peft_before_and_after_three_adamw_steps(b_start, dtype):
    atol = TOLERANCE[dtype]
    ours, twin = lora_pair(small_model().to(dtype), b_start=b_start)
    ids = torch.randint(0, CFG.vocab_size, (3, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert max_diff(logits_of(ours, ids), logits_of(twin, ids)) < atol
        if b_start == "zero":  # B = 0: our model computes exactly what the pretrained model computed
            assert torch.equal(logits_of(ours, ids), small_model().to(dtype)(ids))
    if dtype != torch.float64:
        return
    train_steps(ours, ids)
    train_steps(twin, ids)
    with torch.no_grad():
        assert max_diff(logits_of(ours, ids), logits_of(twin, ids)) < atol
        for mine, theirs in paired_layers(ours, twin):
            assert max_diff(mine.lora_A, theirs.lora_A["default"].weight) < atol
            assert max_diff(mine.lora_B, theirs.lora_B["default"].weight) < atol
            assert mine.lora_B.abs().max() > 0  # trained: B moved even from zero


def test_lora_equals_peft_on_the_shipped_model():
    model, tokenizer = load_shakespeare_gpt()
    ours, twin = lora_pair(model.double(), r=8, alpha=16)
    ids = torch.tensor([tokenizer.encode("To be, or not to be, that is the question:\nWhether 'tis nobler")])
    with torch.no_grad():
        assert max_diff(logits_of(ours, ids), logits_of(twin, ids)) < 1e-10
    train_steps(ours, ids)
    train_steps(twin, ids)
    with torch.no_grad():
        assert max_diff(logits_of(ours, ids), logits_of(twin, ids)) < 1e-10


def test_trainable_parameter_count_equals_peft():
    for model, r in ((small_model(), 4), (load_shakespeare_gpt()[0], 8)):
        ours, twin = lora_pair(model, r=r, alpha=2 * r)
        trainable = sum(p.numel() for p in ours.parameters() if p.requires_grad)
        theirs, _ = twin.get_nb_trainable_parameters()
        d, n = model.cfg.emb_dim, model.cfg.n_layers
        assert trainable == theirs == n * r * ((d + d) + (d + 4 * d) + (4 * d + d))


def test_gradients_reach_only_a_and_b_and_equal_peft():
    ours, twin = lora_pair(small_model().double())
    ids = torch.randint(0, CFG.vocab_size, (2, 10), generator=torch.Generator().manual_seed(3))
    for model in (ours, twin):
        logits = logits_of(model, ids[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).backward()
    adapters = {id(p) for layer in lora_layers(ours).values() for p in (layer.lora_A, layer.lora_B)}
    for name, p in ours.named_parameters():
        if id(p) in adapters:
            assert p.requires_grad and p.grad is not None and p.grad.abs().max() > 0, name
        else:
            assert not p.requires_grad and p.grad is None, name
    for mine, theirs in paired_layers(ours, twin):
        assert max_diff(mine.lora_A.grad, theirs.lora_A["default"].weight.grad) < 1e-10
        assert max_diff(mine.lora_B.grad, theirs.lora_B["default"].weight.grad) < 1e-10


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_merge_equals_peft_merge_and_unmerge_restores(dtype):
    logits_atol, weight_atol = {torch.float32: (1e-5, 1e-6), torch.float64: (1e-10, 1e-12)}[dtype]
    ours, twin = lora_pair(small_model().to(dtype))
    ids = torch.randint(0, CFG.vocab_size, (2, 12), generator=torch.Generator().manual_seed(4))
    weights = {name: p.detach().clone() for name, p in ours.named_parameters() if not p.requires_grad}
    with torch.no_grad():
        unmerged = logits_of(ours, ids)
        merge_lora(ours)
        twin.merge_adapter()
        assert all(layer.merged for layer in lora_layers(ours).values())
        assert max_diff(logits_of(ours, ids), unmerged) < logits_atol
        assert max_diff(logits_of(twin, ids), logits_of(ours, ids)) < logits_atol
        for mine, theirs in paired_layers(ours, twin):  # Conv1D stores (in, out): our (out, in) transposed
            assert max_diff(mine.weight.T, theirs.base_layer.weight) < weight_atol
        unmerge_lora(ours)
        assert all(max_diff(p, weights[name]) < weight_atol for name, p in ours.named_parameters() if name in weights)
        assert max_diff(logits_of(ours, ids), unmerged) < logits_atol


def test_a_merged_model_saves_as_plain_gpt2():
    """After merge_lora, save_gpt2 writes the fine-tuned model as ordinary GPT-2 weights that transformers reads."""
    from transformers import GPT2LMHeadModel

    ours, _ = lora_pair(small_model())
    ids = torch.randint(0, CFG.vocab_size, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = ours(ids)
        merge_lora(ours)
        folder = save_gpt2(ours, Path(tempfile.mkdtemp()) / "merged")
        hf = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
        assert max_diff(hf(input_ids=ids).logits, expected) < 1e-5


# -------------------------------------------------------------------------------------------- course_lib alone

def test_apply_lora_names_layers_in_model_order_and_freezes_the_rest():
    model = small_model()
    names = apply_lora(model, ["ff.fc", "att.W_query", "ff.fc"], r=2, alpha=4)
    assert names == ["trf_blocks.0.att.W_query", "trf_blocks.0.ff.fc", "trf_blocks.1.att.W_query",
                     "trf_blocks.1.ff.fc"]
    assert sorted(lora_layers(model)) == sorted(names)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {f"{n}.lora_{x}" for n in names for x in "AB"}
    assert find_lora_targets(small_model(), ["trf_blocks.1.ff.proj"]) == ["trf_blocks.1.ff.proj"]


def test_lora_state_dict_holds_only_the_adapters_and_loads_back():
    model = small_model()
    apply_lora(model, ALL_SIX, r=2, alpha=4)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.normal_()
    state = lora_state_dict(model)
    assert len(state) == 2 * 6 * CFG.n_layers and all(k.endswith((".lora_A", ".lora_B")) for k in state)
    fresh = small_model()
    apply_lora(fresh, ALL_SIX, r=2, alpha=4)
    load_lora_state_dict(fresh, state)
    ids = torch.randint(0, CFG.vocab_size, (2, 8))
    with torch.no_grad():
        assert torch.equal(fresh(ids), model(ids))
    state["trf_blocks.0.ff.fc.lora_A"] += 1  # a copy: changing it leaves the model alone
    assert not torch.equal(lora_layers(model)["trf_blocks.0.ff.fc"].lora_A, state["trf_blocks.0.ff.fc.lora_A"])


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_lora_keeps_the_dtype(dtype):
    layer = LoRALinear(nn.Linear(8, 4).to(dtype), r=2, alpha=4)
    assert layer.lora_A.dtype == layer.lora_B.dtype == dtype
    assert layer(torch.randn(3, 8, dtype=dtype)).dtype == dtype


def test_a_layer_without_bias_and_the_untied_head():
    model = small_model(qkv_bias=False, tie_weights=False)
    names = apply_lora(model, ["att.W_key", "out_head"], r=2, alpha=2)
    assert names[-1] == "out_head" and lora_layers(model)["out_head"].bias is None
    ids = torch.randint(0, CFG.vocab_size, (1, 6))
    with torch.no_grad():
        assert torch.equal(model(ids), small_model(qkv_bias=False, tie_weights=False)(ids))


# ----------------------------------------------------------------------------------------------------- the doors

def lora_model(target: str = "ff.fc"):
    model = small_model()
    apply_lora(model, [target], r=2, alpha=4)
    return model


def merged_model():
    model = lora_model()
    merge_lora(model)
    return model


def twice(action):
    model = lora_model()
    action(model)
    action(model)


CASES = {
    "LoRALinear of a Conv1d": (lambda: LoRALinear(nn.Conv1d(4, 4, 1), 2, 4), ("error", TypeError, "linear must be a Linear")),
    "LoRALinear r=0": (lambda: LoRALinear(nn.Linear(4, 4), 0, 4), ("error", ValueError, "r must be >= 1, got 0")),
    "LoRALinear r=2.0": (lambda: LoRALinear(nn.Linear(4, 4), 2.0, 4), ("error", TypeError, "r must be an int")),
    "LoRALinear alpha=0": (lambda: LoRALinear(nn.Linear(4, 4), 2, 0), ("error", ValueError, "alpha must be in (0, inf)")),
    "LoRALinear alpha nan": (lambda: LoRALinear(nn.Linear(4, 4), 2, math.nan), ("error", ValueError, "alpha must be in")),
    "apply_lora r=0": (lambda: apply_lora(small_model(), ["ff.fc"], 0, 4), ("error", ValueError, "r must be >= 1")),
    "apply_lora r=-3": (lambda: apply_lora(small_model(), ["ff.fc"], -3, 4), ("error", ValueError, "r must be >= 1")),
    "apply_lora alpha=-1": (lambda: apply_lora(small_model(), ["ff.fc"], 2, -1), ("error", ValueError, "alpha must be")),
    "apply_lora not a model": (lambda: apply_lora("gpt", ["ff.fc"], 2, 4), ("error", TypeError, "model must be a Module")),
    "apply_lora unknown name": (lambda: apply_lora(small_model(), ["attn.c_proj"], 2, 4),
                                ("error", ValueError, "no layer of the model is named 'attn.c_proj': its linear layers "
                                                      "are ['att.W_key', 'att.W_query'")),
    "apply_lora a string": (lambda: apply_lora(small_model(), "ff.fc", 2, 4), ("error", TypeError, "non-empty list")),
    "apply_lora empty list": (lambda: apply_lora(small_model(), [], 2, 4), ("error", TypeError, "non-empty list")),
    "apply_lora a non-string name": (lambda: apply_lora(small_model(), [3], 2, 4),
                                     ("error", TypeError, "each target name must be a str")),
    "apply_lora not a Linear": (lambda: apply_lora(small_model(), ["ff"], 2, 4),
                                ("error", TypeError, "trf_blocks.0.ff is a FeedForward, not an nn.Linear")),
    "apply_lora twice": (lambda: apply_lora(lora_model(), ["ff.fc"], 2, 4), ("error", ValueError, "already has LoRA")),
    "apply_lora tied head": (lambda: apply_lora(small_model(), ["out_head"], 2, 4),
                             ("error", ValueError, "out_head's weight is shared with ['embedding.tok_emb.weight']")),
    "merge_lora without LoRA": (lambda: merge_lora(small_model()), ("error", ValueError, "call apply_lora")),
    "merge_lora twice": (lambda: twice(merge_lora), ("error", RuntimeError, "is already merged")),
    "unmerge_lora unmerged": (lambda: unmerge_lora(lora_model()), ("error", RuntimeError, "is not merged")),
    "merge() twice": (lambda: twice(lambda m: m.trf_blocks[0].ff.fc.merge()), ("error", RuntimeError, "already merged")),
    "lora_state_dict without LoRA": (lambda: lora_state_dict(small_model()), ("error", ValueError, "call apply_lora")),
    "load into other layers": (lambda: load_lora_state_dict(lora_model(), lora_state_dict(lora_model("ff.proj"))),
                               ("error", ValueError, "missing ['trf_blocks.0.ff.fc.lora_A'")),
    "load another rank": (lambda: load_lora_state_dict(lora_model(), {k: torch.zeros(3, v.shape[1]) if k.endswith("A")
                                                                      else torch.zeros(v.shape[0], 3) for k, v in
                                                                      lora_state_dict(lora_model()).items()}),
                          ("error", ValueError, "with the rank r used when it was saved")),
    "load not a dict": (lambda: load_lora_state_dict(lora_model(), [1]), ("error", TypeError, "state must be a dict")),
    "load into a merged model": (lambda: load_lora_state_dict(merged_model(), lora_state_dict(lora_model())),
                                 ("error", RuntimeError, "unmerge_lora(model) before loading")),
}

test_door = door_tests(CASES)


def test_failed_merge_leaves_the_model_as_it_was():
    model = lora_model()
    model.trf_blocks[1].ff.fc.merge()  # one layer merged by hand
    weight = model.trf_blocks[0].ff.fc.weight.detach().clone()
    with pytest.raises(RuntimeError, match="trf_blocks.1.ff.fc is already merged"):
        merge_lora(model)
    assert torch.equal(model.trf_blocks[0].ff.fc.weight, weight) and not model.trf_blocks[0].ff.fc.merged


# --------------------------------------------------------------------------------- the exercise check, planted bugs

def make_lora(bug=None):
    """A learner's LoRA layer, written independently of course_lib, with one named bug planted (None: correct)."""

    class LearnerLoRA(nn.Module):
        def __init__(self, linear, r, alpha):
            super().__init__()
            self.base = linear
            if bug != "not_frozen":
                for p in self.base.parameters():
                    p.requires_grad = False
            n_out, n_in = linear.weight.shape
            a_shape = (n_in, r) if bug == "a_transposed" else (r, n_in)
            self.lora_A = nn.Parameter(torch.zeros(a_shape) if bug == "both_zero" else 0.3 * torch.randn(a_shape))
            self.lora_B = nn.Parameter(torch.randn(n_out, r) if bug == "b_random" else torch.zeros(n_out, r))
            scales = {"no_scale": 1.0, "scale_inverted": r / alpha, "scale_alpha": alpha}
            self.scaling = scales.get(bug, alpha / r)
            self.is_merged = False

        def forward(self, x):
            y = self.base(x)
            if self.is_merged and bug != "merge_keeps_path":
                return y
            A, B = (self.lora_A.detach(), self.lora_B.detach()) if bug == "detached" else (self.lora_A, self.lora_B)
            path = torch.matmul(torch.matmul(x, A.t()), B.t()) * self.scaling
            return y - path if bug == "subtracts" else y + path

        def delta(self):
            update = (self.lora_B @ self.lora_A) * (1.0 if bug == "merge_no_scale" else self.scaling)
            square = update.shape[0] == update.shape[1]  # "_square": a transpose only where it fits, silently
            return update.t() if bug == "merge_transpose" or (bug == "merge_transpose_square" and square) else update

        def merge(self):
            sign = {"merge_sign": -1.0, "merge_noop": 0.0}.get(bug, 1.0)
            with torch.no_grad():
                self.base.weight.add_(sign * self.delta())
            self.is_merged = True

        def unmerge(self):
            sign = {"merge_sign": -1.0, "merge_noop": 0.0, "unmerge_adds": -1.0}.get(bug, 1.0)
            with torch.no_grad():
                self.base.weight.sub_(sign * self.delta())
            self.is_merged = bug == "unmerge_keeps_flag"

    return LearnerLoRA


# (check, learner, bug, what the message must name); rows shaped like tests/test_checks.py's PLANTED
LORA_PLANTED = [
    (check_lora_linear, make_lora, "b_random", "B not zero at the start"),
    (check_lora_linear, make_lora, "both_zero", "both zero"),
    (check_lora_linear, make_lora, "a_transposed", "lora_A is transposed"),
    (check_lora_linear, make_lora, "no_scale", "the scale alpha / r is forgotten"),
    (check_lora_linear, make_lora, "scale_inverted", r"the scale is upside down: r / alpha"),
    (check_lora_linear, make_lora, "scale_alpha", "the scale is alpha, not alpha / r"),
    (check_lora_linear, make_lora, "subtracts", "the low-rank path is subtracted"),
    (check_lora_linear, make_lora, "not_frozen", "the base weight is not frozen"),
    (check_lora_linear, make_lora, "detached", "lora_A gets no gradient"),
    (check_lora_linear, make_lora, "merge_sign", "merge with the wrong sign"),
    (check_lora_linear, make_lora, "merge_transpose", "merge with the transpose"),
    # on a square layer (such as att.out_proj) the transposed update fits the weight: no error, a wrong weight
    (check_lora_linear, make_lora, "merge_transpose_square", "(?s)square 5 -> 5 layer, the weight.*merge with the "
                                                             "transpose"),
    (check_lora_linear, make_lora, "merge_no_scale", r"the scale is forgotten in merge\(\)"),
    (check_lora_linear, make_lora, "merge_noop", r"merge\(\) did not change the weight"),
    (check_lora_linear, make_lora, "merge_keeps_path", "the update counts twice"),
    (check_lora_linear, make_lora, "unmerge_adds", r"unmerge\(\) adds the update again"),
    (check_lora_linear, make_lora, "unmerge_keeps_flag", "no longer adds the low-rank path"),
]
LORA_CORRECT = [(check_lora_linear, LoRALinear, "merges exactly"), (check_lora_linear, make_lora, "merges exactly")]


@pytest.mark.parametrize(("check", "code", "bug", "match"), LORA_PLANTED, ids=[row[2] for row in LORA_PLANTED])
def test_check_lora_linear_names_each_planted_bug(check, code, bug, match):
    with pytest.raises(CheckFailed, match=match) as info:
        check(code(bug))
    assert str(info.value).startswith("check_lora_linear: ") and "\nLikely bug: " in str(info.value)


@pytest.mark.parametrize(("check", "code", "praise"), LORA_CORRECT, ids=["course_lib", "learner"])
def test_check_lora_linear_passes_correct_code(check, code, praise, capsys):
    check(code() if code is make_lora else code)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("check_lora_linear: all ") and praise in lines[0], lines


def test_check_lora_linear_rejects_an_instance():
    with pytest.raises(TypeError, match="expects your class, not an instance"):
        check_lora_linear(LoRALinear(nn.Linear(4, 4), 2, 4))


if __name__ == "__main__":  # the counts of clear errors, correct results, unclear errors, silent wrong answers
    report(CASES)

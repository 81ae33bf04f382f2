# %% [markdown] id="title-14"
# # 14 · Fine-tuning: a classifier, LoRA from scratch, and instruction following
#
# **What you will build.** Three ways to make the pretrained Shakespeare model of notebooks 09 and 10 do a new job.
# LoRA first: a small trainable correction beside frozen weights, proven equal to Hugging Face's PEFT. Then a
# classifier that names the play a passage comes from, trained four ways against two baselines. Then a chat format,
# a loss that counts only the answers, and instructions whose answers a program can check. It all becomes
# `course_lib/finetuning.py`.
#
# **What you need to know.** Notebooks 05 to 10: the model, its training loop and the shipped model.

# %% [markdown]
# ## 1. LoRA from scratch
#
# *By the end of this section you can write `LoRALinear`, put it in place of named layers with `apply_lora`, merge
# it into the weights and out again, and save only the adapters.*
#
# **What you will build.** `LoRALinear`, a linear layer whose pretrained weight stays frozen while a small
# low-rank correction learns; `apply_lora`, which puts it in place of the layers you name; `merge_lora` and
# `unmerge_lora`, which fold the correction into the weight for inference and take it out again; and
# `lora_state_dict`, which saves only what was trained.
#
# **What you need.** The linear layers of the transformer block (notebooks 05 and 06), the training step of
# notebook 09 and the shipped Shakespeare model of notebook 10.
#
# **Where it sits in the diagram.** Inside every transformer block: the four attention projections and the two
# feed-forward layers are the `nn.Linear` layers that LoRA can wrap. Nothing else in the model changes.
#
# `tests/test_finetuning_lora.py` proves the result equal to Hugging Face's PEFT library: same outputs before
# and after training steps, the same number of trainable parameters, and the same merged weights.

# %% id="setup-14"
#| default_exp finetuning
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.pretrained import load_shakespeare_gpt

torch.manual_seed(123)
torch.set_num_threads(1)  # the course's thread policy, measured in the README's "Performance"
torch.set_printoptions(precision=4)
plt.rcParams.update({"font.size": 13})

# %% id="lora-imports"
#| export
import math
import re

import torch
import torch.nn.functional as F
from fastcore.basics import patch
from torch import Tensor, nn

from course_lib.guards import check_int, check_number, check_type

# %% [markdown]
# ### Why a low-rank update is enough
#
# Full fine-tuning changes every weight matrix $W$ (shape `(out_features, in_features)`) by some update
# $\Delta W$ of the same shape, and the optimizer keeps two more tensors of that shape (Adam's moments) for each.
# Hu et al. ("LoRA: Low-Rank Adaptation of Large Language Models", 2021) measured that the updates which adapt a
# pretrained model to a new task are close to matrices of low rank, and proposed to train them in that form from
# the start:
#
# $$\Delta W = B A, \qquad B \in \mathbb{R}^{d_\text{out} \times r},\quad A \in \mathbb{R}^{r \times d_\text{in}},
# \qquad r \ll \min(d_\text{in}, d_\text{out}).$$
#
# $B A$ has the shape of $W$ but rank at most $r$, and it costs $r\,(d_\text{in} + d_\text{out})$ numbers instead
# of $d_\text{in}\, d_\text{out}$. For the first feed-forward layer of GPT-2 small (768 -> 3072):

# %%
d_in, d_out, r = 768, 3072, 8
full, low_rank = d_in * d_out, r * (d_in + d_out)
print(f"full update: {full:,} numbers; rank {r}: {low_rank:,} numbers ({low_rank / full:.2%} of full)")

# %% [markdown]
# ### The layer
#
# A LoRA layer computes the frozen layer and adds the low-rank path beside it:
#
# $$h = x W^\top + b + \frac{\alpha}{r}\, x A^\top B^\top.$$
#
# Three choices make it work:
#
# - **B starts at zero.** Then $B A = 0$ and the wrapped model computes exactly what the pretrained model
#   computed: fine-tuning starts from the model we trust, not from a perturbed one.
# - **A starts random.** The gradient of $B$ is proportional to $A x$, so with a random $A$ the very first step
#   moves $B$; the gradient of $A$ is proportional to $B$, so $A$ starts to move once $B$ has. With both at zero
#   neither would ever move. We draw $A$ from the same uniform range as `nn.Linear`, $\pm 1/\sqrt{d_\text{in}}$.
# - **The scale $\alpha / r$.** Adam moves every entry of $A$ and $B$ by about the learning rate per step,
#   whatever $r$ is, so the size of the change to $h$ grows with $r$. Dividing by $r$ removes that growth: with
#   $\alpha$ fixed you can try another rank without finding a new learning rate.
#
# The class keeps the wrapped layer's own `weight` and `bias` tensors (the same objects, now frozen), so the
# model's parameter names stay what they were and only `lora_A` and `lora_B` are new.

# %% id="lora-linear"
#| export
class LoRALinear(nn.Module):
    """A frozen nn.Linear plus a trainable low-rank update: x W^T + b + (alpha / r) x A^T B^T, with A of shape
    (r, in_features) random and B of shape (out_features, r) zero, so at the start it equals the layer it wraps."""

    def __init__(self, linear: nn.Linear, r: int, alpha: float):
        super().__init__()
        check_type("linear", linear, nn.Linear, "wrap an existing layer, e.g. LoRALinear(block.att.out_proj, 8, 16)")
        check_int("r", r, minimum=1)
        check_number("alpha", alpha, 0, low_open=True, why="the update is multiplied by alpha / r")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight.requires_grad_(False)  # (out, in): the pretrained tensor itself, frozen
        self.bias = linear.bias.requires_grad_(False) if linear.bias is not None else None  # (out,) or None
        self.r, self.alpha, self.scale = r, alpha, alpha / r
        like = dict(dtype=linear.weight.dtype, device=linear.weight.device)
        bound = 1 / math.sqrt(self.in_features)  # nn.Linear's own range
        self.lora_A = nn.Parameter(torch.empty(r, self.in_features, **like).uniform_(-bound, bound))  # (r, in)
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, r, **like))  # (out, r): B A = 0 at the start
        self.merged = False  # True once merge() has added B A to the weight

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight, self.bias)  # (..., out): the frozen layer
        if self.merged:  # the update already sits inside the weight
            return y
        return y + (x @ self.lora_A.T @ self.lora_B.T) * self.scale  # (..., in) -> (..., r) -> (..., out)

# %% [markdown]
# One layer, 16 -> 12 features with rank 2: the wrapped layer has 2 * (16 + 12) = 56 trainable numbers, and at the
# start it gives exactly the output of the layer it wraps (assert `torch.equal`, not a tolerance: $B = 0$).

# %%
linear = nn.Linear(16, 12)
x = torch.randn(3, 5, 16)  # (batch, tokens, in_features)
before = linear(x)  # (3, 5, 12)
lora = LoRALinear(linear, r=2, alpha=4)
trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
print("lora_A", tuple(lora.lora_A.shape), "lora_B", tuple(lora.lora_B.shape), "scale", lora.scale)
print(f"trainable {trainable} of {sum(p.numel() for p in lora.parameters())} parameters")
assert trainable == 2 * (16 + 12) and torch.equal(lora(x), before)

# %% [markdown]
# ### Merging for inference
#
# After training, $W + \frac{\alpha}{r} B A$ is one matrix of the shape of $W$, `(out_features, in_features)`:
# $B A$ is `(out, r) @ (r, in)`, so it needs no transpose. Adding it to the weight gives back a plain linear layer
# that costs nothing extra at inference. `unmerge` subtracts the same product to return to training; the
# subtraction gives back the original weight up to float rounding, not bit for bit.

# %% id="lora-merge"
#| export
@patch
def merge(self: LoRALinear) -> None:
    """Add (alpha / r) B A into the frozen weight, so that forward is a single linear layer again."""
    if self.merged:
        raise RuntimeError("this LoRALinear is already merged: merging twice would add the update twice; "
                           "call unmerge() first")
    with torch.no_grad():
        self.weight += self.scale * (self.lora_B @ self.lora_A)  # (out, r) @ (r, in) -> (out, in), like W
    self.merged = True

# %% id="lora-unmerge"
#| export
@patch
def unmerge(self: LoRALinear) -> None:
    """Take (alpha / r) B A out of the weight again, to go on training the adapters."""
    if not self.merged:
        raise RuntimeError("this LoRALinear is not merged: nothing to unmerge (call merge() first)")
    with torch.no_grad():
        self.weight -= self.scale * (self.lora_B @ self.lora_A)  # (out, in)
    self.merged = False

# %% [markdown]
# Give $B$ some values (as training would), then compare the merged layer with the unmerged one. The two orders
# of summation differ by float rounding, so the cell asserts a bound and prints the bound.

# %%
with torch.no_grad():
    lora.lora_B.normal_(0.0, 0.1)
unmerged = lora(x)  # (3, 5, 12)
weight_before = lora.weight.clone()
lora.merge()
assert (lora(x) - unmerged).abs().max() < 1e-5
lora.unmerge()
assert (lora.weight - weight_before).abs().max() < 1e-6
print("merged output = unmerged output within 1e-5; unmerge restores the weight within 1e-6")

# %% [markdown]
# ### Which layers
#
# The LoRA paper adapted the query and value projections; many later recipes adapt every linear layer of the
# block. `apply_lora` takes the names of the layers as our model calls them, without the block number:
# `"att.W_query"`, `"att.W_key"`, `"att.W_value"`, `"att.out_proj"`, `"ff.fc"`, `"ff.proj"` (and `"out_head"`
# when the head is not tied to the embedding). It first freezes the whole model, so the adapters are all that
# trains, then puts a `LoRALinear` in place of each layer it finds. A layer whose weight is shared (a tied head)
# is refused: merging would change the embedding too.

# %% id="find-lora-targets"
#| export
def find_lora_targets(model: nn.Module, target_names) -> list[str]:
    """The full names of the nn.Linear layers of `model` named by `target_names` ("ff.fc" finds
    trf_blocks.0.ff.fc, trf_blocks.1.ff.fc, ...), or a clear error for a name that finds none."""
    if isinstance(target_names, str) or not isinstance(target_names, (list, tuple)) or not target_names:
        raise TypeError(f"target_names must be a non-empty list of layer names such as ['att.out_proj', 'ff.fc'], "
                        f"got {target_names!r}")
    modules = dict(model.named_modules())
    linear_names = sorted({re.sub(r"^trf_blocks\.\d+\.", "", n) for n, m in modules.items()
                           if isinstance(m, (nn.Linear, LoRALinear))})
    found = []
    for target in target_names:
        check_type("each target name", target, str, "write the layer's name, e.g. 'att.out_proj'")
        names = [n for n in modules if n == target or n.endswith("." + target)]
        if not names:
            raise ValueError(f"no layer of the model is named {target!r}: its linear layers are {linear_names}")
        for name in names:
            if isinstance(modules[name], LoRALinear):
                raise ValueError(f"{name} already has LoRA: apply_lora once per model (start from a fresh copy "
                                 "to try another rank)")
            if not isinstance(modules[name], nn.Linear):
                raise TypeError(f"{name} is a {type(modules[name]).__name__}, not an nn.Linear: name one of the "
                                f"linear layers {linear_names}")
        found += names
    return [n for n in modules if n in found]  # in the model's order, each once

# %% id="apply-lora"
#| export
def apply_lora(model: nn.Module, target_names, r: int, alpha: float) -> list[str]:
    """Freeze every parameter of `model` and replace each layer named by `target_names` with a LoRALinear of rank
    r and scale alpha / r, in place. Returns the full names of the layers replaced."""
    check_type("model", model, nn.Module, "pass the model to fine-tune, e.g. a GPTModel")
    check_int("r", r, minimum=1)
    check_number("alpha", alpha, 0, low_open=True, why="the update is multiplied by alpha / r")
    names = find_lora_targets(model, target_names)
    owners = {}  # id of each parameter -> every name it has (a tied weight has two)
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    for name in names:
        shared = owners[id(model.get_submodule(name).weight)]
        if len(shared) > 1:
            raise ValueError(f"{name}'s weight is shared with {[s for s in shared if s != name + '.weight']}: merging "
                             "an update into it would change them too; leave it out of target_names")
    model.requires_grad_(False)  # the adapters made below are the only trainable parameters
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, child, LoRALinear(getattr(owner, child), r, alpha))
    return names

# %% id="lora-layers"
#| export
def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """Every LoRALinear of `model`, by its full name; an error if there is none."""
    check_type("model", model, nn.Module, "pass the model you called apply_lora on")
    layers = {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}
    if not layers:
        raise ValueError("the model has no LoRALinear layers: call apply_lora(model, target_names, r, alpha) first")
    return layers

# %% id="merge-lora"
#| export
def merge_lora(model: nn.Module) -> None:
    """Merge every LoRA layer of `model` (W <- W + (alpha / r) B A): inference at the cost of the plain model."""
    layers = lora_layers(model)
    merged = [name for name, layer in layers.items() if layer.merged]
    if merged:  # checked before any change, so an error leaves the model as it was
        raise RuntimeError(f"{merged[0]} is already merged: call unmerge_lora(model) first")
    for layer in layers.values():
        layer.merge()

# %% id="unmerge-lora"
#| export
def unmerge_lora(model: nn.Module) -> None:
    """Undo merge_lora: take (alpha / r) B A out of every weight again, to go on training."""
    layers = lora_layers(model)
    unmerged = [name for name, layer in layers.items() if not layer.merged]
    if unmerged:
        raise RuntimeError(f"{unmerged[0]} is not merged: call merge_lora(model) first")
    for layer in layers.values():
        layer.unmerge()

# %% [markdown]
# ### What to save
#
# The frozen weights are the pretrained model's, which everyone already has. What fine-tuning produced is only
# `lora_A` and `lora_B` of each layer: `lora_state_dict` returns those, and `load_lora_state_dict` puts them
# into a model prepared with the same `apply_lora` call, checking that every name and shape matches.

# %% id="lora-state-dict"
#| export
def lora_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """Only the adapters, {"<layer>.lora_A": (r, in), "<layer>.lora_B": (out, r)}, detached copies."""
    state = {}
    for name, layer in lora_layers(model).items():
        state[f"{name}.lora_A"] = layer.lora_A.detach().clone()
        state[f"{name}.lora_B"] = layer.lora_B.detach().clone()
    return state

# %% id="load-lora-state-dict"
#| export
def load_lora_state_dict(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Copy adapters saved by lora_state_dict into a model given the same apply_lora call (unmerged)."""
    layers = lora_layers(model)
    check_type("state", state, dict, "pass the dictionary that lora_state_dict returned")
    params = {f"{n}.{p}": getattr(layer, p) for n, layer in layers.items() for p in ("lora_A", "lora_B")}
    missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
    if missing or unexpected:
        raise ValueError(f"state does not fit this model's adapters: missing {missing[:4]}, unexpected "
                         f"{unexpected[:4]}; call apply_lora with the same target_names as when it was saved")
    for key, p in params.items():
        if not isinstance(state[key], Tensor) or state[key].shape != p.shape:
            raise ValueError(f"state[{key!r}] has shape {tuple(getattr(state[key], 'shape', ()))}, the model's "
                             f"has {tuple(p.shape)}: call apply_lora with the rank r used when it was saved")
    merged = [n for n, layer in layers.items() if layer.merged]
    if merged:
        raise RuntimeError(f"{merged[0]} is merged: call unmerge_lora(model) before loading other adapters")
    with torch.no_grad():
        for key, p in params.items():
            p.copy_(state[key])

# %% [markdown]
# ### LoRA on the Shakespeare model
#
# The shipped model of notebook 10 has four blocks of width 256. Wrap all six projections of every block with
# rank 8 and $\alpha = 16$, and count: the model has the same total as before plus the adapters, and only the
# adapters train.

# %%
model, tokenizer = load_shakespeare_gpt()
total_before = sum(p.numel() for p in model.parameters())
token_ids = torch.tensor([tokenizer.encode("To be, or not to be, that is the question:")])  # (1, 43)
with torch.no_grad():
    logits_before = model(token_ids)  # (1, 43, 65)
targets = ["att.W_query", "att.W_key", "att.W_value", "att.out_proj", "ff.fc", "ff.proj"]
wrapped = apply_lora(model, targets, r=8, alpha=16)
trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
total = sum(p.numel() for p in model.parameters())
print(f"{len(wrapped)} layers wrapped, e.g. {wrapped[:2]}")
print(f"model before LoRA: {total_before:,} parameters; after: {total:,}")
print(f"trainable: {trainable:,} ({trainable / total:.2%} of the model)")

# %% [markdown]
# Each block adds $8 \cdot (256 + 256)$ for each of the four attention projections and $8 \cdot (256 + 1024)$ for
# each of the two feed-forward layers. At the start the model's logits are exactly those of the pretrained model.

# %%
per_block = 4 * 8 * (256 + 256) + 2 * 8 * (256 + 1024)
assert trainable == 4 * per_block and total == total_before + trainable
with torch.no_grad():
    assert torch.equal(model(token_ids), logits_before)
print(f"{per_block:,} adapter parameters per block x 4 blocks = {4 * per_block:,}; logits unchanged at the start")

# %% [markdown]
# How the trainable count grows with the rank, against fine-tuning every weight of the model (log scale). The
# count is proportional to $r$: on a model this narrow, large ranks soon cost a sizeable share of the model.

# %%
ranks = [1, 2, 4, 8, 16, 32, 64]
counts = [4 * (4 * rk * (256 + 256) + 2 * rk * (256 + 1024)) for rk in ranks]  # adapters for all six projections
assert counts[3] == trainable and all(c < total_before / 2 for c in counts)
fig, ax = plt.subplots(figsize=(8, 4))
ax.bar([str(rk) for rk in ranks], counts, color="tab:blue", label="LoRA adapters (six projections)")
ax.axhline(total_before, color="tab:red", linestyle="--", label="full fine-tuning (every weight)")
ax.set_yscale("log")
ax.set_xlabel("rank r")
ax.set_ylabel("trainable parameters")
ax.set_title("Shakespeare model: what LoRA trains")
ax.set_ylim(1e4, 3e7)
ax.legend(loc="upper left")
plt.show()
print(f"rank 1: {counts[0] / total_before:.2%} of the model's parameters; rank 64: {counts[-1] / total_before:.0%}")

# %% [markdown]
# ### A few training steps
#
# Teach the model one line it has never read, with AdamW on the adapters alone. Afterwards the frozen weights
# are bit for bit what they were, every frozen parameter has no gradient, and both $A$ and $B$ have one.

# %%
frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
line = torch.tensor([tokenizer.encode("The low rank adapter learns while the pretrained weights stay frozen.\n")])
inputs, labels = line[:, :-1], line[:, 1:]  # (1, 69) each
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0)
model.train()
losses = []
for step in range(20):
    loss = F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
model.eval()
assert losses[-1] < losses[0] / 2
assert all(torch.equal(p, frozen_before[n]) for n, p in model.named_parameters() if not p.requires_grad)
assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.requires_grad)
print("after 20 steps the loss on the line is below half its first value; frozen weights untouched")

# %% [markdown]
# Merge for inference: the merged model gives the unmerged model's logits (within float rounding), and unmerging
# returns to the weights it started from.

# %%
with torch.no_grad():
    logits_lora = model(token_ids)  # (1, 43, 65)
    merge_lora(model)
    logits_merged = model(token_ids)
    unmerge_lora(model)
assert (logits_merged - logits_lora).abs().max() < 1e-4
assert all((p - frozen_before[n]).abs().max() < 1e-6 for n, p in model.named_parameters() if not p.requires_grad)
print("merged logits = unmerged logits within 1e-4; unmerge restores the weights within 1e-6")

# %% [markdown]
# The adapters alone are what to ship: a fresh copy of the pretrained model, given the same `apply_lora` call and
# these tensors, computes what the fine-tuned model computes.

# %%
adapters = lora_state_dict(model)
adapter_bytes = sum(t.numel() * t.element_size() for t in adapters.values())
print(f"{len(adapters)} tensors, {adapter_bytes / 1e6:.2f} MB, against {total_before * 4 / 1e6:.1f} MB for the model")
fresh, _ = load_shakespeare_gpt()
apply_lora(fresh, targets, r=8, alpha=16)
load_lora_state_dict(fresh, adapters)
with torch.no_grad():
    assert torch.equal(fresh(token_ids), logits_lora)

# %% [markdown]
# ## 2. A classifier from a language model
#
# *By the end of this section you can turn the pretrained model into a classifier that reads its last position,
# and compare a probe, full fine-tuning and LoRA against two baselines on a split with no speech in two parts.*
#
# **What you will build.** A model that reads a passage of Shakespeare and names the play it comes from. Its body
# is the pretrained Shakespeare model of notebook 10; its output head, which scored the 65 possible next
# characters, is replaced by a new linear layer that scores the seven plays. You will compare four ways to train it
# against two baselines: the majority class, a bag-of-characters logistic regression, a linear probe (only the new
# head trains), full fine-tuning (everything trains), and LoRA (the adapters of the previous section and the head).
#
# **What you need.** The GPT model of notebook 07, causal attention (notebook 05), the training step of notebook 09,
# and `apply_lora` from the section above.
#
# **Where it sits in the diagram.** At the very top: `out_head` changes from `emb_dim -> vocab_size` at every
# position to `emb_dim -> num_classes` at one position. Embeddings, blocks and the final norm stay as they are.

# %% id="classifier-imports"
#| export
import json
from dataclasses import dataclass

from course_lib.guards import check_token_tensor
from course_lib.model import GPTModel
from course_lib.tokenization import DATA_DIR, CharTokenizer
from course_lib.training import load_shakespeare

# %% [markdown]
# ### The task: which play?
#
# `shakespeare.txt` has no titles: the seven plays follow each other as one stream of speeches. The script that made
# it, `course_lib/data/make_shakespeare.py`, also recorded where each play starts and ends (character offsets, in
# `shakespeare_plays.json`), so every speech carries a label we did not have to invent. We drop each speech's
# `SPEAKER:` line: a name like `HAMLET` would give the play away, and we want the model to judge by the words.

# %% id="play-speeches"
#| export
PLAYS_FILE = DATA_DIR / "shakespeare_plays.json"  # written by course_lib/data/make_shakespeare.py


def play_speeches(text: str | None = None) -> tuple[list[str], list[int], list[str]]:
    """Every speech of the corpus without its "SPEAKER:" line, the index of its play, and the play names."""
    text = load_shakespeare() if text is None else text
    check_type("text", text, str, "pass the corpus itself, load_shakespeare(), or leave it out")
    plays = json.loads(PLAYS_FILE.read_text(encoding="utf-8"))["plays"]
    if plays[-1]["end"] != len(text):
        raise ValueError(f"text has {len(text):,} characters but {PLAYS_FILE.name} ends at {plays[-1]['end']:,}: "
                         "pass the shipped corpus, load_shakespeare()")
    speeches, labels = [], []
    for label, play in enumerate(plays):
        for block in text[play["start"]:play["end"]].split("\n\n")[:-1]:  # each speech ends with a blank line
            speaker, _, spoken = block.partition(":\n")  # "HAMLET:\nTo be, or not to be ..."
            speeches.append(spoken)
            labels.append(label)
    return speeches, labels, [play["play"] for play in plays]

# %%
speeches, speech_plays, plays = play_speeches()
counts = torch.bincount(torch.tensor(speech_plays))  # (7,) speeches per play
lengths = torch.tensor([len(s) for s in speeches]).float()  # (6777,)
for name, n in zip(plays, counts.tolist()):
    print(f"{name:17} {n:5,} speeches")
print(f"median speech: {lengths.median():.0f} characters; {(lengths < 128).float().mean():.0%} are shorter than 128")
assert sum(counts) == 6777

# %% [markdown]
# Most speeches are short: "Ay, my lord." names no play. So a passage is a run of consecutive speeches of one play,
# joined until it has at least 128 characters, and we keep its last 128: the model's whole context. Before we cut
# anything into train, validation and test, we decide what the unit is: the passage. Cutting windows from the
# running text would let one speech sit in the training set and, shifted by a few characters, in the test set: the
# test would then measure memory, not reading. Grouping whole speeches into passages and splitting the passages
# means no speech is in two splits. The split is stratified (each play keeps its share in each split) and seeded.

# %% id="split-by-group"
#| export
def stratified_split(labels: list[int], fractions: tuple[float, ...], seed: int) -> list[Tensor]:
    """Indices of the items in each split: every class is shuffled (seeded) and cut by `fractions`, so each
    split holds about the same share of every class, and every item is in exactly one split."""
    check_type("labels", labels, list, "pass one int label per item")
    check_type("fractions", fractions, tuple, "pass e.g. (0.8, 0.1, 0.1)")
    if not fractions or any(not isinstance(f, float) or f <= 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions must be positive floats that sum to 1, got {fractions}")
    check_int("seed", seed)
    generator = torch.Generator().manual_seed(seed)
    labels = torch.tensor(labels)  # (items,)
    splits = [[] for _ in fractions]
    for label in labels.unique():
        members = (labels == label).nonzero().flatten()  # (members,)
        members = members[torch.randperm(len(members), generator=generator)]
        cuts = [round(len(members) * sum(fractions[:k + 1])) for k in range(len(fractions))]
        for k, (lo, hi) in enumerate(zip([0] + cuts[:-1], cuts)):
            splits[k].append(members[lo:hi])
    return [torch.cat(parts).sort().values for parts in splits]

# %% id="passages"
#| export
@dataclass
class Passages:
    """Labelled passages as a batch: token_ids (n, max_chars), right-padded with id 0; lengths (n,), the
    number of real tokens of each; labels (n,), the class of each; source (n,), the speech each came from."""
    token_ids: Tensor
    lengths: Tensor
    labels: Tensor
    source: Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index) -> "Passages":
        return Passages(self.token_ids[index], self.lengths[index], self.labels[index], self.source[index])

# %% id="encode-passages"
#| export
def encode_passages(texts: list[str], labels: list[int], tokenizer: CharTokenizer, max_chars: int) -> Passages:
    """The last max_chars characters of each text (all of a shorter one), as one right-padded batch."""
    check_type("texts", texts, list, "pass a list of strings")
    check_int("max_chars", max_chars, minimum=1)
    if len(texts) != len(labels) or not texts:
        raise ValueError(f"texts ({len(texts)}) and labels ({len(labels)}) must have one label per text, and not 0")
    empty = [i for i, text in enumerate(texts) if not text]
    if empty:
        raise ValueError(f"texts[{empty[0]}] is empty: a passage needs at least one character")
    token_ids = torch.zeros(len(texts), max_chars, dtype=torch.long)  # (n, max_chars): id 0 pads
    lengths = torch.zeros(len(texts), dtype=torch.long)  # (n,)
    for i, text in enumerate(texts):
        ids = tokenizer.encode(text[-max_chars:])  # the end of the passage
        token_ids[i, :len(ids)] = torch.tensor(ids)
        lengths[i] = len(ids)
    return Passages(token_ids, lengths, torch.tensor(labels), torch.arange(len(texts)))

# %% id="play-passages"
#| export
def play_passages(tokenizer: CharTokenizer, max_chars: int = 128, min_chars: int = 128, seed: int = 0,
                  fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> tuple[dict[str, Passages], list[str]]:
    """The play task. Consecutive speeches of a play are joined (one per line) until the group has at least
    min_chars characters; each group is one passage (its last max_chars characters), labelled with its play. The
    groups are split into train/val/test, stratified by play, so no speech is in two splits. Returns the splits
    (`source`: the index of each passage's first speech) and the play names."""
    check_int("min_chars", min_chars, minimum=1)
    if not (isinstance(fractions, tuple) and len(fractions) == 3):
        raise ValueError(f"fractions must be three shares (train, val, test) such as (0.8, 0.1, 0.1), got {fractions!r}")
    speeches, labels, names = play_speeches()
    texts, groups, first = [], [], []  # passage text, its play, its first speech
    for i, (speech, label) in enumerate(zip(speeches, labels)):
        if texts and groups[-1] == label and len(texts[-1]) < min_chars:  # the open group needs more
            texts[-1] += "\n" + speech
        else:  # a new play, or the last group is long enough
            texts.append(speech)
            groups.append(label)
            first.append(i)
    data = encode_passages(texts, groups, tokenizer, max_chars)
    data.source = torch.tensor(first)  # (n,): each passage's first speech, an index into play_speeches()
    parts = stratified_split(groups, fractions, seed)
    return {name: data[index] for name, index in zip(["train", "val", "test"], parts)}, names

# %%
model, tokenizer = load_shakespeare_gpt()
splits, plays = play_passages(tokenizer)
train_split, val, test = splits["train"], splits["val"], splits["test"]
print({name: len(part) for name, part in splits.items()}, "passages; token_ids", tuple(train_split.token_ids.shape))
print(repr(tokenizer.decode(test.token_ids[0].tolist())), "->", plays[test.labels[0]])
sources = [set(part.source.tolist()) for part in splits.values()]  # first speech of each passage, per split
assert not (sources[0] & sources[1] or sources[0] & sources[2] or sources[1] & sources[2])
assert sum(map(len, sources)) == len(train_split) + len(val) + len(test)  # each speech is in exactly one passage
print("no passage, so no speech, is in two splits")


# %% [markdown]
# ### Baselines first
#
# A number means little without something to beat. The **majority class** always answers the play with the most
# training passages. The **bag of characters** counts how often each of the 65 characters occurs in a passage and
# feeds those frequencies to one linear layer: a logistic regression that sees which letters a play uses (more `?`,
# more `Th`) but not their order. Both the baseline and the GPT classifier below take `(token_ids, lengths)` and
# return `(batch, num_classes)` logits, so one training loop and one `accuracy` serve them all.

# %% id="check-lengths"
#| export
def check_lengths(lengths: Tensor | None, token_ids: Tensor) -> Tensor:
    """lengths (batch,) of ints in [1, tokens], one per row of token_ids (None: every row is full). Values are
    read only on the CPU, where that is free."""
    if lengths is None:
        return torch.full((len(token_ids),), token_ids.shape[1], device=token_ids.device)  # (batch,)
    if not isinstance(lengths, Tensor) or lengths.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"lengths must be an integer tensor (batch,), got {getattr(lengths, 'dtype', type(lengths))}")
    if lengths.shape != token_ids.shape[:1] or lengths.device != token_ids.device:
        raise ValueError(f"lengths has shape {tuple(lengths.shape)} on {lengths.device}; token_ids "
                         f"{tuple(token_ids.shape)} on {token_ids.device} needs one length per row, on its device")
    if lengths.device.type == "cpu" and not torch.compiler.is_compiling():
        if lengths.min() < 1 or lengths.max() > token_ids.shape[1]:
            raise ValueError(f"lengths must be in [1, {token_ids.shape[1]}] (the real tokens of each row), got "
                             f"values from {lengths.min().item()} to {lengths.max().item()}")
    return lengths

# %% id="bag-of-chars"
#| export
class BagOfChars(nn.Module):
    """The baseline: a passage's character frequencies (order thrown away) -> a linear layer -> class logits.
    Trained, it is a multinomial logistic regression."""

    def __init__(self, vocab_size: int, num_classes: int):
        super().__init__()
        check_int("vocab_size", vocab_size, minimum=1)
        check_int("num_classes", num_classes, minimum=2)
        self.vocab_size = vocab_size
        self.out_head = nn.Linear(vocab_size, num_classes)

    def forward(self, token_ids: Tensor, lengths: Tensor | None = None) -> Tensor:
        check_token_tensor("token_ids", token_ids, dims=2, vocab_size=self.vocab_size)
        lengths = check_lengths(lengths, token_ids)
        real = torch.arange(token_ids.shape[1], device=token_ids.device) < lengths[:, None]  # (batch, tokens)
        counts = (F.one_hot(token_ids, self.vocab_size) * real[..., None]).sum(1)  # (batch, vocab_size)
        return self.out_head(counts / lengths[:, None])  # frequencies (batch, vocab_size) -> (batch, num_classes)

# %% id="train-classifier"
#| export
def train_classifier(model: nn.Module, data: Passages, epochs: int, lr: float, batch_size: int = 32,
                     weight_decay: float = 0.0, seed: int = 0) -> list[float]:
    """AdamW on the parameters of `model` that require grad, cross-entropy on data's labels, `epochs` passes in
    a seeded random order (dropout on). Returns the loss of every step; leaves the model in eval mode."""
    check_type("model", model, nn.Module, "pass a ClassifierGPT or a BagOfChars")
    check_type("data", data, Passages, "build it with play_passages(...) or encode_passages(...)")
    check_int("epochs", epochs, minimum=1)
    check_int("batch_size", batch_size, minimum=1)
    check_number("lr", lr, 0, low_open=True, why="the AdamW learning rate")
    check_number("weight_decay", weight_decay, 0)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no parameter that requires grad: unfreeze the head, e.g. "
                         "model.out_head.requires_grad_(True)")
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    torch.manual_seed(seed)  # the dropout masks
    order = torch.Generator().manual_seed(seed)  # the batches
    device = params[0].device
    losses = []
    model.train()
    for _ in range(epochs):
        for index in torch.randperm(len(data), generator=order).split(batch_size):
            batch = data[index]
            logits = model(batch.token_ids.to(device), batch.lengths.to(device))  # (batch, num_classes)
            loss = F.cross_entropy(logits, batch.labels.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    model.eval()
    return losses

# %% id="accuracy"
#| export
@torch.no_grad()
def accuracy(model: nn.Module, data: Passages, batch_size: int = 256) -> float:
    """The share of data's passages whose highest logit is their label (eval mode, no dropout)."""
    check_type("model", model, nn.Module, "pass a ClassifierGPT or a BagOfChars")
    check_type("data", data, Passages, "build it with play_passages(...) or encode_passages(...)")
    check_int("batch_size", batch_size, minimum=1)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    correct = 0
    for index in torch.arange(len(data)).split(batch_size):
        batch = data[index]
        logits = model(batch.token_ids.to(device), batch.lengths.to(device))  # (batch, num_classes)
        correct += (logits.argmax(-1).cpu() == batch.labels).sum().item()
    model.train(was_training)
    return correct / len(data)

# %%
majority = torch.bincount(train_split.labels).argmax()  # the play with the most training passages
print(f"majority class ({plays[majority]}): test accuracy {(test.labels == majority).float().mean():.3f}")
torch.manual_seed(0)
bag = BagOfChars(tokenizer.vocab_size, len(plays))
losses = train_classifier(bag, train_split, epochs=30, lr=3e-2, batch_size=256, seed=0)
bag_acc = accuracy(bag, test)
print(f"bag of characters: {sum(p.numel() for p in bag.parameters()):,} parameters, test accuracy {bag_acc:.3f}")
assert losses[-1] < losses[0] and bag_acc > (test.labels == majority).float().mean()

# %% [markdown]
# ### Which token's state feeds the head
#
# The language model produces one state per position, `(batch, tokens, emb_dim)`; the head needs one vector per
# passage. Attention in GPT is causal: the state at position $t$ is computed from tokens $0, \dots, t$ only. So the
# state at the **last** real position is the only one that has read the whole passage, and it is the one the
# pretrained model already used to predict what comes next, a task that needs the passage's style and subject.
# The first position has read one character. Check the causal claim on the pretrained model: change the first
# character of a passage and every state changes; change the last one and only the last state changes.

# %%
blocks = nn.Sequential(*model.trf_blocks)
body_only = lambda ids: model.final_norm(blocks(model.embedding(ids)))  # (batch, tokens, emb_dim)
ids = test.token_ids[:1].clone()  # (1, 128)
with torch.no_grad():
    states = body_only(ids)
    first_changed, last_changed = ids.clone(), ids.clone()
    first_changed[0, 0], last_changed[0, -1] = (ids[0, 0] + 1) % 65, (ids[0, -1] + 1) % 65
    moved_by_first = (body_only(first_changed) - states).abs().amax(-1)[0]  # (128,) change at each position
    moved_by_last = (body_only(last_changed) - states).abs().amax(-1)[0]  # (128,)
assert (moved_by_first > 1e-4).all() and (moved_by_last[:-1] == 0).all() and moved_by_last[-1] > 1e-4
print("a new first character changes all 128 states; a new last character changes only the last state")

# %% [markdown]
# `ClassifierGPT` takes the body of a pretrained `GPTModel` (the same modules, not copies) and puts a new
# `out_head` on top. Passages shorter than the context are padded on the right; because attention is causal the
# padding comes after every real token and cannot change its state, so the head reads position `lengths - 1`.

# %% id="classifier-gpt"
#| export
class ClassifierGPT(nn.Module):
    """A GPT body (embeddings, blocks, final norm, taken from `model`, not copied) with a new linear head that
    maps the state of each passage's LAST token to num_classes logits."""

    def __init__(self, model: GPTModel, num_classes: int):
        super().__init__()
        check_type("model", model, GPTModel, "pass a pretrained GPTModel, e.g. load_shakespeare_gpt()[0]")
        check_int("num_classes", num_classes, minimum=2)
        self.cfg = model.cfg
        self.embedding, self.trf_blocks, self.final_norm = model.embedding, model.trf_blocks, model.final_norm
        like = model.final_norm.scale  # the new head gets the body's dtype and device
        self.out_head = nn.Linear(self.cfg.emb_dim, num_classes, dtype=like.dtype, device=like.device)

    def forward(self, token_ids: Tensor, lengths: Tensor | None = None) -> Tensor:
        """token_ids (batch, tokens), right-padded; lengths (batch,) real tokens of each (None: all are real)
        -> logits (batch, num_classes)."""
        check_token_tensor("token_ids", token_ids, dims=2, vocab_size=self.cfg.vocab_size,
                           device=self.out_head.weight.device, max_tokens=self.cfg.context_length)
        lengths = check_lengths(lengths, token_ids)
        x = self.embedding(token_ids)  # (batch, tokens, emb_dim)
        for block in self.trf_blocks:
            x = block(x)  # (batch, tokens, emb_dim)
        x = self.final_norm(x)  # (batch, tokens, emb_dim)
        last = x[torch.arange(len(x), device=x.device), lengths - 1]  # (batch, emb_dim): each passage's last token
        return self.out_head(last)  # (batch, num_classes)

# %%
torch.manual_seed(0)
classifier = ClassifierGPT(load_shakespeare_gpt()[0], num_classes=len(plays))
short = encode_passages(["O Romeo, Romeo! wherefore art thou Romeo?"], [4], tokenizer, max_chars=128)
padded = torch.cat([short.token_ids[:, :short.lengths[0]], torch.zeros(1, 87, dtype=torch.long)], 1)  # (1, 128)
with torch.no_grad():
    alone = classifier(short.token_ids[:, :short.lengths[0]])  # (1, 7): 41 tokens, no padding
    with_padding = classifier(padded, short.lengths)  # (1, 7): 41 tokens + 87 of padding
print("logits", tuple(alone.shape), "for", short.lengths.tolist(), "real tokens")
assert (alone - with_padding).abs().max() < 1e-5  # right padding is invisible to the last real position

# %% [markdown]
# ### Three ways to train it
#
# - **Linear probe.** Freeze the body; only the head's $256 \cdot 7 + 7$ numbers train. It measures what the
#   pretrained state already holds about the play.
# - **Full fine-tuning.** Every weight trains, with a small learning rate so the pretrained body is adjusted, not
#   overwritten.
# - **LoRA.** `apply_lora` freezes the body and adds rank-8 adapters to its six projections; the new head trains too
#   (it is new, so nothing pretrained is there to keep).

# %%
def make_classifier(method: str) -> ClassifierGPT:
    torch.manual_seed(0)  # the head's initial weights
    clf = ClassifierGPT(load_shakespeare_gpt()[0], num_classes=len(plays))
    if method == "probe":
        clf.requires_grad_(False)
    elif method == "lora":
        apply_lora(clf, ["att.W_query", "att.W_key", "att.W_value", "att.out_proj", "ff.fc", "ff.proj"], r=8, alpha=16)
    clf.out_head.requires_grad_(True)
    return clf

trainable = {m: sum(p.numel() for p in make_classifier(m).parameters() if p.requires_grad)
             for m in ("probe", "full", "lora")}
print({m: f"{n:,}" for m, n in trainable.items()})
assert trainable["probe"] == 256 * 7 + 7 and trainable["lora"] == 4 * 8 * (4 * 512 + 2 * 1280) + 256 * 7 + 7

# %% [markdown]
# Training the model takes minutes on a CPU, more than this notebook may spend. Here each method trains for a
# handful of steps on 256 passages, enough to see the machinery work: the loss falls, and for the probe and LoRA
# every pretrained weight is exactly what it was. The full runs are in the table below.

# %%
few = train_split[torch.arange(256)]  # the first 256 training passages
for method, lr in [("probe", 1e-2), ("full", 1e-4), ("lora", 1e-3)]:
    clf = make_classifier(method)
    frozen = {n: p.detach().clone() for n, p in clf.named_parameters() if not p.requires_grad}
    losses = train_classifier(clf, few, epochs=1, lr=lr, batch_size=32, seed=0)
    assert all(torch.equal(p, frozen[n]) for n, p in clf.named_parameters() if not p.requires_grad)
    assert len(losses) == 8 and all(0 < loss < 10 for loss in losses)
    print(f"{method:5}: 8 steps, loss {losses[0]:.1f} -> {losses[-1]:.1f} (not a measurement: 8 steps, 256 passages); "
          f"{len(frozen)} frozen tensors unchanged")

# %% [markdown]
# ### The full runs
#
# `course_lib/data/make_classifier_results.py` trains each method on all training passages (one torch thread,
# seeded) and writes its test accuracy, trainable parameters and seconds to `classifier_results.json`, with the
# command, the machine and the date. The seconds are those of that machine; the notebook prints them but does not
# compare them.

# %%
from course_lib.tokenization import DATA_DIR

results = json.loads((DATA_DIR / "classifier_results.json").read_text(encoding="utf-8"))
print(results["command"], "|", results["passages"])
print(f"{'method':28} {'test acc':>8} {'trainable':>11} {'seconds':>8}")
for row in results["results"]:
    print(f"{row['method']:28} {row['test_accuracy']:8.3f} {row['trainable_parameters']:11,} {row['seconds']:8.0f}")
assert results["passages"] == {name: len(part) for name, part in splits.items()}  # the same split as above
# %% [markdown] id="classifier-results-md"
# Read the table from the top. The bag of characters barely beats always answering the most common play: which
# letters a passage uses says little about its play. The pretrained model's last state says more (the probe), and
# training the body as well adds a little more: full fine-tuning and LoRA end within a passage or two of each
# other, LoRA with under a twentieth of the trainable numbers. All of them stay far from certain on seven plays:
# a 128-character passage of Shakespeare without its speakers' names carries little of its play, and a
# model pretrained on under a million characters has learned little that tells *Hamlet* from *Macbeth*.
# %% [markdown]
# ## 3. Instruction following
#
# *By the end of this section you can grow the vocabulary by chat tokens without changing the old model, train
# on the responses only, measure exact match on held-out instructions, and chat until `<|end|>`.*
#
# **What you will build.** A chat format with three new tokens, `<|user|>`, `<|assistant|>` and `<|end|>`; the
# model grown to know them, with every old weight kept; a loss that counts only the model's side of the
# conversation; a small instruction set whose answers a program can check; and a chat loop that stops when the
# model ends its turn.
#
# **What you need.** The LoRA section above, the training loss of notebook 09, `generate` with `eos_id` from
# notebook 08, and the shipped Shakespeare model of notebook 10.
#
# **Where it sits in the diagram.** At both ends of the model: the token embedding (bottom) and the output head
# (top) get new rows for the new tokens. Everything between them is the pretrained model plus LoRA adapters.
#
# `tests/test_finetuning_chat.py` proves the masked loss equal to the completion-only loss of Hugging Face's TRL
# (`SFTTrainer` with `completion_only_loss=True`) on the same batch, and the grown model's old logits equal to the
# base model's, bit for bit.

# %% id="chat-imports"
#| export
import copy
import json
import random
from dataclasses import replace

from safetensors.torch import load_file

from course_lib.generation import generate
from course_lib.model import GPTModel
from course_lib.pretrained import load_shakespeare_gpt
from course_lib.tokenization import DATA_DIR, CharTokenizer, check_token_ids

# %% [markdown]
# ### A chat format
#
# A pretrained model continues text. To make it answer, we show it many exchanges of one fixed shape and train
# it to produce the answer part:
#
# `<|user|>` instruction `<|assistant|>` response `<|end|>`
#
# Each marker is one new token, not a string of characters: the model can never confuse it with text a user
# typed, and `<|end|>` is a single id that `generate(..., eos_id=...)` can stop at. The ids come after the 65
# characters: 65, 66 and 67.

# %% id="chat-tokens"
#| export
CHAT_TOKENS = ("<|user|>", "<|assistant|>", "<|end|>")  # opens a user's turn, opens the model's turn, ends a turn

# %% [markdown]
# Targets that must not count in the loss get the value -100, the default `ignore_index` of `F.cross_entropy`.

# %% id="ignore-index"
#| export
IGNORE_INDEX = -100  # a target that F.cross_entropy(..., ignore_index=IGNORE_INDEX) leaves out of the loss

# %% [markdown]
# ### Growing the vocabulary
#
# The embedding matrix `tok_emb.weight` has shape `(vocab_size, emb_dim)` = `(65, 256)`, and so has the head
# `out_head.weight`. Three new tokens need three new rows in each. The old rows stay exactly as they were, so on
# text without the new tokens the grown model computes exactly what the old one did: the old tokens' logits are
# unchanged, and each new token only adds one more logit.
#
# What should a new row hold? A random row of the pretrained scale would give the new tokens logits unrelated to
# the model's, sometimes large. Hewitt ("Initializing New Word Embeddings for Pretrained Language Models", 2021)
# proposed the **mean of the old rows**: in the head, the new token's logit is then the mean of the old logits,
# $w_\text{new}^\top h = \frac{1}{V}\sum_i w_i^\top h$, never above the largest one, so the new token starts out
# unlikely everywhere and the model's distribution over the old tokens hardly moves. In the embedding, the mean
# row is a vector of the kind the first block already reads. Training then moves the new rows to where they help.

# %% id="grow-vocabulary"
#| export
@torch.no_grad()
def grow_vocabulary(model: GPTModel, n_new: int) -> GPTModel:
    """A copy of `model` that knows n_new more tokens, numbered after the old ones: the token embedding and the
    output head get n_new new rows, each the mean of the old rows; the old rows are copied bit for bit, and the
    model passed in is left as it was. A tied model stays tied."""
    check_type("model", model, GPTModel, "pass a course_lib GPTModel, e.g. load_shakespeare_gpt()[0]")
    check_int("n_new", n_new, minimum=1)
    grown = copy.deepcopy(model)
    grown.cfg = replace(model.cfg, vocab_size=model.cfg.vocab_size + n_new)

    def with_mean_rows(weight: Tensor) -> nn.Parameter:  # (old, emb_dim) -> (old + n_new, emb_dim)
        mean = weight.float().mean(dim=0, keepdim=True).to(weight.dtype)  # (1, emb_dim), averaged in float32
        return nn.Parameter(torch.cat([weight, mean.expand(n_new, -1)]))

    grown.embedding.tok_emb.weight = with_mean_rows(model.embedding.tok_emb.weight)
    grown.embedding.tok_emb.num_embeddings = grown.cfg.vocab_size
    if model.cfg.tie_weights:  # one matrix, two roles, as before
        grown.out_head.weight = grown.embedding.tok_emb.weight
    else:
        grown.out_head.weight = with_mean_rows(model.out_head.weight)
    grown.out_head.out_features = grown.cfg.vocab_size
    return grown

# %% [markdown]
# Grow the shipped model by the three chat tokens and check the promise on a line of Shakespeare: the first 65
# logits are bit for bit the base model's (`torch.equal`, not a tolerance), and each new logit is the mean of the
# old ones.

# %%
from course_lib.training import load_shakespeare

base, char_tokenizer = load_shakespeare_gpt()
grown = grow_vocabulary(base, len(CHAT_TOKENS))
line = torch.tensor([char_tokenizer.encode("What is the city but the people?")])  # (1, 32)
with torch.no_grad():
    old_logits, new_logits = base(line), grown(line)  # (1, 32, 65) and (1, 32, 68)
assert torch.equal(new_logits[..., :65], old_logits)
assert torch.allclose(new_logits[..., 65:], old_logits.mean(-1, keepdim=True).expand(-1, -1, 3), atol=1e-4)
p_new = new_logits.softmax(-1)[..., 65:].sum(-1).max()
print(f"vocabulary {base.cfg.vocab_size} -> {grown.cfg.vocab_size}; head {tuple(grown.out_head.weight.shape)}")
print(f"the three new tokens together get at most {p_new:.1%} of the probability at any position")

# %% [markdown]
# Only the new rows should train: the old rows hold what pretraining learned. A gradient hook multiplies the
# gradient of the embedding and of the head by a mask that is 0 on the old rows. With weight decay 0, AdamW leaves
# a parameter whose gradient is always zero exactly where it was (its moments stay zero, and so does its step).

# %% id="train-new-rows"
#| export
def train_new_rows(model: GPTModel, first_new: int) -> list[Tensor]:
    """Make the token embedding and the output head trainable, but only their rows first_new, first_new + 1, ...:
    a gradient hook zeroes the gradient of every older row. Train them with weight_decay=0, so that AdamW leaves
    a row whose gradient is always zero exactly as it was. Returns the parameters (one if tied)."""
    check_type("model", model, GPTModel, "pass the model that grow_vocabulary returned")
    check_int("first_new", first_new, minimum=1)
    if first_new >= model.cfg.vocab_size:
        raise ValueError(f"first_new is {first_new}, but the vocabulary has only {model.cfg.vocab_size} tokens: pass "
                         "the old vocabulary size, the id of the first token grow_vocabulary added")
    params = [model.embedding.tok_emb.weight]
    if model.out_head.weight is not params[0]:
        params.append(model.out_head.weight)
    keep_old = torch.ones(model.cfg.vocab_size, 1, device=params[0].device, dtype=params[0].dtype)
    keep_old[:first_new] = 0  # (vocab_size, 1): 0 on the old rows, 1 on the new ones
    for p in params:
        p.requires_grad_(True)
        p.register_hook(lambda grad: grad * keep_old)  # (vocab_size, emb_dim): old rows get no gradient
    return params

# %% [markdown]
# ### The chat tokenizer
#
# `ChatTokenizer` wraps the `CharTokenizer`: it cuts the text at the chat markers, encodes each marker as its one
# id and everything else character by character. `format_chat` writes one exchange; it refuses a text that
# already contains a marker, which would end a turn in the middle.

# %% id="chat-tokenizer"
#| export
class ChatTokenizer:
    """A CharTokenizer plus the chat tokens CHAT_TOKENS, numbered after its characters (65 characters: ids 65,
    66, 67). encode reads each chat token as one id; decode writes it back as its text."""

    def __init__(self, char_tokenizer: CharTokenizer):
        check_type("char_tokenizer", char_tokenizer, CharTokenizer, "pass the model's tokenizer, e.g. "
                   "load_shakespeare_gpt()[1]")
        self.char_tokenizer = char_tokenizer
        n = char_tokenizer.vocab_size
        self.special_ids = {token: n + i for i, token in enumerate(CHAT_TOKENS)}  # "<|user|>" -> 65, ...
        self.user_id, self.assistant_id, self.end_id = self.special_ids.values()
        self.splitter = re.compile("(" + "|".join(re.escape(token) for token in CHAT_TOKENS) + ")")

    @property
    def vocab_size(self) -> int:
        return self.char_tokenizer.vocab_size + len(CHAT_TOKENS)

    def encode(self, text: str) -> list[int]:
        check_type("text", text, str, "decode bytes first with .decode('utf-8')")
        ids = []
        for piece in self.splitter.split(text):  # "<|user|>Hi" -> ["", "<|user|>", "Hi"]
            ids += [self.special_ids[piece]] if piece in self.special_ids else self.char_tokenizer.encode(piece)
        return ids

    def decode(self, ids) -> str:
        n = self.char_tokenizer.vocab_size
        return "".join(CHAT_TOKENS[i - n] if i >= n else self.char_tokenizer.chars[i]
                       for i in check_token_ids(ids, self.vocab_size))

# %% id="format-chat"
#| export
def format_chat(instruction: str, response: str | None = None) -> str:
    """One exchange as text: <|user|>instruction<|assistant|>response<|end|>, or, without a response, the prompt
    that asks the model for one (it ends with <|assistant|>)."""
    for name, text in (("instruction", instruction), ("response", response)):
        if text is None and name == "response":
            continue
        check_type(name, text, str, "pass the text of the turn")
        found = [token for token in CHAT_TOKENS if token in text]
        if found:
            raise ValueError(f"{name} contains the chat token {found[0]!r}: the turn's text may not hold "
                             f"{', '.join(CHAT_TOKENS)}; format_chat adds them itself")
    prompt = f"{CHAT_TOKENS[0]}{instruction}{CHAT_TOKENS[1]}"
    return prompt if response is None else f"{prompt}{response}{CHAT_TOKENS[2]}"

# %%
tokenizer = ChatTokenizer(char_tokenizer)
text = format_chat("Upper case:\nO Rome!", "O ROME!")
ids = tokenizer.encode(text)
print(repr(text))
print(ids)
assert tokenizer.decode(ids) == text and ids[0] == tokenizer.user_id and ids[-1] == tokenizer.end_id

# %% [markdown]
# ### Counting only the response
#
# The model should learn to answer, not to write instructions: a prompt is given, it is not a target. In the
# shifted sequence (inputs = tokens 0..n-2, targets = tokens 1..n-1) every target that is still part of the prompt
# becomes -100, and so does the padding that makes rows the same length. The loss is the mean over what is left:
#
# $$\mathcal{L} = -\frac{1}{|R|}\sum_{t \in R} \log p_\theta(x_{t+1} \mid x_{\le t}),$$
#
# with $R$ the positions whose next token belongs to the response (its `<|end|>` included: the model must learn
# to stop). Over a batch this is the mean over all counted tokens of all rows, as `F.cross_entropy` with
# `ignore_index` computes it, and as TRL computes it.

# %% id="chat-batch"
#| export
def chat_batch(tokenizer: ChatTokenizer, examples, context_length: int) -> tuple[Tensor, Tensor]:
    """Inputs and targets, both (batch, tokens), for (instruction, response) pairs: each row is the exchange of
    format_chat shifted by one, padded on the right with <|end|>. A target is IGNORE_INDEX at every position whose
    next token belongs to the prompt, and on the padding: only the response and its <|end|> count in the loss."""
    check_type("tokenizer", tokenizer, ChatTokenizer, "wrap the model's tokenizer: ChatTokenizer(char_tokenizer)")
    if not isinstance(examples, (list, tuple)) or not examples:
        raise TypeError(f"examples must be a non-empty list of (instruction, response) pairs, got {examples!r}")
    check_int("context_length", context_length, minimum=1)
    rows = []
    for i, pair in enumerate(examples):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise TypeError(f"examples[{i}] must be an (instruction, response) pair of str, got {pair!r}")
        prompt = tokenizer.encode(format_chat(pair[0]))  # <|user|> ... <|assistant|>
        full = tokenizer.encode(format_chat(*pair))  # the prompt, the response, <|end|>
        if len(full) - 1 > context_length:
            raise ValueError(f"examples[{i}] is {len(full)} tokens long, more than context_length + 1 = "
                             f"{context_length + 1}: shorten its instruction or response")
        targets = [IGNORE_INDEX] * (len(prompt) - 1) + full[len(prompt):]  # predict the response only
        rows.append((full[:-1], targets))
    width = max(len(inputs) for inputs, _ in rows)
    inputs = torch.tensor([x + [tokenizer.end_id] * (width - len(x)) for x, _ in rows])  # (batch, width)
    targets = torch.tensor([t + [IGNORE_INDEX] * (width - len(t)) for _, t in rows])  # (batch, width)
    return inputs, targets

# %% id="chat-loss"
#| export
def chat_loss(model: nn.Module, inputs: Tensor, targets: Tensor) -> Tensor:
    """The mean next-token loss over the targets that are not IGNORE_INDEX (the response tokens)."""
    check_type("inputs", inputs, Tensor, "build inputs and targets with chat_batch(...)")
    check_type("targets", targets, Tensor, "build inputs and targets with chat_batch(...)")
    if targets.shape != inputs.shape or targets.dtype != torch.int64:
        raise ValueError(f"targets must be int64 of the inputs' shape {tuple(inputs.shape)}, got {targets.dtype} "
                         f"{tuple(targets.shape)}: build both with chat_batch(...)")
    if targets.device.type == "cpu" and not bool((targets != IGNORE_INDEX).any()):  # the mean of nothing is NaN
        raise ValueError("every target is IGNORE_INDEX: the batch has no response token to learn")
    logits = model(inputs)  # (batch, tokens, vocab_size)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)

# %% [markdown]
# A batch of three exchanges: which targets count. Each row is dark where the prompt is, bright on the response,
# dark again on the padding.

# %%
pairs = [("Upper case:\nO Rome!", "O ROME!"), ("Last word:\nIs it near day?", "day"), ("Speak as BRUTUS.", "BRUTUS:\nPeace!")]
inputs, targets = chat_batch(tokenizer, pairs, grown.cfg.context_length)  # (3, 32) each
counted = targets != IGNORE_INDEX  # (3, 26)
print("inputs", tuple(inputs.shape), "targets", tuple(targets.shape), "counted targets per row", counted.sum(1).tolist())
assert counted.sum(1).tolist() == [len(r) + 1 for _, r in pairs]  # the response and its <|end|>
fig, ax = plt.subplots(figsize=(10, 2.5))
ax.imshow(counted, cmap="viridis", aspect="auto")
ax.set_xlabel("position in the row (input token)")
ax.set_ylabel("example")
ax.set_yticks(range(3))
ax.set_title("Targets the loss counts (bright): the response and <|end|>")
plt.show()
with torch.no_grad():
    print(f"masked loss of the grown, untrained model: {chat_loss(grown, inputs, targets):.2f} nats per token")

# %% [markdown]
# ### An instruction set a program can check
#
# Exact-match accuracy needs answers that are exactly right or wrong. Four tasks made from the corpus, each from
# one or two lines of a speech:
#
# - **speaker**: two short speeches; who speaks second? (the second heading);
# - **upper**: a line rewritten in upper case;
# - **last_word**: the last word of a line, without its punctuation;
# - **continue**: "Speak as BRUTUS.": any answer is right that keeps the speaker format, the heading and then one
#   line of speech.
#
# The split is by instance and by text: training instructions come from the first nine tenths of the corpus, the
# part the model was pretrained on; held-out instructions come from the last tenth, notebook 09's validation part,
# and use no line that occurs anywhere before it. A held-out answer cannot be recalled, only computed.

# %% id="speeches"
#| export
def speeches(text: str) -> list[tuple[str, list[str]]]:
    """The speeches of a stretch of the corpus, in order: (speaker, its lines) for every block "SPEAKER:\\nline\\n...".
    A block cut off at either end of the stretch, with no heading, is left out."""
    check_type("text", text, str, "pass the corpus text, or a part of it")
    found = []
    for block in text.split("\n\n"):
        head, colon, body = block.strip("\n").partition(":\n")
        if colon and body and "\n" not in head and head == head.upper() and head[:1].isalpha():
            found.append((head, body.split("\n")))
    return found

# %% id="last-word"
#| export
def last_word(line: str) -> str:
    """The last word of a line, without the punctuation around it ("Hail, sir!" -> "sir")."""
    words = re.findall(r"[A-Za-z][A-Za-z']*", line)
    return words[-1] if words else ""

# %% id="instruction-tasks"
#| export
INSTRUCTION_TASKS = {  # task -> (instruction, answer) from (speaker, line, the speaker and line before it)
    "speaker": lambda who, line, before, prev: (f"Who speaks second?\n{before}:\n{prev}\n\n{who}:\n{line}", who),
    "upper": lambda who, line, before, prev: (f"Upper case:\n{line}", line.upper()),
    "last_word": lambda who, line, before, prev: (f"Last word:\n{line}", last_word(line)),
    "continue": lambda who, line, before, prev: (f"Speak as {who}.", f"{who}:\n{line}"),
}

# %% id="make-instructions"
#| export
def make_instructions(text: str, per_task: int, seed: int, exclude: str = "", max_line: int = 40) -> list[dict]:
    """`per_task` instructions of each INSTRUCTION_TASKS task, drawn (seeded) from the speeches of `text`: dicts
    {"task", "instruction", "response"}. A line that occurs in `exclude` (e.g. the training text) is never used,
    so held-out answers cannot be recalled; lines are 12 to max_line characters (the speaker task's two: 8 to 28)."""
    check_type("text", text, str, "pass the corpus text, or a part of it")
    check_type("exclude", exclude, str, "pass the text whose lines may not be used, or ''")
    check_int("per_task", per_task, minimum=1)
    check_int("seed", seed)
    check_int("max_line", max_line, minimum=12)
    found = speeches(text)
    pairs = [(who, line, *prev) for (before, lines_before), (who, lines) in zip(found, found[1:])
             for line in lines for prev in [(before, lines_before[-1])] if line not in exclude]
    rng, instructions = random.Random(seed), []
    for task, make in INSTRUCTION_TASKS.items():
        short = (8, 28) if task == "speaker" else (12, max_line)
        pool = [p for p in pairs if short[0] <= len(p[1]) <= short[1] and
                (task != "speaker" or (p[0] != p[2] and short[0] <= len(p[3]) <= short[1]))]
        pool = [p for p in pool if task != "last_word" or last_word(p[1])]
        if len(pool) < per_task:
            raise ValueError(f"text has {len(pool)} usable lines for task {task!r}, fewer than per_task={per_task}: "
                             "pass a longer text or ask for fewer")
        for who, line, before, prev in rng.sample(pool, per_task):
            instruction, response = make(who, line, before, prev)
            instructions.append({"task": task, "instruction": instruction, "response": response})
    return instructions

# %% id="check-reply"
#| export
def check_reply(example: dict, reply: str) -> bool:
    """Whether `reply` answers the instruction `example` (a dict of make_instructions): the exact answer, or, for
    "continue", which has no single answer, the speaker's heading and then one line of speech."""
    check_type("example", example, dict, "pass one dict that make_instructions returned")
    check_type("reply", reply, str, "pass the model's reply, e.g. from chat_reply")
    if example.get("task") not in INSTRUCTION_TASKS or "response" not in example:
        raise ValueError(f"example must have a 'task' among {list(INSTRUCTION_TASKS)} and a 'response', got "
                         f"{sorted(example)}")
    if example["task"] == "continue":
        heading = example["response"].split("\n")[0]  # "MENENIUS:"
        return re.fullmatch(re.escape(heading) + r"\n[^\n]*[A-Za-z][^\n]*", reply) is not None
    return reply == example["response"]

# %%
text = load_shakespeare()
split = int(len(text) * 0.9)  # notebook 09's cut: one character is one token
heldout = make_instructions(text[split:], 3, 1235, exclude=text[:split])
for example in heldout[::3]:
    print(f"[{example['task']}] {example['instruction']!r} -> {example['response']!r}")
assert all(check_reply(e, e["response"]) for e in heldout)

# %% [markdown]
# ### Before fine-tuning
#
# The base model has never seen a chat token. Given the chat prompt it does what it was trained to do, and goes
# on writing a play. Its context of 128 characters leaves no room for a few-shot prompt (one example and the
# question already fill it), so the baseline is zero-shot.

# %% id="chat-reply"
#| export
def chat_reply(model: GPTModel, tokenizer: ChatTokenizer, instruction: str, max_new_tokens: int | None = None,
               temperature: float = 0.0, generator: torch.Generator | None = None) -> str:
    """The model's answer to one instruction: generate from the chat prompt until <|end|> (not included) or
    max_new_tokens (default: all the room left in the context). Greedy unless temperature > 0."""
    check_type("model", model, GPTModel, "pass the fine-tuned model")
    check_type("tokenizer", tokenizer, ChatTokenizer, "wrap the model's tokenizer: ChatTokenizer(char_tokenizer)")
    if tokenizer.vocab_size != model.cfg.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens, the model {model.cfg.vocab_size}: grow "
                         f"the model with grow_vocabulary(model, {len(CHAT_TOKENS)}) first")
    prompt = tokenizer.encode(format_chat(instruction))
    room = model.cfg.context_length - len(prompt)
    if room < 1:
        raise ValueError(f"instruction takes {len(prompt)} tokens with the chat tokens, and the context holds "
                         f"{model.cfg.context_length}: shorten it to leave room for an answer")
    if max_new_tokens is None:
        max_new_tokens = room
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    ids = torch.tensor([prompt], device=model.out_head.weight.device)  # (1, prompt tokens)
    out = generate(model, ids, min(max_new_tokens, room), temperature=temperature, eos_id=tokenizer.end_id,
                   generator=generator)[0, len(prompt):].tolist()  # the new tokens
    return tokenizer.decode(out[:out.index(tokenizer.end_id)] if tokenizer.end_id in out else out)

# %%
for example in heldout[::3]:
    reply = chat_reply(grown, tokenizer, example["instruction"], max_new_tokens=40)
    print(f"[{example['task']}] {reply!r} right: {check_reply(example, reply)}")

# %% [markdown]
# ### Fine-tuning
#
# `course_lib/data/make_shakespeare_chat.py` fine-tunes the grown model with LoRA adapters (rank 8, all six
# projections of every block) and trains the new rows with them, on 6,000 training instructions, with
# `chat_batch` and `chat_loss`. It runs longer than a notebook may, so the course ships its result. A few steps
# here show the loop; the shipped run is the same loop, longer.

# %%
torch.manual_seed(123)
student = grow_vocabulary(base, len(CHAT_TOKENS))
apply_lora(student, ["att.W_query", "att.W_key", "att.W_value", "att.out_proj", "ff.fc", "ff.proj"], r=8, alpha=16)
new_rows = train_new_rows(student, char_tokenizer.vocab_size)
optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.0)
train_set = make_instructions(text[:split], 16, 0)
losses = []
student.train()
for step in range(4):
    batch = [(e["instruction"], e["response"]) for e in train_set[16 * step:16 * step + 16]]
    loss = chat_loss(student, *chat_batch(tokenizer, batch, student.cfg.context_length))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
student.eval()
assert losses[-1] < losses[0] and torch.equal(new_rows[1][:65], base.out_head.weight)
print("4 steps: the masked loss falls below its first value; the old head rows are unchanged")

# %% [markdown]
# What fine-tuning changed, and so what ships, is the adapters and the new rows: not a copy of the model.

# %% id="new-rows"
#| export
NEW_ROWS = ("embedding.tok_emb.new_rows", "out_head.new_rows")  # what a chat adapter adds to lora_state_dict

# %% id="chat-state-dict"
#| export
def chat_state_dict(model: GPTModel, first_new: int) -> dict[str, Tensor]:
    """What fine-tuning for chat changed, and nothing else: the LoRA adapters and the rows of the token embedding
    and of the output head from first_new on (the chat tokens), as detached copies."""
    state = lora_state_dict(model)  # also checks that the model has adapters
    check_int("first_new", first_new, minimum=1)
    if first_new >= model.cfg.vocab_size:
        raise ValueError(f"first_new is {first_new}, but the vocabulary has {model.cfg.vocab_size} tokens: pass the "
                         "old vocabulary size")
    for key, weight in zip(NEW_ROWS, (model.embedding.tok_emb.weight, model.out_head.weight)):
        state[key] = weight[first_new:].detach().clone()  # (new tokens, emb_dim)
    return state

# %% id="load-shakespeare-chat"
#| export
SHAKESPEARE_CHAT_DIR = DATA_DIR / "shakespeare_chat"  # written by course_lib/data/make_shakespeare_chat.py


def load_shakespeare_chat(device: str | torch.device | None = None) -> tuple[GPTModel, ChatTokenizer]:
    """The shipped Shakespeare model, grown by the chat tokens and given the shipped chat adapter (eval mode, on
    `device`), and its ChatTokenizer. Only adapter.safetensors and chat.json are stored, not a second model."""
    settings = json.loads((SHAKESPEARE_CHAT_DIR / "chat.json").read_text(encoding="utf-8"))
    base, char_tokenizer = load_shakespeare_gpt(device)
    model = grow_vocabulary(base, len(CHAT_TOKENS))
    apply_lora(model, settings["targets"], settings["r"], settings["alpha"])
    state = load_file(SHAKESPEARE_CHAT_DIR / "adapter.safetensors", device=str(model.out_head.weight.device))
    rows = [state.pop(key) for key in NEW_ROWS]
    load_lora_state_dict(model, state)
    first_new = char_tokenizer.vocab_size
    with torch.no_grad():
        model.embedding.tok_emb.weight[first_new:] = rows[0]
        model.out_head.weight[first_new:] = rows[1]
    return model.eval(), ChatTokenizer(char_tokenizer)

# %%
chat_model, tokenizer = load_shakespeare_chat()
card = json.loads((SHAKESPEARE_CHAT_DIR / "card.json").read_text(encoding="utf-8"))
shipped = sum(f.stat().st_size for f in SHAKESPEARE_CHAT_DIR.iterdir())
print(f"shipped: {shipped / 1e6:.2f} MB for {card['trainable']:,} trained numbers (the base model: 12.9 MB)")
for example in heldout[::3]:
    reply = chat_reply(chat_model, tokenizer, example["instruction"])
    print(f"[{example['task']}] {reply!r} right: {check_reply(example, reply)}")

# %% [markdown]
# The card records exact match on all held-out instructions, measured by the script: the base model with a plain
# zero-shot prompt, the grown model with the chat prompt before training, and the fine-tuned model.

# %%
acc = card["exact_match"]
tasks = [*INSTRUCTION_TASKS, "all"]
fig, ax = plt.subplots(figsize=(9, 4))
for k, (key, label) in enumerate([("base_plain", "base, plain prompt"), ("grown_chat", "grown, chat prompt"),
                                  ("fine_tuned", "fine-tuned")]):
    ax.bar([i + 0.27 * (k - 1) for i in range(len(tasks))], [acc[key][t] for t in tasks], width=0.27, label=label)
ax.set_xticks(range(len(tasks)), tasks)
ax.set_xlabel("instruction task")
ax.set_ylabel("held-out exact match")
ax.set_ylim(0, 1)
ax.set_title(f"{card['instructions']['heldout']} held-out instructions, from text the model never trained on")
ax.legend(loc="upper left")
plt.show()
assert acc["fine_tuned"]["all"] > acc["base_plain"]["all"]
print({t: f"{acc['base_plain'][t]:.0%} -> {acc['fine_tuned'][t]:.0%}" for t in tasks})

# %% [markdown]
# ### A chat loop
#
# `chat_loop` reads a message, answers with `chat_reply`, and stops at an empty message. `generate` stops each
# reply at `<|end|>`, the end of the model's turn, instead of running to the end of the context. Here the messages
# come from a list; in a terminal, leave `read` at its default, `input`.

# %% id="chat-loop"
#| export
def chat_loop(model: GPTModel, tokenizer: ChatTokenizer, read=input, write=print, **sampling) -> list[tuple[str, str]]:
    """Read a message, write the model's reply, until an empty message; returns the exchanges. Each turn is a
    conversation of its own: a context of 128 characters holds one exchange, not a history. `read` and `write`
    default to the keyboard and the screen; `sampling` goes to chat_reply (temperature, generator)."""
    if not (callable(read) and callable(write)):
        raise TypeError("read and write must be callables, like input and print")
    exchanges = []
    while (message := read("you: ")).strip():
        reply = chat_reply(model, tokenizer, message, **sampling)
        write(f"model: {reply}")
        exchanges.append((message, reply))
    return exchanges

# %%
messages = iter(["Upper case:\nThe gods are kind.", "Speak as VOLUMNIA.", ""])
exchanges = chat_loop(chat_model, tokenizer, read=lambda prompt: next(messages))
assert len(exchanges) == 2

# %% [markdown] id="exercises-14"
# ## Exercises
#
# Each exercise gives its difficulty (1 easy, 3 hard), a time estimate and what it teaches. Exercise 1 has a check
# that names the usual bugs; the others have worked answers, collapsed below each one: try first.

# %% [markdown]
# ### Exercise 1: LoRALinear from memory
#
# **Difficulty:** 2/3 · **Time:** ~20 min  
# **Goal:** the whole layer, and the mistakes that look right.
#
# Write `MyLoRALinear(linear, r, alpha)`: it freezes the given `nn.Linear`, holds
# `lora_A` of shape `(r, in_features)` (random) and `lora_B` of shape `(out_features, r)` (zeros), adds
# `(alpha / r) * x A^T B^T` to the frozen layer's output, and has `merge()` and `unmerge()` methods that fold the
# update into the weight and take it out again (after `merge()`, forward must not add the update a second time).
# `check_lora_linear` names the usual mistakes: $B$ not zero at the start, the scale forgotten or upside down, the
# weight left trainable, and a merge with the wrong sign or a transposed update (on a square layer such as
# `att.out_proj` the transposed one even has the right shape).

# %% tags=["solution"]
class MyLoRALinear(nn.Module):
    def __init__(self, linear, r, alpha):
        super().__init__()
        self.linear = linear.requires_grad_(False)
        self.scale = alpha / r
        self.lora_A = nn.Parameter(torch.randn(r, linear.in_features) / math.sqrt(linear.in_features))
        self.lora_B = nn.Parameter(torch.zeros(linear.out_features, r))
        self.merged = False

    def forward(self, x):
        out = self.linear(x)
        if not self.merged:
            out = out + self.scale * (x @ self.lora_A.T) @ self.lora_B.T
        return out

    def merge(self):
        with torch.no_grad():
            self.linear.weight += self.scale * self.lora_B @ self.lora_A
        self.merged = True

    def unmerge(self):
        with torch.no_grad():
            self.linear.weight -= self.scale * self.lora_B @ self.lora_A
        self.merged = False

# %%
from course_lib.checks import check_lora_linear

check_lora_linear(MyLoRALinear)
# %% [markdown] id="ex2-14"
# ### Exercise 2: What the mask leaves out
#
# **Difficulty:** 1/3 · **Time:** ~10 min  
# **Goal:** see what the loss would learn without the mask.
#
# Take two (instruction, response) pairs, build the batch with `chat_batch`, and compute two losses on the grown,
# untrained model: `chat_loss` (the response only), and the plain next-token loss at every position of the same
# inputs. How many positions does each count? Which is larger, and what would training on the second one teach the
# model besides answering?

# %% [markdown] id="ex2-14-answer" tags=["solution"]
# <details><summary>Answer</summary>
#
# ```python
# tokenizer = ChatTokenizer(chars)
# grown = grow_vocabulary(base, len(CHAT_TOKENS))
# examples = [("Who speaks? HAMLET:\nTo be, or not to be", "HAMLET"), ("Upper case: good night", "GOOD NIGHT")]
# inputs, targets = chat_batch(tokenizer, examples, grown.cfg.context_length)
# with torch.no_grad():
#     masked = chat_loss(grown, inputs, targets)
#     every = torch.cat([inputs[:, 1:], inputs[:, -1:]], dim=1)  # the next token at every position
#     unmasked = F.cross_entropy(grown(inputs).flatten(0, 1), every.flatten())
# print(f"response only: {masked.item():.3f}, every position: {unmasked.item():.3f}",
#       f"({int((targets != IGNORE_INDEX).sum())} of {targets.numel()} positions count)")
# ```
#
# On the shipped model it printed `response only: 6.068, every position: 3.722 (18 of 94 positions count)`. The
# unmasked loss is lower because most of its positions are Shakespeare the model already predicts well (the quoted
# line, the instruction's words) and the padding; the response, in a format the model has never seen, is what it
# cannot yet do. Trained on every position, the model would spend most of its updates learning to write
# instructions, that is, to imitate the user, and the few answer tokens would weigh a fifth as much.
#
# </details>

# %% [markdown] id="ex3-14"
# ### Exercise 3: A random start for the new rows
#
# **Difficulty:** 1/3 · **Time:** ~15 min  
# **Goal:** why the new rows start at the mean.
#
# Grow the base model with `grow_vocabulary`, then overwrite the new rows of both the embedding and the head (the
# shipped model's head is not tied) with draws from N(0, 0.02), GPT-2's initialisation. Before any training, how
# much probability do the three new tokens get, summed, on a line of Shakespeare, with each start?

# %% [markdown] id="ex3-14-answer" tags=["solution"]
# <details><summary>Answer</summary>
#
# ```python
# line = torch.tensor([chars.encode("HAMLET:\nTo be, or not to be, that is the question")])
#
# def new_token_mass(model):
#     with torch.no_grad():
#         probs = torch.softmax(model(line), dim=-1)[..., base.cfg.vocab_size:]
#     return probs.sum(-1).mean().item()
#
# random_start = grow_vocabulary(base, len(CHAT_TOKENS))
# with torch.no_grad():
#     for weight in (random_start.embedding.tok_emb.weight, random_start.out_head.weight):
#         nn.init.normal_(weight[base.cfg.vocab_size:], std=0.02)
# print(f"mean start: {new_token_mass(grown):.3g}, random start: {new_token_mass(random_start):.3g}")
# ```
#
# It printed `mean start: 0.000517, random start: 0.00378`: the random rows take seven times as much probability from
# the old tokens before the model has seen a single chat token. A head row at the mean of the old rows scores about
# as an average character does, so each new token gets roughly an average character's share, which on Shakespeare
# text is small; a random row scores whatever its random direction happens to give, here more.
#
# </details>

# %% [markdown] id="summary-14"
# ## Summary
#
# `course_lib/finetuning.py` now holds:
#
# - LoRA: `LoRALinear` (a frozen layer plus $\frac{\alpha}{r} B A$, $B$ zero at the start) with `merge` and
#   `unmerge`; `find_lora_targets`, `apply_lora`, `lora_layers`, `merge_lora`, `unmerge_lora`, `lora_state_dict` and
#   `load_lora_state_dict`. Equal to PEFT's LoRA on the same layers (`tests/test_finetuning_lora.py`).
# - The classifier: `play_speeches`, `stratified_split`, `Passages`, `encode_passages`, `play_passages` (the play of a
#   passage, no speech in two splits), `BagOfChars`, `ClassifierGPT` (the last real position feeds the head),
#   `train_classifier` and `accuracy`.
# - Instruction following: the chat format (`CHAT_TOKENS`, `ChatTokenizer`, `format_chat`), vocabulary growth that
#   keeps the old model (`grow_vocabulary`, `train_new_rows`), the loss on responses only (`chat_batch`, `chat_loss`,
#   `IGNORE_INDEX`; equal to TRL's completion-only loss, `tests/test_finetuning_chat.py`), instructions with
#   checkable answers (`make_instructions`, `check_reply`), replies that stop at `<|end|>` (`chat_reply`,
#   `chat_loop`) and the shipped chat adapter (`chat_state_dict`, `load_shakespeare_chat`).

# Draft of notebook 14's section "LoRA from scratch" (issue 32), in percent format: `# %% [markdown]` opens a
# markdown cell, `# %%` a code cell; `id="..."` after the marker is the cell id to give the cell, `tags=[...]` its
# tags. Cells that start with `#| export` make course_lib/finetuning.py. The first code cell stands in for the
# notebook's own first cell (its `#| default_exp finetuning` line and imports); merge the two when assembling.

# %% [markdown]
# ## LoRA from scratch
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

# %%
#| default_exp finetuning
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.pretrained import load_shakespeare_gpt

torch.manual_seed(123)
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
# ### Exercise 1: LoRALinear from memory
#
# *Medium, about 20 minutes.* Write `MyLoRALinear(linear, r, alpha)`: it freezes the given `nn.Linear`, holds
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

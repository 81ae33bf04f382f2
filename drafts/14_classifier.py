# Draft of notebook 14's section "A classifier from a language model" (issue 32), in percent format, as
# drafts/14_lora.py: `# %% [markdown]` opens a markdown cell, `# %%` a code cell, `id="..."` names the cell. Cells that
# start with `#| export` make course_lib/finetuning.py (after the LoRA cells). The first code cell stands in for what
# the notebook's first cell already imports; merge the two when assembling. Its numbers come from
# course_lib/data/make_classifier_results.py (the table) and from the cells themselves (the short runs).

# %% [markdown]
# ## A classifier from a language model
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

# %%
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.finetuning import apply_lora
from course_lib.pretrained import load_shakespeare_gpt

torch.manual_seed(123)
torch.set_printoptions(precision=4)

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
            texts.append(speech), groups.append(label), first.append(i)
    data = encode_passages(texts, groups, tokenizer, max_chars)
    data.source = torch.tensor(first)  # (n,): each passage's first speech, an index into play_speeches()
    parts = stratified_split(groups, fractions, seed)
    return {name: data[index] for name, index in zip(["train", "val", "test"], parts)}, names

# %%
model, tokenizer = load_shakespeare_gpt()
splits, plays = play_passages(tokenizer)
train, val, test = splits["train"], splits["val"], splits["test"]
print({name: len(part) for name, part in splits.items()}, "passages; token_ids", tuple(train.token_ids.shape))
print(repr(tokenizer.decode(test.token_ids[0].tolist())), "->", plays[test.labels[0]])
sources = [set(part.source.tolist()) for part in splits.values()]  # first speech of each passage, per split
assert not (sources[0] & sources[1] or sources[0] & sources[2] or sources[1] & sources[2])
assert sum(map(len, sources)) == len(train) + len(val) + len(test)  # each speech is in exactly one passage
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
majority = torch.bincount(train.labels).argmax()  # the play with the most training passages
print(f"majority class ({plays[majority]}): test accuracy {(test.labels == majority).float().mean():.3f}")
torch.manual_seed(0)
bag = BagOfChars(tokenizer.vocab_size, len(plays))
losses = train_classifier(bag, train, epochs=30, lr=3e-2, batch_size=256, seed=0)
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
few = train[torch.arange(256)]  # the first 256 training passages
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

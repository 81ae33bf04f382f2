"""Fine-tune the course's Shakespeare model to follow instructions in a chat format, and ship only the adapter.

    python course_lib/data/make_shakespeare_chat.py --threads 1              # writes course_lib/data/shakespeare_chat/
    python course_lib/data/make_shakespeare_chat.py --threads 1 --out /tmp/c # a rebuild elsewhere, to compare with the card

The base model is course_lib/data/shakespeare_gpt (loaded, never changed). Its vocabulary grows by the chat tokens
<|user|>, <|assistant|>, <|end|> (grow_vocabulary); LoRA adapters go on the six projections of every block; the
new rows of the token embedding and of the output head train with them (train_new_rows). The loss counts only
the response tokens (chat_batch, chat_loss). Training instructions come from the training part of the corpus
(its first 90 %), held-out instructions from the validation part (its last 10 %), using no line that occurs in
the training part. Exact-match accuracy on the held-out instructions is measured before fine-tuning (the base
model prompted zero-shot in plain text, and the grown model given the chat prompt) and after it.

Writes adapter.safetensors (the LoRA tensors and the new rows, about 0.6 MB), chat.json (how to rebuild the
model from the base: targets, rank, alpha, chat tokens) and the card (card.json, README.md) with the command,
config, numbers, machine and each file's sha256. Seeded: the same command on the same machine and thread count
writes the same bytes.
"""

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from course_lib.finetuning import (CHAT_TOKENS, INSTRUCTION_TASKS, ChatTokenizer, apply_lora, chat_batch, chat_loss,
                                   chat_reply, chat_state_dict, grow_vocabulary, judge_reply, make_instructions,
                                   train_new_rows)
from course_lib.data.make_shakespeare_gpt import cpu_name, sha256  # the shipped model's card helpers
from course_lib.generation import generate
from course_lib.pretrained import SHAKESPEARE_GPT_DIR, load_shakespeare_gpt
from course_lib.training import TrainConfig, load_shakespeare, lr_at

HERE = Path(__file__).resolve().parent
FOLDER = "shakespeare_chat"
SHIPPED_FILES = ("adapter.safetensors", "chat.json")


@dataclass(frozen=True)
class ChatRecipe:
    seed: int = 1234  # torch.manual_seed before apply_lora, the batch generator's seed, the instructions' seeds
    train_per_task: int = 1500  # training instructions per task, from the training part of the corpus
    heldout_per_task: int = 50  # held-out instructions per task, from the validation part
    targets: tuple = ("att.W_query", "att.W_key", "att.W_value", "att.out_proj", "ff.fc", "ff.proj")
    r: int = 8
    alpha: float = 16.0
    train_config: TrainConfig = TrainConfig(total_steps=600, batch_size=16, max_lr=3e-3, min_lr=3e-4, warmup_steps=30,
                                            weight_decay=0.0, grad_clip=1.0, eval_every=100, eval_batches=1)


RECIPE = ChatRecipe()
SAMPLES = ("Upper case:\nWhat is the city but the people?", "Last word:\nNay, these are almost thoroughly persuaded;",
           "Who speaks second?\nROMEO:\nGood morrow, father.\n\nJULIET:\nIs it near day?", "Speak as HAMLET.")
SUBSET = 2  # the first SUBSET held-out instructions of each task: their replies go on the card, and tests redo them


def instruction_sets(recipe):
    """The training and held-out instructions, from the two parts of the corpus (notebook 09's split)."""
    text = load_shakespeare()
    split = int(len(text) * 0.9)  # one character is one token: the same cut as split_by_position
    train = make_instructions(text[:split], recipe.train_per_task, recipe.seed)
    heldout = make_instructions(text[split:], recipe.heldout_per_task, recipe.seed + 1, exclude=text[:split])
    return train, heldout


def plain_reply(model, char_tokenizer, example, max_new_tokens=48):
    """The base model, zero-shot: the instruction in plain text, then a heading, and greedy text up to a blank
    line (the end of a speech, the only end of turn it knows)."""
    prompt = char_tokenizer.encode(example["instruction"] + "\n\nANSWER:\n")
    room = min(max_new_tokens, model.cfg.context_length - len(prompt))
    out = generate(model, torch.tensor([prompt]), room)[0, len(prompt):].tolist()
    return char_tokenizer.decode(out).split("\n\n")[0]


def accuracy(examples, replies):
    """Share of right replies, per task and in all."""
    right = [judge_reply(e, r) for e, r in zip(examples, replies, strict=True)]
    table = {task: sum(ok for e, ok in zip(examples, right) if e["task"] == task) /
             sum(e["task"] == task for e in examples) for task in INSTRUCTION_TASKS}
    return {**table, "all": sum(right) / len(right)}


def fine_tune(model, tokenizer, train, recipe):
    """AdamW on the adapters and the new rows; each step a batch of training instructions drawn at random."""
    tcfg = recipe.train_config
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=tcfg.max_lr, betas=(0.9, 0.99), weight_decay=tcfg.weight_decay)
    generator = torch.Generator().manual_seed(recipe.seed)
    history = {"step": [], "loss": []}
    model.train()
    for step in range(tcfg.total_steps):
        picks = torch.randint(len(train), (tcfg.batch_size,), generator=generator).tolist()
        inputs, targets = chat_batch(tokenizer, [(train[i]["instruction"], train[i]["response"]) for i in picks],
                                     model.cfg.context_length)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, tcfg)
        loss = chat_loss(model, inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, tcfg.grad_clip)
        optimizer.step()
        if (step + 1) % tcfg.eval_every == 0 or step + 1 == tcfg.total_steps:
            history["step"].append(step + 1)
            history["loss"].append(loss.item())
            print(f"step {step + 1}: loss {loss.item():.4f} on the batch", flush=True)
    return model.eval(), history


def render_card(card):
    """The human-readable card (README.md), written from card.json's numbers."""
    cfg, acc = card["config"], card["exact_match"]
    rows = [f"| {task} | {acc['base_plain'][task]:.0%} | {acc['grown_chat'][task]:.0%} | {acc['fine_tuned'][task]:.0%} |"
            for task in [*INSTRUCTION_TASKS, "all"]]
    lines = [
        f"# {FOLDER}: the Shakespeare model, fine-tuned to follow instructions", "",
        "A chat adapter for `course_lib/data/shakespeare_gpt` (which it does not change): the vocabulary grows by",
        f"{', '.join(f'`{t}`' for t in CHAT_TOKENS)} (ids {card['first_new']} on), LoRA adapters of rank {cfg['r']} "
        f"(alpha {cfg['alpha']:g}) sit on {', '.join(cfg['targets'])} of every block,",
        "and the new rows of the token embedding and of the output head are trained with them; the loss counts only",
        "the response tokens. `course_lib.finetuning.load_shakespeare_chat()` rebuilds the model. Made by:", "",
        f"    {card['command']}", "",
        "| | |", "|---|---|",
        f"| trained numbers | {card['trainable']:,} ({card['adapter_bytes']:,} bytes in adapter.safetensors) |",
        (f"| instructions | {cfg['train_per_task']:,} per task for training (training part of the corpus), "
         f"{cfg['heldout_per_task']} per task held out (validation part, no line found in the training part) |"),
        (f"| training | {cfg['train_config']['total_steps']} AdamW steps of {cfg['train_config']['batch_size']} "
         f"instructions, learning rate {cfg['train_config']['max_lr']:g} (warmup "
         f"{cfg['train_config']['warmup_steps']}) cosine to {cfg['train_config']['min_lr']:g}; seed {cfg['seed']} |"),
        f"| wall time | {card['train_seconds'] / 60:.1f} min of training steps, {card['wall_seconds'] / 60:.1f} min in all |",
        f"| machine | {card['machine']} |", "",
        "## Held-out exact match (continue: the speaker's heading and one line)", "",
        "| task | base model, plain zero-shot prompt | grown model, chat prompt, not trained | fine-tuned |",
        "|---|---|---|---|", *rows, "",
        "## Files", "", "| file | sha256 |", "|---|---|",
        *[f"| `{name}` | `{digest}` |" for name, digest in card["sha256"].items()],
        "", "## Samples (greedy)", "",
        *[f"- `{s['instruction']!r}` -> `{s['reply']!r}`" for s in card["samples"]], "",
    ]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / FOLDER, help="the folder to write")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: PyTorch's choice)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    started, recipe = time.perf_counter(), RECIPE
    train, heldout = instruction_sets(recipe)
    base, char_tokenizer = load_shakespeare_gpt("cpu")
    tokenizer = ChatTokenizer(char_tokenizer)
    before = {"base_plain": [plain_reply(base, char_tokenizer, e) for e in heldout]}
    model = grow_vocabulary(base, len(CHAT_TOKENS))
    before["grown_chat"] = [chat_reply(model, tokenizer, e["instruction"]) for e in heldout]
    torch.manual_seed(recipe.seed)
    apply_lora(model, list(recipe.targets), recipe.r, recipe.alpha)
    train_new_rows(model, char_tokenizer.vocab_size)
    trained_at = time.perf_counter()
    model, history = fine_tune(model, tokenizer, train, recipe)
    train_seconds = time.perf_counter() - trained_at
    after = [chat_reply(model, tokenizer, e["instruction"]) for e in heldout]

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    state = chat_state_dict(model, char_tokenizer.vocab_size)
    save_file(state, out / "adapter.safetensors", metadata={"format": "pt"})
    settings = {"base": "shakespeare_gpt", "base_sha256": sha256(SHAKESPEARE_GPT_DIR / "model.safetensors"),
                "chat_tokens": list(CHAT_TOKENS), "targets": list(recipe.targets), "r": recipe.r, "alpha": recipe.alpha}
    (out / "chat.json").write_text(json.dumps(settings, indent=1) + "\n", encoding="utf-8")
    firsts = [i for task in INSTRUCTION_TASKS for i in [n for n, e in enumerate(heldout) if e["task"] == task][:SUBSET]]
    card = {
        "command": "python course_lib/data/make_shakespeare_chat.py" + "".join(f" {a}" for a in (argv or [])),
        "config": {**asdict(recipe), "targets": list(recipe.targets)},
        "first_new": char_tokenizer.vocab_size,
        "trainable": sum(t.numel() for t in state.values()),
        "adapter_bytes": (out / "adapter.safetensors").stat().st_size,
        "instructions": {"train": len(train), "heldout": len(heldout),
                         "heldout_sha256": hashlib.sha256(json.dumps(heldout).encode()).hexdigest()},
        "exact_match": {"base_plain": accuracy(heldout, before["base_plain"]),
                        "grown_chat": accuracy(heldout, before["grown_chat"]), "fine_tuned": accuracy(heldout, after)},
        "heldout_replies": [{"index": i, "base_plain": before["base_plain"][i], "grown_chat": before["grown_chat"][i],
                             "fine_tuned": after[i]} for i in firsts],
        "history": history,
        "train_seconds": round(train_seconds, 1),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s), "
                   f"torch {torch.__version__}, Python {platform.python_version()}",
        "samples": [{"instruction": s, "reply": chat_reply(model, tokenizer, s)} for s in SAMPLES],
        "sha256": {name: sha256(out / name) for name in SHIPPED_FILES},
    }
    (out / "card.json").write_text(json.dumps(card, indent=1) + "\n", encoding="utf-8")
    (out / "README.md").write_text(render_card(card), encoding="utf-8")
    print(f"wrote {out}: exact match {card['exact_match']['fine_tuned']['all']:.0%} after, "
          f"{card['exact_match']['base_plain']['all']:.0%} before (base, plain prompt)")


if __name__ == "__main__":
    main(sys.argv[1:])

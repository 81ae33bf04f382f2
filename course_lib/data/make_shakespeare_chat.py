"""Fine-tune the course's Shakespeare model to follow instructions in a chat format, and ship only the adapter.

    python course_lib/data/make_shakespeare_chat.py --threads 1 --workers 3           # writes shakespeare_chat/
    python course_lib/data/make_shakespeare_chat.py --threads 1 --seeds 0 --out /tmp/c  # seed 0 alone, elsewhere
    python course_lib/data/make_shakespeare_chat.py --small --seeds 0 --out /tmp/s     # about 5 minutes on a laptop

The base model is course_lib/data/shakespeare_gpt (loaded, never changed). Its vocabulary grows by the chat tokens
<|user|>, <|assistant|>, <|end|> (grow_vocabulary); LoRA adapters go on the six projections of every block; the
new rows of the token embedding and of the output head train with them (train_new_rows). The loss counts only
the response tokens (chat_batch, chat_loss). Training instructions come from the training part of the corpus
(its first 90 %), held-out instructions from the validation part (its last 10 %), using no line that occurs in
the training part.

The whole stage runs once per training seed (--seeds; seed s seeds the adapters' initialisation and the batch
order with RECIPE.seed + s; the instructions are the same for every seed), each in its own process of --threads
torch threads. Per seed: held-out exact match per task (greedy), the masked loss on the held-out instructions
every eval_every steps (the loss curve), and the validation loss of the model on plain Shakespeare (notebook 09's
validation part, the chat adapter on) against the base model's: what fine-tuning costs. Noise per task: the larger
of the range over the seeds and the widest 95% bootstrap half-width (1,000 resamples of the held-out instructions).
Baselines per task, measured once: the copy baseline (copyable: the best span of the instruction), the most common
training answer, the base model prompted zero-shot in plain text, and the grown model given the chat prompt.

Writes adapter.safetensors (seed 0's LoRA tensors and new rows), chat.json (how to rebuild the model from the
base: targets, rank, alpha, chat tokens) and the card (card.json, README.md) with the command, config, numbers,
machine and each file's sha256. Seeded: the same command on the same machine and thread count writes the same
adapter and numbers (the card also records wall times, which differ).
"""

import argparse
import collections
import hashlib
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from course_lib.data.make_classifier_results import bootstrap_half_width
from course_lib.data.make_shakespeare_gpt import cpu_name, sha256  # the shipped model's card helpers
from course_lib.finetuning import (CHAT_TOKENS, INSTRUCTION_TASKS, ChatTokenizer, apply_lora, chat_batch, chat_loss,
                                   chat_reply, chat_state_dict, copyable, grow_vocabulary, judge_reply,
                                   make_instructions, text_loss, train_new_rows)
from course_lib.generation import generate
from course_lib.pretrained import SHAKESPEARE_GPT_DIR, load_shakespeare_gpt
from course_lib.training import TrainConfig, load_shakespeare, lr_at

HERE = Path(__file__).resolve().parent
FOLDER = "shakespeare_chat"
SHIPPED_FILES = ("adapter.safetensors", "chat.json")


@dataclass(frozen=True)
class ChatRecipe:
    seed: int = 1234  # the instructions' seeds; seed + s seeds training seed s (apply_lora, the batch order)
    train_per_task: int = 3000  # training instructions per task, from the training part of the corpus
    heldout_per_task: int = 100  # held-out instructions per task, from the validation part
    targets: tuple = ("att.W_query", "att.W_key", "att.W_value", "att.out_proj", "ff.fc", "ff.proj")
    r: int = 32
    alpha: float = 64.0
    train_config: TrainConfig = TrainConfig(total_steps=3000, batch_size=16, max_lr=3e-3, min_lr=3e-4,
                                            warmup_steps=30, weight_decay=0.0, grad_clip=1.0, eval_every=250,
                                            eval_batches=1)


RECIPE = ChatRecipe()
SEEDS = (0, 1, 2)
SMALL = replace(RECIPE, heldout_per_task=25, train_config=replace(RECIPE.train_config, total_steps=400,
                                                                   eval_every=100))  # --small: a laptop's 5 minutes
SAMPLES = ("Upper case:\nWhat is the city but the people?", "Last word, in capitals:\nNay, these are almost "
           "thoroughly persuaded;", "How many words?\nO, I am fortune's fool!", "Speak as HAMLET.")
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


def by_task(examples, right):
    """Share of right answers (a bool per example), per task and in all."""
    table = {task: sum(ok for e, ok in zip(examples, right) if e["task"] == task) /
             sum(e["task"] == task for e in examples) for task in INSTRUCTION_TASKS}
    return {**table, "all": sum(right) / len(right)}


@torch.no_grad()
def heldout_loss(model, tokenizer, heldout, batch_size=100):
    """The masked loss (response tokens only) over all held-out instructions, in eval mode."""
    model.eval()
    total = count = 0
    for i in range(0, len(heldout), batch_size):
        inputs, targets = chat_batch(tokenizer, [(e["instruction"], e["response"]) for e in heldout[i:i + batch_size]],
                                     model.cfg.context_length)
        n = int((targets != -100).sum())
        total, count = total + chat_loss(model, inputs, targets).item() * n, count + n
    return total / count


def validation_ids(char_tokenizer):
    text = load_shakespeare()
    return torch.tensor(char_tokenizer.encode(text[int(len(text) * 0.9):]))


def fine_tune(model, tokenizer, train, heldout, recipe, seed):
    """AdamW on the adapters and the new rows; each step a batch of training instructions drawn at random. Every
    eval_every steps: the mean batch loss since the last point and the held-out loss."""
    tcfg = recipe.train_config
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=tcfg.max_lr, betas=(0.9, 0.99), weight_decay=tcfg.weight_decay)
    generator = torch.Generator().manual_seed(recipe.seed + seed)
    history = {"step": [0], "train_loss": [None], "heldout_loss": [heldout_loss(model, tokenizer, heldout)]}
    recent = []
    for step in range(tcfg.total_steps):
        model.train()
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
        recent.append(loss.item())
        if (step + 1) % tcfg.eval_every == 0 or step + 1 == tcfg.total_steps:
            history["step"].append(step + 1)
            history["train_loss"].append(sum(recent) / len(recent))
            history["heldout_loss"].append(heldout_loss(model, tokenizer, heldout))
            recent = []
            print(f"seed {seed} step {step + 1}: train {history['train_loss'][-1]:.4f}, "
                  f"held out {history['heldout_loss'][-1]:.4f}", flush=True)
    return model.eval(), history


def run_seed(seed, recipe, threads):
    """One whole fine-tuning stage under training seed `seed`: its numbers, and its adapter."""
    torch.set_num_threads(threads)
    train, heldout = instruction_sets(recipe)
    base, char_tokenizer = load_shakespeare_gpt("cpu")
    tokenizer = ChatTokenizer(char_tokenizer)
    model = grow_vocabulary(base, len(CHAT_TOKENS))
    torch.manual_seed(recipe.seed + seed)
    apply_lora(model, list(recipe.targets), recipe.r, recipe.alpha)
    train_new_rows(model, char_tokenizer.vocab_size)
    started = time.perf_counter()
    model, history = fine_tune(model, tokenizer, train, heldout, recipe, seed)
    seconds = time.perf_counter() - started
    replies = [chat_reply(model, tokenizer, e["instruction"]) for e in heldout]
    right = [judge_reply(e, r) for e, r in zip(heldout, replies)]
    bootstrap = {task: bootstrap_half_width(torch.tensor([float(ok) for e, ok in zip(heldout, right)
                                                          if e["task"] == task])) for task in INSTRUCTION_TASKS}
    result = {"seed": seed, "exact_match": by_task(heldout, right), "bootstrap": bootstrap, "history": history,
              "shakespeare_val_loss": text_loss(model, validation_ids(char_tokenizer)),
              "train_seconds": round(seconds, 1)}
    if seed == 0:
        result["replies"] = replies
        result["samples"] = [{"instruction": s, "reply": chat_reply(model, tokenizer, s)} for s in SAMPLES]
        result["state"] = chat_state_dict(model, char_tokenizer.vocab_size)
    return result


def baselines(recipe):
    """What a model that never fine-tuned gets, per task: copying the best span, the most common training answer,
    the base model with a plain prompt, the grown model with the chat prompt; and the base model's loss on plain
    Shakespeare."""
    train, heldout = instruction_sets(recipe)
    base, char_tokenizer = load_shakespeare_gpt("cpu")
    common = {task: collections.Counter(e["response"] for e in train if e["task"] == task).most_common(1)[0][0]
              for task in INSTRUCTION_TASKS}
    plain = [plain_reply(base, char_tokenizer, e) for e in heldout]
    grown = grow_vocabulary(base, len(CHAT_TOKENS))
    chat = [chat_reply(grown, ChatTokenizer(char_tokenizer), e["instruction"]) for e in heldout]
    return {"exact_match": {"copy": by_task(heldout, [copyable(e) for e in heldout]),
                            "most_common": by_task(heldout, [judge_reply(e, common[e["task"]]) for e in heldout]),
                            "base_plain": by_task(heldout, [judge_reply(e, r) for e, r in zip(heldout, plain)]),
                            "grown_chat": by_task(heldout, [judge_reply(e, r) for e, r in zip(heldout, chat)])},
            "most_common_answer": common, "replies": {"base_plain": plain, "grown_chat": chat},
            "shakespeare_val_loss": text_loss(base, validation_ids(char_tokenizer))}


def noise(runs):
    """Per task: the range over the seeds, the widest bootstrap half-width, and the larger of the two."""
    table = {}
    for task in INSTRUCTION_TASKS:
        values = [run["exact_match"][task] for run in runs]
        spread, widest = max(values) - min(values), max(run["bootstrap"][task] for run in runs)
        table[task] = {"mean": sum(values) / len(values), "range": spread, "bootstrap": widest,
                       "noise": max(spread, widest)}
    return table


def render_card(card):
    """The human-readable card (README.md), written from card.json's numbers."""
    cfg, base, tcfg = card["config"], card["baselines"]["exact_match"], card["config"]["train_config"]
    seeds = card["seeds"]
    rows = [f"| {task} | {base['copy'][task]:.0%} | {base['most_common'][task]:.0%} | {base['base_plain'][task]:.0%} | "
            f"{base['grown_chat'][task]:.0%} | " + " / ".join(f"{run['exact_match'][task]:.0%}" for run in seeds) +
            f" | {card['noise'][task]['mean']:.1%} +- {card['noise'][task]['noise']:.1%} |"
            for task in INSTRUCTION_TASKS]
    losses = " / ".join(f"{run['shakespeare_val_loss']:.4f}" for run in seeds)
    lines = [
        f"# {FOLDER}: the Shakespeare model, fine-tuned to follow instructions", "",
        "A chat adapter for `course_lib/data/shakespeare_gpt` (which it does not change): the vocabulary grows by",
        f"{', '.join(f'`{t}`' for t in CHAT_TOKENS)} (ids {card['first_new']} on), LoRA adapters of rank {cfg['r']} "
        f"(alpha {cfg['alpha']:g}) sit on {', '.join(cfg['targets'])} of every block,",
        "and the new rows of the token embedding and of the output head are trained with them; the loss counts only",
        "the response tokens. `course_lib.finetuning.load_shakespeare_chat()` rebuilds the model (training seed 0).",
        "Made by:", "", f"    {card['command']}", "",
        "| | |", "|---|---|",
        f"| trained numbers | {card['trainable']:,} ({card['adapter_bytes']:,} bytes in adapter.safetensors) |",
        (f"| instructions | {cfg['train_per_task']:,} per task for training (training part of the corpus), "
         f"{cfg['heldout_per_task']} per task held out (validation part, no line found in the training part) |"),
        (f"| training | {tcfg['total_steps']:,} AdamW steps of {tcfg['batch_size']} instructions, learning rate "
         f"{tcfg['max_lr']:g} (warmup {tcfg['warmup_steps']}) cosine to {tcfg['min_lr']:g}; training seeds "
         f"{', '.join(str(run['seed']) for run in seeds)} |"),
        f"| wall time | {' / '.join(str(round(run['train_seconds'] / 60, 1)) for run in seeds)} min per seed for the "
        f"training steps and the held-out loss curve, {card['wall_seconds'] / 60:.1f} min in all (see machine) |",
        f"| machine | {card['machine']} |", "",
        "## Held-out exact match (continue: the speaker's heading and one line)", "",
        "Noise: the larger of the range over the seeds and the widest 95% bootstrap half-width.", "",
        "| task | copy baseline | most common answer | base, plain prompt | grown, chat prompt | fine-tuned, seeds "
        "| mean +- noise |", "|---|---|---|---|---|---|---|", *rows, "",
        f"Validation loss on plain Shakespeare: base {card['baselines']['shakespeare_val_loss']:.4f}, fine-tuned "
        f"{losses} (seeds).", "",
        "## Files", "", "| file | sha256 |", "|---|---|",
        *[f"| `{name}` | `{digest}` |" for name, digest in card["sha256"].items()],
        "", "## Samples (greedy, seed 0)", "",
        *[f"- `{s['instruction']!r}` -> `{s['reply']!r}`" for s in card["samples"]], "",
    ]
    return "\n".join(lines)


def main(argv=None, recipe=RECIPE):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / FOLDER, help="the folder to write")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="training seeds; 0 is shipped")
    parser.add_argument("--workers", type=int, default=1, help="processes, one seed each at a time")
    parser.add_argument("--small", action="store_true", help="the SMALL recipe: 400 steps, 25 held-out instructions "
                        "per task; the same direction in about 5 minutes on a laptop (with --seeds 0)")
    args = parser.parse_args(argv)
    if 0 not in args.seeds:
        parser.error("--seeds must include 0: its adapter is the one written")
    if args.small:
        if args.out.resolve() == (HERE / FOLDER).resolve():
            parser.error("--small writes a small run: give it an --out of its own, not the shipped folder")
        recipe = SMALL
    started = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        jobs = [pool.submit(run_seed, seed, recipe, args.threads) for seed in args.seeds]
        torch.set_num_threads(args.threads)
        base = baselines(recipe)
        runs = [job.result() for job in jobs]
    first = runs[args.seeds.index(0)]
    train, heldout = instruction_sets(recipe)

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    state = first.pop("state")
    save_file(state, out / "adapter.safetensors", metadata={"format": "pt"})
    settings = {"base": "shakespeare_gpt", "base_sha256": sha256(SHAKESPEARE_GPT_DIR / "model.safetensors"),
                "chat_tokens": list(CHAT_TOKENS), "targets": list(recipe.targets), "r": recipe.r, "alpha": recipe.alpha}
    (out / "chat.json").write_text(json.dumps(settings, indent=1) + "\n", encoding="utf-8")
    firsts = [i for task in INSTRUCTION_TASKS for i in [n for n, e in enumerate(heldout) if e["task"] == task][:SUBSET]]
    replies, samples = first.pop("replies"), first.pop("samples")
    card = {
        "command": "python course_lib/data/make_shakespeare_chat.py" + "".join(f" {a}" for a in (argv or [])),
        "config": {**asdict(recipe), "targets": list(recipe.targets)},
        "first_new": load_shakespeare_gpt("cpu")[1].vocab_size,
        "trainable": sum(t.numel() for t in state.values()),
        "adapter_bytes": (out / "adapter.safetensors").stat().st_size,
        "instructions": {"train": len(train), "heldout": len(heldout),
                         "heldout_sha256": hashlib.sha256(json.dumps(heldout).encode()).hexdigest()},
        "baselines": {key: base[key] for key in ("exact_match", "most_common_answer", "shakespeare_val_loss")},
        "seeds": runs,
        "noise": noise(runs),
        "heldout_replies": [{"index": i, "base_plain": base["replies"]["base_plain"][i],
                             "grown_chat": base["replies"]["grown_chat"][i], "fine_tuned": replies[i]} for i in firsts],
        "fine_tuned_replies": replies,  # seed 0's greedy reply to every held-out instruction, in order
        "wall_seconds": round(time.perf_counter() - started, 1),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores, {args.workers} process(es) of {args.threads} torch "
                   f"thread(s), torch {torch.__version__}, Python {platform.python_version()}",
        "samples": samples,
        "sha256": {name: sha256(out / name) for name in SHIPPED_FILES},
    }
    (out / "card.json").write_text(json.dumps(card, indent=1) + "\n", encoding="utf-8")
    (out / "README.md").write_text(render_card(card), encoding="utf-8")
    print(f"wrote {out}: " + ", ".join(f"{task} {card['noise'][task]['mean']:.0%}" for task in INSTRUCTION_TASKS))


if __name__ == "__main__":
    main(sys.argv[1:])

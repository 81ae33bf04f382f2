"""Train the course's character-level Shakespeare GPTs with course_lib.training and ship them.

    python course_lib/data/make_shakespeare_gpt.py                 # writes course_lib/data/shakespeare_gpt/
    python course_lib/data/make_shakespeare_gpt.py --out /tmp/gpt  # a rebuild elsewhere, to compare with the card
    python course_lib/data/make_shakespeare_gpt.py --recipe draft  # notebook 09's small model, the draft of
                                                                   # speculative decoding in notebook 11

Seeded and resumable: every recipe.checkpoint_every steps the whole run state goes to --work (default
build/<folder>.pt); run the same command again after an interruption and it continues the same
trajectory. The output is a Hugging Face GPT-2 folder written by save_gpt2 (config.json,
model.safetensors), the character vocabulary (chars.json), and the model card (card.json, README.md)
with the command, config, size, steps, tokens, wall time, machine, losses and each file's sha256.
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

from course_lib.config import GPTConfig
from course_lib.model import GPTModel
from course_lib.pretrained import save_gpt2
from course_lib.tokenization import CharTokenizer
from course_lib.training import (TrainConfig, batch_loss, load_checkpoint, load_shakespeare, make_optimizer,
                                 new_history, sample_text, save_checkpoint, split_by_position, train)

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Recipe:
    """One model the course ships: where it goes, what it is, and how it is trained."""
    folder: str  # under course_lib/data/
    title: str  # the model card's heading
    seed: int  # torch.manual_seed before the model is built, and the batch generator's seed
    model_config: GPTConfig
    train_config: TrainConfig
    checkpoint_every: int


RECIPES = {
    "model": Recipe("shakespeare_gpt", "the course's own trained model", 1337,
                    GPTConfig(vocab_size=65, context_length=128, emb_dim=256, n_heads=8, n_layers=4, drop_rate=0.1,
                              qkv_bias=False, tie_weights=False),
                    TrainConfig(total_steps=3200, batch_size=32, max_lr=2e-3, min_lr=2e-4, warmup_steps=100,
                                weight_decay=0.1, grad_clip=1.0, eval_every=200, eval_batches=8), 200),
    "draft": Recipe("shakespeare_draft", "notebook 09's small model, the draft model of notebook 11", 123,
                    GPTConfig(vocab_size=65, context_length=64, emb_dim=96, n_heads=4, n_layers=3, drop_rate=0.0,
                              qkv_bias=False, tie_weights=False),  # notebook 09's model and run
                    TrainConfig(total_steps=1100, batch_size=16, max_lr=6e-3, min_lr=6e-4, warmup_steps=50,
                                eval_every=100, eval_batches=8), 550),
}
SUBSET_WINDOWS = 16  # the fixed subset the tests re-measure: the first 16 windows of the validation split
SAMPLE = {"prompt": "ROMEO:\n", "max_new_tokens": 120, "temperature": 0.8, "seed": 123}  # within the context
SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "chars.json")


def corpus():
    """The tokenizer and the course's train / validation split (notebook 09's: first 90 % / last 10 %)."""
    text = load_shakespeare()
    tokenizer = CharTokenizer.from_text(text)
    train_data, val_data = split_by_position(torch.tensor(tokenizer.encode(text)))
    return tokenizer, train_data, val_data


@torch.no_grad()
def split_loss(model, token_ids, context_length, max_windows=None, batch_size=64):
    """Mean next-character loss over consecutive non-overlapping windows of a split (all of them by default)."""
    model.eval()
    n_windows = (len(token_ids) - 1) // context_length
    n_windows = n_windows if max_windows is None else min(n_windows, max_windows)
    total = 0.0
    for first in range(0, n_windows, batch_size):
        starts = torch.arange(first, min(first + batch_size, n_windows)) * context_length  # (batch,)
        windows = token_ids[starts.unsqueeze(1) + torch.arange(context_length + 1)]  # (batch, context + 1)
        total += batch_loss(model, windows[:, :-1], windows[:, 1:]).item() * len(starts)
    return total / n_windows


def cpu_name():
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def render_card(card, recipe):
    """The human-readable model card (README.md), written from card.json's numbers."""
    cfg, tcfg, loss = card["model_config"], card["train_config"], card["loss"]
    lines = [
        f"# {recipe.folder}: {recipe.title}", "",
        "A character-level GPT-2 trained by `course_lib.training` on `course_lib/data/shakespeare.txt`",
        "(seven plays; the first 90 % of the characters for training, the last 10 % for validation).",
        "Written by `save_gpt2`: `load_gpt2` and `transformers.GPT2LMHeadModel.from_pretrained` both open it;",
        "`chars.json` maps token ids to characters (`CharTokenizer(chars)`). Made by:", "",
        f"    {card['command']}", "",
        "| | |", "|---|---|",
        f"| parameters | {card['parameters']:,} |",
        (f"| model | {cfg['n_layers']} layers, {cfg['n_heads']} heads, emb_dim {cfg['emb_dim']}, context "
         f"{cfg['context_length']} characters, vocabulary {cfg['vocab_size']}, dropout {cfg['drop_rate']}, "
         f"tie_weights {cfg['tie_weights']} |"),
        (f"| training | {tcfg['total_steps']:,} AdamW steps of {tcfg['batch_size']} windows; learning rate "
         f"{tcfg['max_lr']:g} (warmup {tcfg['warmup_steps']}) cosine to {tcfg['min_lr']:g}; weight decay "
         f"{tcfg['weight_decay']:g}; seed {card['seed']} |"),
        f"| tokens seen | {card['tokens_seen']:,} ({card['epochs']:.1f} passes over the training split) |",
        (f"| wall time | {card['train_seconds'] / 60:.1f} min of training steps, "
         f"{card['wall_seconds'] / 60:.1f} min in all |"),
        f"| machine | {card['machine']} |",
        f"| train loss | {loss['train']:.4f} nats per character (all of the training split) |",
        f"| validation loss | {loss['val']:.4f} nats per character (all of the validation split) |",
        f"| validation subset | {loss['val_subset']:.4f} (the first {SUBSET_WINDOWS} windows; tests re-measure it) |",
        "", "## Files", "", "| file | sha256 |", "|---|---|",
        *[f"| `{name}` | `{digest}` |" for name, digest in card["sha256"].items()],
        "", f"## A sample (prompt {SAMPLE['prompt']!r}, temperature {SAMPLE['temperature']}, seed {SAMPLE['seed']})",
        "", "```", card["sample"], "```", "",
    ]
    return "\n".join(lines)


def finish(recipe, model, tokenizer, train_data, val_data, history, out_dir, argv):
    """Write the Hugging Face folder, the vocabulary and the model card of the trained model."""
    started = time.perf_counter()
    cfg, tcfg = recipe.model_config, recipe.train_config
    model.eval()
    out = save_gpt2(model, out_dir)
    (out / "chars.json").write_text(json.dumps({"chars": tokenizer.chars}) + "\n", encoding="utf-8")
    card = {
        "command": "python course_lib/data/make_shakespeare_gpt.py" + "".join(f" {a}" for a in (argv or [])),
        "seed": recipe.seed, "model_config": asdict(cfg), "train_config": asdict(tcfg),
        "parameters": sum(p.numel() for p in model.parameters()),
        "tokens_seen": tcfg.total_steps * tcfg.batch_size * cfg.context_length,
        "epochs": tcfg.total_steps * tcfg.batch_size * cfg.context_length / len(train_data),
        "train_seconds": round(history["seconds"], 1),
        "wall_seconds": round(history["wall"] + time.perf_counter() - started, 1),  # steps, evaluations, this card
        "machine": f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s), "
                   f"torch {torch.__version__}, Python {platform.python_version()}",
        "loss": {"train": split_loss(model, train_data, cfg.context_length),
                 "val": split_loss(model, val_data, cfg.context_length),
                 "val_subset": split_loss(model, val_data, cfg.context_length, SUBSET_WINDOWS)},
        "history": {key: history[key] for key in ("eval_step", "train_loss", "val_loss")},
        "sample": sample_text(model, tokenizer, **SAMPLE),
        "sha256": {name: sha256(out / name) for name in SHIPPED_FILES},
    }
    (out / "card.json").write_text(json.dumps(card, indent=1) + "\n", encoding="utf-8")
    (out / "README.md").write_text(render_card(card, recipe), encoding="utf-8")
    print(f"wrote {out}: val loss {card['loss']['val']:.4f}, train loss {card['loss']['train']:.4f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=RECIPES, default="model", help="which model to train (default: model)")
    parser.add_argument("--out", type=Path, default=None, help="the folder to write (default: course_lib/data/<folder>)")
    parser.add_argument("--work", type=Path, default=None, help="the run checkpoint (default: build/<folder>.pt)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: PyTorch's choice)")
    args = parser.parse_args(argv)
    recipe = RECIPES[args.recipe]
    out = HERE / recipe.folder if args.out is None else args.out
    work = Path("build") / f"{recipe.folder}.pt" if args.work is None else args.work
    cfg, tcfg = recipe.model_config, recipe.train_config
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    tokenizer, train_data, val_data = corpus()
    if work.is_file():
        ckpt = load_checkpoint(work, expected_config=cfg, expected_tokenizer=tokenizer)
        if ckpt.train_config != tcfg:
            raise SystemExit(f"{work} holds another run ({ckpt.train_config}); delete it to start over")
        model, optimizer, generator, step, history = (ckpt.model, ckpt.optimizer, ckpt.generator, ckpt.step,
                                                      ckpt.history)
        print(f"resuming {work} at step {step}", flush=True)
    else:
        torch.manual_seed(recipe.seed)
        model = GPTModel(cfg)
        optimizer = make_optimizer(model, tcfg)
        generator, step, history = torch.Generator().manual_seed(recipe.seed), 0, {**new_history(), "wall": 0.0}
    while step < tcfg.total_steps:
        stop = min(step + recipe.checkpoint_every, tcfg.total_steps)
        chunk_started = time.perf_counter()
        history = train(model, optimizer, train_data, val_data, tcfg, generator, start_step=step,
                        stop_step=stop, history=history)
        history["wall"] += time.perf_counter() - chunk_started
        step = stop
        save_checkpoint(work, model, optimizer, tokenizer, tcfg, step, generator, history)
        print(f"step {step}: val {history['val_loss'][-1]:.4f} train {history['train_loss'][-1]:.4f} "
              f"({history['seconds'] / 60:.1f} min of steps)", flush=True)

    finish(recipe, model, tokenizer, train_data, val_data, history, out, argv)


if __name__ == "__main__":
    main(sys.argv[1:])

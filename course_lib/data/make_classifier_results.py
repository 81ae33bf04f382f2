"""Notebook 14's table "a classifier from a language model": the play of a passage, five ways.

    python course_lib/data/make_classifier_results.py            # writes course_lib/data/classifier_results.json

Majority class, a bag-of-characters logistic regression, a linear probe on the shipped Shakespeare model's
frozen last-token state, full fine-tuning with a new classification head, and LoRA (rank 8 on every projection of
every block) plus the head. One torch thread, seeded: a rerun on the same machine gives the same accuracies. The
notebook prints this file; it runs only shortened versions itself (its budget is 90 s).
"""

import json
import platform
import sys
import time
from datetime import date
from pathlib import Path

import torch

from course_lib.finetuning import (BagOfChars, ClassifierGPT, accuracy, apply_lora, play_passages,
                                   train_classifier)
from course_lib.pretrained import load_shakespeare_gpt

OUT = Path(__file__).with_name("classifier_results.json")
LORA_TARGETS = ["att.W_query", "att.W_key", "att.W_value", "att.out_proj", "ff.fc", "ff.proj"]
RUNS = {  # method -> how it trains (epochs over the training passages, AdamW learning rate, batch size)
    "bag of characters": dict(epochs=30, lr=3e-2, batch_size=256),
    "linear probe (frozen body)": dict(epochs=4, lr=1e-2, batch_size=64),
    "full fine-tuning": dict(epochs=2, lr=1e-4, batch_size=32),
    "LoRA r=8 + head": dict(epochs=2, lr=1e-3, batch_size=32),
}


def build(method: str, vocab_size: int, num_classes: int) -> torch.nn.Module:
    if method == "bag of characters":
        return BagOfChars(vocab_size, num_classes)
    model = ClassifierGPT(load_shakespeare_gpt()[0], num_classes)
    if method.startswith("linear probe"):
        model.requires_grad_(False)
        model.out_head.requires_grad_(True)
    elif method.startswith("LoRA"):
        apply_lora(model, LORA_TARGETS, r=8, alpha=16)  # freezes everything else, the head included
        model.out_head.requires_grad_(True)
    return model


def main() -> None:
    torch.set_num_threads(1)
    _, tokenizer = load_shakespeare_gpt()
    splits, plays = play_passages(tokenizer)
    train, val, test = splits["train"], splits["val"], splits["test"]
    majority = torch.bincount(train.labels).argmax()
    rows = [{"method": "majority class", "test_accuracy": (test.labels == majority).float().mean().item(),
             "val_accuracy": (val.labels == majority).float().mean().item(), "trainable_parameters": 0,
             "seconds": 0.0}]
    for method, run in RUNS.items():
        torch.manual_seed(0)  # the new head's initial weights
        model = build(method, tokenizer.vocab_size, len(plays))
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        start = time.perf_counter()
        losses = train_classifier(model, train, seed=0, **run)
        seconds = time.perf_counter() - start
        rows.append({"method": method, "test_accuracy": accuracy(model, test), "val_accuracy": accuracy(model, val),
                     "trainable_parameters": trainable, "seconds": round(seconds, 1), **run,
                     "first_loss": losses[0], "last_loss": sum(losses[-20:]) / len(losses[-20:])})
        print(rows[-1], flush=True)
    OUT.write_text(json.dumps({
        "command": "python course_lib/data/make_classifier_results.py",
        "task": "the play of a passage: consecutive speeches joined until >= 128 characters, the last 128 "
                "characters, seven plays; split by passage (no speech in two splits), stratified, seed 0",
        "plays": plays, "passages": {name: len(part) for name, part in splits.items()},
        "head_reads": "the final norm's state at each passage's last token",
        "machine": f"{platform.processor() or platform.machine()}, 1 torch thread, torch {torch.__version__}, "
                   f"Python {sys.version.split()[0]}",
        "date": date.today().isoformat(), "results": rows}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

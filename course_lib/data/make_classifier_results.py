"""Notebook 14's tables "a classifier from a language model": two tasks, every method, three seeds.

    python -m course_lib.data.make_classifier_results --workers 2   # writes course_lib/data/classifier_results.json

The tasks: the play of a 128-character passage (seven plays, `play_passages`) and the order of a line's words
(as written or shuffled, `order_passages`). The methods: the majority class; a bag of characters (BagOfChars,
trained by `train_classifier`); a bag of words and a linear probe on the frozen model's last state (both fitted to
convergence by `fit_logistic`: convex, one optimum, so one run stands for every seed); full fine-tuning, LoRA
(rank 8 on every projection, plus the head) and, on the order task, the same network from random weights (what
pretraining buys), each trained epoch by epoch (one `train_classifier` call per epoch, so AdamW starts afresh
each epoch) and kept at the epoch with the best validation accuracy, with seeds 0, 1 and 2 (the new head's
weights, the dropout masks and the order of the batches). Each job runs in its own process with one torch thread,
so a rerun on the same machine gives the same accuracies. The notebook prints this file, refits the bag of words
itself and reads the play probe's head, stored here (its states take a minute to compute).

Noise, per method: the larger of the range of the test accuracy over the seeds and the 95% bootstrap half-width of
the test accuracy (1,000 resamples of the test set, the widest over the seeds).
"""

import argparse
import json
import platform
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from pathlib import Path

import torch

from course_lib.finetuning import (BagOfChars, ClassifierGPT, accuracy, apply_lora, fit_logistic, last_states,
                                   order_passages, play_passages, train_classifier, word_frequencies)
from course_lib.model import GPTModel
from course_lib.pretrained import load_shakespeare_gpt

OUT = Path(__file__).with_name("classifier_results.json")
RUNS = Path(tempfile.gettempdir()) / "classifier_runs.json"
SEEDS = (0, 1, 2)
LORA_TARGETS = ["att.W_query", "att.W_key", "att.W_value", "att.out_proj", "ff.fc", "ff.proj"]
TASKS = {"play": "the play of a passage: consecutive speeches of one play joined until >= 128 characters, its last "
                 "128 characters, seven plays; split by passage (no speech in two splits), stratified, seed 0",
         "order": "the order of a line's words: a line of 20-60 characters as written (0) or with its movable words "
                  "shuffled (1); train and val from the corpus's first 90%, test from the last tenth (lines that "
                  "occur nowhere in the first 90%); half of each split shuffled, seed 0"}
TUNED = {  # method -> how it trains: AdamW learning rate, batch size, the most epochs (the best on val is kept)
    "full fine-tuning": dict(lr=3e-4, batch_size=32),
    "LoRA r=8 + head": dict(lr=1e-3, batch_size=32),
    "same network, random weights": dict(lr=3e-4, batch_size=32),
}
EPOCHS = {"play": 4, "order": 4}
SCRATCH_TASKS = ("order",)  # what pretraining buys is measured on the task the language model is chosen for
BAG_OF_CHARS = dict(epochs=100, lr=3e-2, batch_size=256)


def task_splits(task: str):
    _, tokenizer = load_shakespeare_gpt()
    if task == "play":
        splits, classes = play_passages(tokenizer)
        return splits, classes, tokenizer
    return order_passages(tokenizer), ["as written", "shuffled"], tokenizer


def bootstrap_half_width(correct: torch.Tensor, resamples: int = 1000) -> float:
    """Half the width of the 95% bootstrap interval of the mean of `correct` (0/1 per test item), seeded."""
    generator = torch.Generator().manual_seed(0)
    index = torch.randint(len(correct), (resamples, len(correct)), generator=generator)
    means = correct.float()[index].mean(1).sort().values
    return ((means[int(0.975 * resamples)] - means[int(0.025 * resamples)]) / 2).item()


@torch.no_grad()
def correct(model: torch.nn.Module, data) -> torch.Tensor:
    """(passages,) bool: whether the model's highest logit is each passage's label (eval mode)."""
    model.eval()
    return torch.cat([model(data.token_ids[index], data.lengths[index]).argmax(-1) == data.labels[index]
                      for index in torch.arange(len(data)).split(256)])


def build(method: str, num_classes: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)  # the new head's weights (and a random network's)
    body = load_shakespeare_gpt()[0]
    if method == "same network, random weights":
        body = GPTModel(body.cfg)
    model = ClassifierGPT(body, num_classes)
    if method.startswith("LoRA"):
        apply_lora(model, LORA_TARGETS, r=8, alpha=16)  # freezes everything else, the head included
        model.out_head.requires_grad_(True)
    return model


def run_tuned(job: tuple[str, str, int]) -> dict:
    """One fine-tuning run: train epoch by epoch, keep the epoch with the best validation accuracy."""
    task, method, seed = job
    torch.set_num_threads(1)
    splits, classes, _ = task_splits(task)
    model = build(method, len(classes), seed)
    settings = TUNED[method]
    best, curve, start = None, [], time.perf_counter()
    for epoch in range(EPOCHS[task]):
        losses = train_classifier(model, splits["train"], epochs=1, seed=seed * 100 + epoch, **settings)
        val = accuracy(model, splits["val"])
        curve.append({"epoch": epoch + 1, "train_loss": sum(losses[-50:]) / len(losses[-50:]), "val": val})
        if best is None or val > best["val"]:
            right = correct(model, splits["test"])
            best = {"epoch": epoch + 1, "val": val, "test": right.float().mean().item(),
                    "bootstrap": bootstrap_half_width(right)}
        print(task, method, seed, curve[-1], flush=True)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"task": task, "method": method, "trainable": trainable, "settings": {**settings, "epochs": EPOCHS[task]},
            "run": {"seed": seed, **best, "seconds": round(time.perf_counter() - start, 1), "curve": curve}}


def run_cheap(task: str) -> list[dict]:
    """The majority class, the bag of characters (three seeds) and the two fitted logistic regressions."""
    torch.set_num_threads(1)
    splits, classes, tokenizer = task_splits(task)
    train, val, test = splits["train"], splits["val"], splits["test"]
    rows = []
    majority = torch.bincount(train.labels).argmax()
    rows.append({"task": task, "method": "majority class", "trainable": 0, "settings": {},
                 "run": {"seed": None, "val": (val.labels == majority).float().mean().item(),
                         "test": (test.labels == majority).float().mean().item(),
                         "bootstrap": bootstrap_half_width(test.labels == majority), "seconds": 0.0}})
    for seed in SEEDS:
        start = time.perf_counter()
        torch.manual_seed(seed)
        bag = BagOfChars(tokenizer.vocab_size, len(classes))
        train_classifier(bag, train, seed=seed, **BAG_OF_CHARS)
        right = correct(bag, test)
        rows.append({"task": task, "method": "bag of characters", "trainable": sum(p.numel() for p in bag.parameters()),
                     "settings": BAG_OF_CHARS,
                     "run": {"seed": seed, "val": accuracy(bag, val), "test": right.float().mean().item(),
                             "bootstrap": bootstrap_half_width(right),
                             "seconds": round(time.perf_counter() - start, 1)}})
    texts = {name: [tokenizer.decode(ids[:n].tolist()) for ids, n in zip(part.token_ids, part.lengths)]
             for name, part in splits.items()}
    body = load_shakespeare_gpt()[0]
    for method in ("bag of words", "linear probe"):
        start = time.perf_counter()
        if method == "bag of words":
            vocabulary = word_frequencies(texts["train"])[1]  # the training passages' words
            features = {name: word_frequencies(texts[name], vocabulary)[0] for name in splits}
        else:
            features = {name: last_states(body, part) for name, part in splits.items()}
        layer, penalty = fit_logistic((features["train"], train.labels), (features["val"], val.labels), len(classes))
        with torch.no_grad():
            hits = {name: layer(features[name]).argmax(-1) == splits[name].labels for name in ("val", "test")}
        stored = {"head": {name: t.tolist() for name, t in layer.state_dict().items()}} if method == "linear probe" \
            and task == "play" else {}  # the notebook reads the play probe's head: its states take a minute to compute
        rows.append({"task": task, "method": method, "trainable": sum(p.numel() for p in layer.parameters()),
                     "settings": {"penalty": penalty, "features": features["train"].shape[1]}, **stored,
                     "run": {"seed": None, "val": hits["val"].float().mean().item(),
                             "test": hits["test"].float().mean().item(),
                             "bootstrap": bootstrap_half_width(hits["test"]),
                             "seconds": round(time.perf_counter() - start, 1)}})
    return rows


def summarise(rows: list[dict]) -> dict:
    """Group the runs by task and method, in the order of the tables, with each method's mean and noise."""
    order = ["majority class", "bag of characters", "bag of words", "linear probe", *TUNED]
    tasks = {}
    for task in TASKS:
        splits, classes, _ = task_splits(task)
        methods = []
        for method in order:
            mine = [row for row in rows if row["task"] == task and row["method"] == method]
            if not mine:
                continue
            runs = sorted((row["run"] for row in mine), key=lambda run: (run["seed"] is not None, run["seed"]))
            tests = [run["test"] for run in runs]
            spread = max(tests) - min(tests)
            widest = max(run["bootstrap"] for run in runs)
            methods.append({"method": method, "trainable": mine[0]["trainable"], "settings": mine[0]["settings"],
                            **({"head": mine[0]["head"]} if "head" in mine[0] else {}), "runs": runs,
                            "test_mean": sum(tests) / len(tests), "seed_range": spread,
                            "bootstrap": widest, "noise": max(spread, widest)})
        tasks[task] = {"task": TASKS[task], "classes": classes,
                       "sizes": {name: len(part) for name, part in splits.items()}, "methods": methods}
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="processes, one torch thread each")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    args = parser.parse_args()
    jobs = [(task, method, seed) for task in args.tasks for method in TUNED for seed in SEEDS
            if task in SCRATCH_TASKS or method != "same network, random weights"]
    jobs.sort(key=lambda job: job[0] != "order")  # the longest runs first, so that the two workers end together
    start = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        cheap = list(pool.map(run_cheap, args.tasks))
        tuned = list(pool.map(run_tuned, jobs))
    rows = [row for part in cheap for row in part] + tuned
    RUNS.write_text(json.dumps(rows), encoding="utf-8")  # every run, kept outside the repository before summarising
    OUT.write_text(json.dumps({
        "command": f"python -m course_lib.data.make_classifier_results --workers {args.workers}",
        "machine": f"{platform.processor() or platform.machine()}, {args.workers} processes of 1 torch thread, "
                   f"torch {torch.__version__}, Python {sys.version.split()[0]}",
        "date": date.today().isoformat(), "wall_seconds": round(time.perf_counter() - start),
        "seeds": list(SEEDS), "noise": "the larger of the range over the seeds and the widest 95% bootstrap "
                                       "half-width of the test accuracy (1,000 resamples)",
        "tasks": summarise(rows)}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

"""Throughput of the pretraining command (notebook 13) with one process and with two, on this machine.

Three ways to spend the machine's cores on the same run (the shakespeare-char preset, the same global batch of
4,096 tokens per step, float32): one process on one thread, one process on two threads, and two processes under
torchrun with one thread each (gloo all-reduce). Each variant runs `python -m course_lib.pretrain train` as a
subprocess; the variants are interleaved (A B C A B C ...) so that all see the same machine load, and each
result is the median over repetitions of the median per-step tokens/s that the run logged in its checkpoint
(steps after the first 5; evaluation, checkpoints and start-up excluded), with the whole command's wall time
beside it. MFU is what the command reports: tokens/s x FLOPs per token (6N + 12LTd) / (processes x the matmul
peak it measured at start with its own thread count).

    python benchmarks/pretrain.py            # about 2 minutes on 2 cores
    python benchmarks/pretrain.py --quick    # smoke run
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import REPO_ROOT, Run, median, parse_args, print_table

from course_lib.shards import prepare
from course_lib.tokenization import CharTokenizer
from course_lib.training import load_shakespeare


def variants(data: Path, out: Path, steps: int) -> dict[str, tuple[list[str], dict]]:
    common = ["train", str(data), "OUT", "--preset", "shakespeare-char", "--total-steps", str(steps),
              "--batch-tokens", "4096", "--micro-batch", "16", "--checkpoint-every", str(steps)]
    single = [sys.executable, "-m", "course_lib.pretrain"]
    double = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
              "-m", "course_lib.pretrain"]
    return {"1 process x 1 thread": (single + common, {"OMP_NUM_THREADS": "1"}),
            "1 process x 2 threads": (single + common, {"OMP_NUM_THREADS": "2"}),
            "2 processes x 1 thread": (double + common, {"OMP_NUM_THREADS": "1"})}


def run_once(command: list[str], env: dict, out: Path) -> dict:
    command = [str(out) if part == "OUT" else part for part in command]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env}, cwd=REPO_ROOT)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    history = torch.load(out / "checkpoint.pt", weights_only=True)["history"]
    return {"wall_s": wall, "tokens_per_s": median(history["tokens_per_s"][5:]), "mfu": median(history["mfu"][5:]),
            "final_loss": history["loss"][-1]}


def main():
    args = parse_args(__doc__)
    run = Run("pretrain", args)
    steps, repeats = (12, 1) if args.quick else (60, args.repeats or 3)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        text = load_shakespeare()
        prepare(tmp / "data", [text], CharTokenizer(sorted(set(text))), val_tokens=30_000)
        commands = variants(tmp / "data", tmp, steps)
        results = {name: [] for name in commands}
        for repeat in range(repeats):
            for i, (name, (command, env)) in enumerate(commands.items()):
                results[name].append(run_once(command, env, tmp / f"run_{repeat}_{i}"))
    baseline = median([r["tokens_per_s"] for r in results["1 process x 1 thread"]])
    rows, summary = [], {}
    for name, runs in results.items():
        tokens_per_s = median([r["tokens_per_s"] for r in runs])
        summary[name] = {"tokens_per_s": tokens_per_s, "tokens_per_s_all": [r["tokens_per_s"] for r in runs],
                         "wall_s": median([r["wall_s"] for r in runs]), "mfu": median([r["mfu"] for r in runs]),
                         "final_loss": [r["final_loss"] for r in runs]}
        spread = f"{min(summary[name]['tokens_per_s_all']):.0f}-{max(summary[name]['tokens_per_s_all']):.0f}"
        rows.append([name, f"{tokens_per_s:,.0f}", spread, f"{tokens_per_s / baseline:.2f}x",
                     f"{summary[name]['mfu']:.1%}", f"{summary[name]['wall_s']:.1f} s"])
    print_table(["variant", "tokens/s (median)", "range", "vs 1 x 1", "MFU", "command wall"], rows,
                title=f"pretrain, shakespeare-char preset, {steps} steps of 4,096 tokens, float32; "
                      f"medians of {repeats} interleaved repetitions")
    run.finish({"steps": steps, "batch_tokens": 4096, "micro_batch": 16, "repeats": repeats, "variants": summary})


if __name__ == "__main__":
    main()

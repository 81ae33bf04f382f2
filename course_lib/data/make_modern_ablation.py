"""Not a lesson: the runs behind notebook 16's table "what each change buys" (modern_ablation.json).

Every run trains notebook 09's character model shape (65 characters, context 64, emb_dim 96, 4 heads, 3 layers, no
dropout) with notebook 09's schedule (1,100 steps of 16 windows, max_lr 6e-3 falling to 6e-4), from a seed, on one
thread, and measures the validation loss on 64 fixed batches and the training tokens per second. The baseline is
GPT-2 as it was (biases, tied head, LayerNorm, learned positions, GELU); each variant changes one thing; "modern"
changes them all; two runs train with Muon instead of AdamW. The JSON is rewritten after every run. Each run records
a hash of what it trained (shape, schedule, change, optimizer) and the PyTorch version; a run already in the JSON
with the same hash is not run again, so a stopped job resumes where it stopped and a changed variant is rerun.

The runs' own tokens/s depend on what else the machine did meanwhile; --speed measures speed apart: one process, one
thread, every variant trained for --speed-steps steps per round, the variants in a new random order each round, and
the median over --rounds rounds kept. Run it with nothing else on the machine (it warns above a load of 0.5).

    python -m course_lib.data.make_modern_ablation --seeds 0 1 2 --workers 2
    python -m course_lib.data.make_modern_ablation --speed --rounds 5 --speed-steps 100
"""

import argparse
import hashlib
import json
import multiprocessing
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from course_lib.modern import ModernConfig, ModernGPT, make_muon, train_variant
from course_lib.tokenization import CharTokenizer
from course_lib.training import TrainConfig, load_shakespeare, make_optimizer, split_by_position, train

OUT = Path(__file__).with_name("modern_ablation.json")
SHAPE = dict(vocab_size=65, context_length=64, emb_dim=96, n_heads=4, n_layers=3, drop_rate=0.0)
TCFG = dict(total_steps=1100, batch_size=16, max_lr=6e-3, min_lr=6e-4, warmup_steps=50, eval_every=1100,
            eval_batches=8)
MODERN = dict(norm="rms", positions="rotary", ffn="swiglu", n_kv_heads=2, qk_norm=True, qkv_bias=False, bias=False,
              tie_weights=False)
VARIANTS = {  # name -> (what changes from GPT-2, optimizer), in the table's order
    "GPT-2 (baseline)": ({}, "adamw"),
    "RMSNorm": (dict(norm="rms"), "adamw"),
    "rotary positions": (dict(positions="rotary"), "adamw"),
    "SwiGLU (same parameters)": (dict(ffn="swiglu"), "adamw"),
    "grouped-query attention (2 kv heads)": (dict(n_kv_heads=2), "adamw"),
    "QK-norm": (dict(qk_norm=True), "adamw"),
    "no biases": (dict(qkv_bias=False, bias=False), "adamw"),
    "untied head": (dict(tie_weights=False), "adamw"),
    "all of the above (modern)": (MODERN, "adamw"),
    "GPT-2 + Muon": ({}, "muon"),
    "modern + Muon": (MODERN, "muon"),
}


def run_hash(name: str) -> str:
    """What a run of this variant trains, hashed: shape, schedule, change and optimizer."""
    change, optimizer = VARIANTS[name]
    return hashlib.sha256(json.dumps([SHAPE, TCFG, change, optimizer], sort_keys=True).encode()).hexdigest()[:16]


def machine(how: str) -> str:
    """The CPU's model name, its core count, PyTorch's CPU kernels, and how the runs shared it."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return (f"{names[0] if names else platform.processor() or platform.machine()}, {multiprocessing.cpu_count()} "
            f"cores, PyTorch kernels {torch.backends.cpu.get_cpu_capability()}, {how}")


def splits() -> tuple[torch.Tensor, torch.Tensor]:
    text = load_shakespeare()
    return split_by_position(torch.tensor(CharTokenizer.from_text(text).encode(text)), 0.1)


def one_run(job: tuple[str, int]) -> tuple[str, int, dict]:
    name, seed = job
    torch.set_num_threads(1)
    change, optimizer = VARIANTS[name]
    _, result = train_variant(ModernConfig(**SHAPE, **change), *splits(), TrainConfig(**TCFG), seed, optimizer)
    return name, seed, result | {"hash": run_hash(name), "torch": torch.__version__}


def speed_models(tcfg: TrainConfig) -> dict[str, tuple[ModernGPT, torch.optim.Optimizer]]:
    """Every variant built from seed 0, with its optimizer: what --speed trains."""
    models = {}
    for name, (change, optimizer) in VARIANTS.items():
        torch.manual_seed(0)
        model = ModernGPT(ModernConfig(**SHAPE, **change))
        models[name] = (model, make_optimizer(model, tcfg) if optimizer == "adamw" else make_muon(model, tcfg))
    return models


def measure_speed(models: dict, tcfg: TrainConfig, rounds: int) -> dict:
    """Median training tokens/s of every (model, optimizer): `rounds` rounds, each training every model for
    tcfg.total_steps steps, the models in a new random order each round."""
    train_data, val_data = splits()
    speeds = {name: [] for name in models}
    order = random.Random(0)
    for _ in range(rounds):
        for name in order.sample(list(models), len(models)):  # a new order every round: no variant always first
            model, optimizer = models[name]
            history = train(model, optimizer, train_data, val_data, tcfg, torch.Generator().manual_seed(0),
                            progress=False)
            speeds[name].append(tcfg.total_steps * tcfg.batch_size * model.cfg.context_length / history["seconds"])
    return {name: {"median_tokens_per_s": statistics.median(s), "rounds": s} for name, s in speeds.items()}


def speed_main(args, table: dict, build, script: str) -> None:
    """--speed of an ablation script: the models build(tcfg) makes, timed by measure_speed, into the JSON."""
    load_before = os.getloadavg()[0]
    if load_before > 0.5:
        print(f"warning: load average {load_before:.2f}: other work on the machine will be in the speeds", flush=True)
    torch.set_num_threads(1)
    steps = args.speed_steps
    tcfg = TrainConfig(**TCFG | dict(total_steps=steps, warmup_steps=1, eval_every=steps, eval_batches=1))
    table["speed"] = measure_speed(build(tcfg), tcfg, args.rounds)
    table["speed_measured"] = {"command": f"python -m course_lib.data.{script} " + " ".join(sys.argv[1:]),
                               "machine": machine("one process, 1 thread"), "date": time.strftime("%Y-%m-%d"),
                               "steps_per_round": steps,
                               "load_average_before_after": [load_before, os.getloadavg()[0]]}
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    for name, speed in table["speed"].items():
        print(f"{name:40s} {speed['median_tokens_per_s']:,.0f} tokens/s", flush=True)


def ordered(runs: dict, names) -> dict:
    """The runs in the order of `names` (the table's), each variant's seeds in numeric order."""
    return {name: dict(sorted(runs[name].items(), key=lambda item: int(item[0]))) for name in names if name in runs}


def run_jobs(one_run, jobs: list, workers: int, table: dict, out: Path, names) -> None:
    """Run the (variant, seed, ...) jobs in `workers` spawned processes; after each, put its result into
    table["runs"] and rewrite the JSON, so that a stopped job keeps what it finished."""
    runs = table.setdefault("runs", {})
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for name, seed, result in pool.imap_unordered(one_run, jobs):
            runs.setdefault(name, {})[str(seed)] = result
            table.update(runs=ordered(runs, names), date=time.strftime("%Y-%m-%d"))
            out.write_text(json.dumps(table, indent=1) + "\n")
            print(f"{name:40s} seed {seed}: val {result['val_loss']:.4f}, {result['tokens_per_s']:,.0f} tokens/s",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2, help="runs at once, one thread each")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--speed", action="store_true", help="measure every variant's speed instead (see above)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--speed-steps", type=int, default=100)
    args = parser.parse_args()
    table = json.loads(args.out.read_text()) if args.out.exists() else {}
    if args.speed:
        return speed_main(args, table, speed_models, "make_modern_ablation")
    table.update(command="python -m course_lib.data.make_modern_ablation " + " ".join(sys.argv[1:]),
                 machine=machine(f"{args.workers} runs at once, 1 thread each"), torch=torch.__version__, shape=SHAPE,
                 train=TCFG,
                 changes={n: c for n, (c, _) in VARIANTS.items()}, optimizers={n: o for n, (_, o) in VARIANTS.items()})
    runs = table.get("runs", {})
    jobs = [(name, seed) for seed in args.seeds for name in VARIANTS
            if runs.get(name, {}).get(str(seed), {}).get("hash") != run_hash(name)]
    run_jobs(one_run, jobs, args.workers, table, args.out, VARIANTS)


if __name__ == "__main__":
    main()

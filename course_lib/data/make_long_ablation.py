"""Not a lesson: the runs behind notebook 17's table "what a sliding window buys and costs" (long_ablation.json).

Every run trains notebook 16's "all of the above (modern)" model (make_modern_ablation's SHAPE + MODERN: notebook
09's character model, context 64) as a LongGPT with a sliding window or without, on notebook 09's schedule (TCFG)
with AdamW, from a seed, on one thread, and measures the validation loss on 64 fixed batches and the training
tokens per second: course_lib.modern.train_variant with model_class=LongGPT. The variants: full
attention, windows of 32, 16 and 8 on every layer, and Gemma 2's alternation (window 8 on layers 0 and 2, full
attention on layer 1). Per variant the JSON also holds what the caches weigh (ring_cache_bytes, batch 1, 2 bytes a
number) after 64 tokens and after 4,096: analytic, no timing. The JSON is rewritten after every run; a run already
in it with the same hash (shape, schedule, change) is not run again, so a stopped job resumes where it stopped.

The runs' own tokens/s depend on what else the machine did meanwhile; --speed measures speed apart, as
make_modern_ablation's does (one process, one thread, every variant for --speed-steps steps per round in a new order
each round, the median of --rounds rounds). Run it with nothing else on the machine.

    python -m course_lib.data.make_long_ablation --seeds 0 1 2 --workers 1
    python -m course_lib.data.make_long_ablation --speed --rounds 5 --speed-steps 100
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

from course_lib.data.make_modern_ablation import MODERN, SHAPE, TCFG, machine, run_jobs, speed_main, splits
from course_lib.long_context import LongConfig, LongGPT, ring_cache_bytes
from course_lib.modern import train_variant
from course_lib.training import TrainConfig, make_optimizer

OUT = Path(__file__).with_name("long_ablation.json")
VARIANTS = {  # name -> what changes from notebook 16's modern model, in the table's order
    "full attention (window 64)": dict(sliding_window=None),
    "window 32": dict(sliding_window=32),
    "window 16": dict(sliding_window=16),
    "window 8": dict(sliding_window=8),
    "local 8 / global alternating (Gemma 2)": dict(sliding_window=8, layer_types=("local", "global", "local")),
}
CACHE_TOKENS = (64, 4096)  # the lengths at which the caches' bytes are recorded


def config(name: str) -> LongConfig:
    return LongConfig(**SHAPE, **MODERN, **VARIANTS[name])


def run_hash(name: str, tcfg: dict = TCFG) -> str:
    """What a run of this variant trains, hashed: shape, schedule, modern change and window."""
    what = [SHAPE, tcfg, MODERN, VARIANTS[name], "adamw"]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def one_run(job: tuple[str, int, dict]) -> tuple[str, int, dict]:
    """One seed of one variant: notebook 16's train_variant, building a LongGPT."""
    name, seed, tcfg_fields = job
    torch.set_num_threads(1)
    _, result = train_variant(config(name), *splits(), TrainConfig(**tcfg_fields), seed, model_class=LongGPT)
    return name, seed, result | {"hash": run_hash(name, tcfg_fields), "torch": torch.__version__}


def speed_models(tcfg: TrainConfig) -> dict[str, tuple[LongGPT, torch.optim.Optimizer]]:
    """Every variant built from seed 0, with AdamW: what --speed trains."""
    models = {}
    for name in VARIANTS:
        torch.manual_seed(0)
        model = LongGPT(config(name))
        models[name] = (model, make_optimizer(model, tcfg))
    return models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=1, help="runs at once, one thread each")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--steps", type=int, default=None, help="a shorter schedule, for a smoke test only")
    parser.add_argument("--speed", action="store_true", help="measure every variant's speed instead (see above)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--speed-steps", type=int, default=100)
    args = parser.parse_args()
    tcfg = TCFG if args.steps is None else TCFG | dict(total_steps=args.steps, warmup_steps=min(50, args.steps // 2),
                                                       eval_every=args.steps)
    table = json.loads(args.out.read_text()) if args.out.exists() else {}
    if args.speed:
        return speed_main(args, table, speed_models, "make_long_ablation")
    table.update(command="python -m course_lib.data.make_long_ablation " + " ".join(sys.argv[1:]),
                 machine=machine(f"{args.workers} runs at once, 1 thread each"), torch=torch.__version__,
                 shape=SHAPE | MODERN, train=tcfg, changes={n: VARIANTS[n] for n in VARIANTS},
                 cache_bytes={n: {str(t): ring_cache_bytes(config(n), t) for t in CACHE_TOKENS} for n in VARIANTS},
                 cache_bytes_note="ring_cache_bytes(cfg, tokens): batch 1, 2 bytes a number, keys and values")
    runs = table.get("runs", {})
    jobs = [(name, seed, tcfg) for seed in args.seeds for name in VARIANTS
            if runs.get(name, {}).get(str(seed), {}).get("hash") != run_hash(name, tcfg)]
    run_jobs(one_run, jobs, args.workers, table, args.out, VARIANTS)


if __name__ == "__main__":
    main()

"""Where a training step spends its time: torch.profiler on one step of course_lib's GPTModel and one of Hugging
Face's GPT2LMHeadModel (same config, weights and batch as train_step.py), self CPU time per operator side by side.
This is the profile behind train_step.py's ratio: where the two columns agree, the course cannot be faster
without computing something else.

    python benchmarks/profile_train_step.py                 # the small size of train_step.py
    python benchmarks/profile_train_step.py --size gpt2-124M
    python benchmarks/profile_train_step.py --quick         # smoke run
"""

from collections import defaultdict
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from common import Run, build_pair, course_logits, hf_logits, make_train_step, parse_args, print_table, random_batch
from train_step import QUICK_SIZES, SIZES

TOP = 15  # operators shown


def self_cpu_ms(steps: dict[str, Callable[[], float]], repeats: int) -> dict[str, dict[str, float]]:
    """name -> {operator -> self CPU milliseconds per step}: after one warm-up step each, `repeats` rounds in
    which every step is profiled once, A B A B, so that a change of machine load hits both alike."""
    totals = {name: defaultdict(float) for name in steps}
    for step in steps.values():
        step()
    for _ in range(repeats):
        for name, step in steps.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step()
            for event in prof.key_averages():
                totals[name][event.key] += event.self_cpu_time_total / 1e3 / repeats
    return {name: dict(ops) for name, ops in totals.items()}


def main():
    def extra(parser):
        parser.add_argument("--size", choices=sorted(SIZES), default="small (emb 256, 4 layers)",
                            help="one of train_step.py's sizes")

    args = parse_args(__doc__, extra)
    name = next(iter(QUICK_SIZES)) if args.quick else args.size
    run = Run(f"profile_train_step_{name.split()[0]}", args)  # one JSON file per size
    emb_dim, n_layers, n_heads, context_length, batch, tokens = {**SIZES, **QUICK_SIZES}[name]
    repeats = args.repeats or (1 if args.quick else 3)
    course, hf = build_pair(emb_dim, n_layers, n_heads, context_length)
    ids, targets = random_batch(batch, tokens, course.cfg.vocab_size)
    ms = self_cpu_ms({"course": make_train_step(course, course_logits, ids, targets),
                      "hf": make_train_step(hf, hf_logits, ids, targets)}, repeats)
    total = {k: sum(v.values()) for k, v in ms.items()}
    ops = sorted(set(ms["course"]) | set(ms["hf"]), key=lambda op: -max(ms["course"].get(op, 0), ms["hf"].get(op, 0)))
    rows = [[op, f"{ms['course'].get(op, 0):.1f}", f"{ms['hf'].get(op, 0):.1f}",
             f"{100 * ms['course'].get(op, 0) / total['course']:.1f}%"] for op in ops[:TOP]]
    rows.append(["all operators", f"{total['course']:.1f}", f"{total['hf']:.1f}", "100%"])
    print_table(["operator", "course ms", "HF ms", "course share"], rows,
                title=f"self CPU time per training step, {name}, batch {batch}x{tokens}, "
                      f"{torch.get_num_threads()} threads, mean of {repeats} profiled steps each, interleaved")
    run.finish({"size": name, "batch": batch, "tokens": tokens, "repeats": repeats,
                "self_cpu_ms_per_step": ms, "total_self_cpu_ms": total})


if __name__ == "__main__":
    main()

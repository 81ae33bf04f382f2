"""One training step (forward + backward + AdamW) of course_lib's GPTModel vs Hugging Face's GPT2LMHeadModel,
same config, same weights, same batch, float32 on the CPU; interleaved repetitions, medians, course/HF ratio.
No goal is judged here: the same computation cannot be much faster than HF's; the founded training goal is MFU
against a measured matmul peak, benchmarks/mfu.py's.

    python benchmarks/train_step.py            # a few minutes on 2 cores
    python benchmarks/train_step.py --quick    # smoke run
"""

import math

import torch

from common import (Run, build_pair, count_params, course_logits, fmt_s, hf_logits, make_train_step, median,
                    paired_ratio, parse_args, print_table, random_batch, summarize, time_interleaved)

SIZES = {  # name: (emb_dim, n_layers, n_heads, context_length, batch, tokens)
    "small (emb 256, 4 layers)": (256, 4, 4, 256, 8, 256),
    "gpt2-124M": (768, 12, 12, 1024, 4, 256),
}
QUICK_SIZES = {"tiny (emb 64, 2 layers)": (64, 2, 4, 64, 2, 32)}


def main():
    args = parse_args(__doc__)
    run = Run("train_step", args)
    sizes = QUICK_SIZES if args.quick else SIZES
    repeats = args.repeats or (2 if args.quick else 5)
    rows, results = [], []
    for name, (emb_dim, n_layers, n_heads, context_length, batch, tokens) in sizes.items():
        course, hf = build_pair(emb_dim, n_layers, n_heads, context_length)
        ids, targets = random_batch(batch, tokens, course.cfg.vocab_size)
        steps = {"course": make_train_step(course, course_logits, ids, targets),
                 "hf": make_train_step(hf, hf_logits, ids, targets)}
        first = {k: step() for k, step in steps.items()}  # same weights, same batch: same loss
        assert all(math.isclose(loss, first["hf"], rel_tol=1e-5) for loss in first.values()), first
        timings = time_interleaved(steps, repeats=repeats, warmup=1)
        times = timings.wall
        last = {k: step() for k, step in steps.items()}  # after repeats + 3 identical AdamW steps
        # both models took the same steps: they must still agree (float rounding only), or the timing compares
        # two different computations
        assert all(math.isclose(loss, last["hf"], rel_tol=1e-4) for loss in last.values()), last
        ratio = median(times["course"]) / median(times["hf"])
        cpu_ratio = median(timings.cpu["course"]) / median(timings.cpu["hf"])
        params = count_params(course)
        tokens_per_step = batch * tokens
        result = {
            "size": name, "emb_dim": emb_dim, "n_layers": n_layers, "n_heads": n_heads,
            "context_length": context_length, "batch": batch, "tokens": tokens, "parameters": params,
            "hf_attn_implementation": hf.config._attn_implementation, "dtype": "float32",
            "course": summarize(times["course"], timings.cpu["course"]),
            "hf": summarize(times["hf"], timings.cpu["hf"]),
            "ratio_course_over_hf": ratio, "paired_ratio": paired_ratio(times["course"], times["hf"]),
            "cpu_ratio_course_over_hf": cpu_ratio,
            "first_loss": first, "last_loss": last,
            "course_tokens_per_s": tokens_per_step / median(times["course"]),
            "hf_tokens_per_s": tokens_per_step / median(times["hf"]),
        }
        results.append(result)
        rows.append([name, f"{params / 1e6:.1f}M", f"{batch}x{tokens}", fmt_s(median(times["course"])),
                     fmt_s(median(times["hf"])), f"{ratio:.3f}", f"{result['paired_ratio']:.3f}",
                     f"{cpu_ratio:.3f}",
                     f"{first['course']:.4f}/{first['hf']:.4f} -> {last['course']:.4f}/{last['hf']:.4f}"])
        del course, hf, steps
    print_table(["size", "params", "batch", "course", f"HF ({results[0]['hf_attn_implementation']})",
                 "course/HF", "paired", "CPU-time", "loss course/HF first -> last"], rows,
                title=f"training step, float32, AdamW, {torch.get_num_threads()} threads, medians of {repeats} "
                       "interleaved repetitions after warm-up; course/HF = ratio of wall medians, paired = median "
                       "of per-round ratios, CPU-time = ratio of CPU-time medians (load-proof with 1 thread)")
    run.finish({"repeats": repeats, "sizes": results})


if __name__ == "__main__":
    torch.set_grad_enabled(True)
    main()

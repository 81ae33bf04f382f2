"""Training throughput and model FLOPs utilisation (MFU) of course_lib's GPTModel (and, for reference, Hugging
Face's GPT2LMHeadModel with the same weights) against this CPU's float32 matmul peak, measured in the same run:
square torch.mm timings are interleaved with the training steps, so both see the same machine load.

Model FLOPs per trained token = 6 N + 12 L T d  (forward 2 FLOPs per weight, backward 4; attention scores and
weighted values 4 T d per layer forward, times 3 with backward; T = tokens per sequence, not halved for the
causal mask). N counts every parameter once: the token embedding is included because GPT-2 ties it to the
output head, whose matmul is real work; the position embeddings (L x d, no matmul) are included too, an
over-count of 0.6 % at 124M. MFU = tokens/s x FLOPs per token / measured peak FLOP/s.

The peak is the fastest square torch.mm (1024, 2048, 4096), unless one of the training step's own matrix-product
operators runs faster in the profile below: a peak that some kernel beats is no peak.

Where the rest goes: one course step is profiled (self CPU time per operator, profile_train_step.py's method) and
its FLOPs are counted per operator (torch.utils.flop_counter), so each matrix-product operator gets its own
achieved FLOP/s against the peak, and the time outside them is listed by operator. The MFU is roughly (share of the
step in matrix products) x (their FLOP/s / peak) x (model FLOPs / counted FLOPs, about 1.05: flop_counter does not
count the CPU's attention kernel); the profiled step and the timed median differ by a few percent, so the product
only approximates the timed MFU.

    python benchmarks/mfu.py            # a few minutes on 2 cores
    python benchmarks/mfu.py --quick    # smoke run
"""

from collections import defaultdict
from dataclasses import replace

import torch
from torch.utils.flop_counter import FlopCounterMode

from common import (Run, build_pair, count_params, course_logits, hf_logits, make_train_step, median,
                    parse_args, print_table, random_batch, summarize, time_interleaved)
from course_lib.distributed import flops_per_token as model_flops_per_token
from profile_train_step import self_cpu_ms

PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm")  # the matrix products; flop_counter does not count the CPU's
# flash-attention kernel, which is listed by time among the rest (its 12 L T d FLOPs are 4% of 6N + 12 L T d here)


def matmul_fn(n: int):
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    return lambda: torch.mm(a, b, out=out)


def main():
    args = parse_args(__doc__)
    run = Run("mfu", args)
    if args.quick:
        shape, batch, tokens, sizes, repeats = (64, 2, 4, 64), 2, 32, (256, 512), args.repeats or 2
    else:
        shape, batch, tokens, sizes, repeats = (768, 12, 12, 1024), 4, 256, (1024, 2048, 4096), args.repeats or 5
    emb_dim, n_layers, n_heads, context_length = shape
    course, hf = build_pair(emb_dim, n_layers, n_heads, context_length)
    ids, targets = random_batch(batch, tokens, course.cfg.vocab_size)
    fns = {f"mm {n}": matmul_fn(n) for n in sizes}
    fns["course"] = make_train_step(course, course_logits, ids, targets)
    fns["hf"] = make_train_step(hf, hf_logits, ids, targets)
    timings = time_interleaved(fns, repeats=repeats, warmup=1)
    times = timings.wall

    peak_by_size = {n: 2 * n**3 / median(times[f"mm {n}"]) for n in sizes}

    # where the step's time goes: FLOPs per operator (counted) against self CPU time per operator (profiled)
    step = make_train_step(course, course_logits, ids, targets)
    with FlopCounterMode(display=False) as counter:
        step()
    flops = defaultdict(int)
    for op, count in counter.get_flop_counts()["Global"].items():
        flops["aten::" + str(op).split(".")[1]] += count
    ms = self_cpu_ms({"course": step}, repeats=3)["course"]
    rates = {op: flops.get(op, 0) / (ms[op] / 1e3) for op in PRODUCTS if ms.get(op)}
    # the peak: the fastest square torch.mm, unless one of the step's own products ran faster (a peak that a
    # kernel beats is no peak)
    peak = max(*peak_by_size.values(), *rates.values())
    peak_source = next((f"torch.mm {n}x{n}" for n, p in peak_by_size.items() if p == peak),
                       next((f"{op} in the step" for op, r in rates.items() if r == peak), ""))

    params = count_params(course)
    # notebook 13's 6N + 12LTd, with T the tokens per row trained here
    flops_per_token = model_flops_per_token(replace(course.cfg, context_length=tokens), params)
    flops_6n = 6 * params
    flops_attention = flops_per_token - flops_6n
    rows = [[f"torch.mm {n}x{n} float32", "", f"{p / 1e9:.1f}", "peak" if p == peak else ""]
            for n, p in peak_by_size.items()]
    if peak_source.endswith("in the step"):
        rows.append([f"{peak_source}, profiled", "", f"{peak / 1e9:.1f}", "peak"])
    training = {}
    for name in ("course", "hf"):
        tokens_per_s = batch * tokens / median(times[name])
        achieved = tokens_per_s * flops_per_token
        training[name] = {**summarize(times[name], timings.cpu[name]), "tokens_per_s": tokens_per_s,
                          "achieved_flop_per_s": achieved,
                          "mfu": achieved / peak, "mfu_6n_only": tokens_per_s * flops_6n / peak}
        label = "course GPTModel" if name == "course" else f"HF GPT2LMHeadModel ({hf.config._attn_implementation})"
        rows.append([f"train step, {label}", f"{tokens_per_s:.0f}", f"{achieved / 1e9:.1f}",
                     f"MFU {training[name]['mfu']:.1%} (6N only: {training[name]['mfu_6n_only']:.1%})"])
    print_table(["what", "tokens/s", "GFLOP/s", ""], rows,
                title=f"MFU, {torch.get_num_threads()} threads, {params / 1e6:.1f}M parameters, "
                      f"batch {batch} x {tokens} tokens, AdamW, float32; "
                      f"FLOPs/token = 6N + 12LTd = {flops_6n / 1e6:.0f}M + {flops_attention / 1e6:.1f}M; "
                      f"medians of {repeats} interleaved repetitions")

    step_ms = sum(ms.values())
    product_ms = sum(ms.get(op, 0) for op in PRODUCTS)
    product_flops = sum(flops.get(op, 0) for op in PRODUCTS)
    unmatched = {op: count for op, count in flops.items() if op not in PRODUCTS}
    rows = [[op.removeprefix("aten::"), f"{ms[op]:.0f}", f"{100 * ms[op] / step_ms:.1f}%",
             f"{flops.get(op, 0) / 1e9:.1f}", f"{rate / 1e9:.1f}", f"{rate / peak:.1%}"] for op, rate in rates.items()]
    rows.append(["all matrix products", f"{product_ms:.0f}", f"{100 * product_ms / step_ms:.1f}%",
                 f"{product_flops / 1e9:.1f}", f"{product_flops / (product_ms / 1e3) / 1e9:.1f}",
                 f"{product_flops / (product_ms / 1e3) / peak:.1%}"])
    others = sorted((op for op in ms if op not in PRODUCTS), key=lambda op: -ms[op])
    for op in others[:8]:
        rows.append([op.removeprefix("aten::"), f"{ms[op]:.0f}", f"{100 * ms[op] / step_ms:.1f}%", "", "", ""])
    rest = step_ms - product_ms - sum(ms[op] for op in others[:8])
    rows.append([f"{len(others) - 8} other operators", f"{rest:.0f}", f"{100 * rest / step_ms:.1f}%", "", "", ""])
    rows.append(["the whole step (profiled)", f"{step_ms:.0f}", "100%", f"{sum(flops.values()) / 1e9:.1f}", "", ""])
    print_table(["operator", "ms", "share of step", "GFLOP", "GFLOP/s", "of peak"], rows,
                title="where a course training step's time goes (one step profiled 3 times; FLOPs counted per "
                      "operator)")
    breakdown = {"self_cpu_ms": ms, "flops": dict(flops), "product_ms": product_ms, "product_flops": product_flops,
                 "step_ms": step_ms, "product_share_of_step": product_ms / step_ms,
                 "product_rate_of_peak": product_flops / (product_ms / 1e3) / peak,
                 "flops_outside_products": unmatched}
    run.finish({
        "breakdown": breakdown,
        "emb_dim": emb_dim, "n_layers": n_layers, "n_heads": n_heads, "batch": batch, "tokens": tokens,
        "parameters": params, "parameters_counting": "all, tied matrix once, embeddings included",
        "flops_per_token": flops_per_token, "flops_6n": flops_6n, "flops_attention_12LTd": flops_attention,
        "matmul_gflop_per_s": {str(n): p / 1e9 for n, p in peak_by_size.items()},
        "matmul_times": {str(n): summarize(times[f"mm {n}"], timings.cpu[f"mm {n}"]) for n in sizes},
        "peak_gflop_per_s": peak / 1e9, "peak_source": peak_source, "training": training, "repeats": repeats,
    })


if __name__ == "__main__":
    main()

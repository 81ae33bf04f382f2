"""Training throughput and model FLOPs utilisation (MFU) of course_lib's GPTModel (and, for reference, Hugging
Face's GPT2LMHeadModel with the same weights) against this CPU's float32 matmul peak, measured in the same run:
square torch.mm timings are interleaved with the training steps, so both see the same machine load.

Model FLOPs per trained token = 6 N + 12 L T d  (forward 2 FLOPs per weight, backward 4; attention scores and
weighted values 4 T d per layer forward, times 3 with backward; T = tokens per sequence, not halved for the
causal mask). N counts every parameter once: the token embedding is included because GPT-2 ties it to the
output head, whose matmul is real work; the position embeddings (L x d, no matmul) are included too, an
over-count of 0.6 % at 124M. MFU = tokens/s x FLOPs per token / measured peak FLOP/s.

    python benchmarks/mfu.py            # a few minutes on 2 cores
    python benchmarks/mfu.py --quick    # smoke run
"""

import torch

from common import (Run, build_pair, count_params, course_logits, hf_logits, make_train_step, median,
                    parse_args, print_table, random_batch, summarize, time_interleaved)


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
    peak = max(peak_by_size.values())
    params = count_params(course)
    flops_6n = 6 * params
    flops_attention = 12 * n_layers * tokens * emb_dim
    flops_per_token = flops_6n + flops_attention
    rows = [[f"torch.mm {n}x{n} float32", "", f"{p / 1e9:.1f}", "peak" if p == peak else ""]
            for n, p in peak_by_size.items()]
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
    run.finish({
        "emb_dim": emb_dim, "n_layers": n_layers, "n_heads": n_heads, "batch": batch, "tokens": tokens,
        "parameters": params, "parameters_counting": "all, tied matrix once, embeddings included",
        "flops_per_token": flops_per_token, "flops_6n": flops_6n, "flops_attention_12LTd": flops_attention,
        "matmul_gflop_per_s": {str(n): p / 1e9 for n, p in peak_by_size.items()},
        "matmul_times": {str(n): summarize(times[f"mm {n}"], timings.cpu[f"mm {n}"]) for n in sizes},
        "peak_gflop_per_s": peak / 1e9, "training": training, "repeats": repeats,
    })


if __name__ == "__main__":
    main()

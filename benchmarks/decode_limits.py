"""Greedy decoding of GPT-2 124M at batch 1 against its physical limit, one thread (issue 16, goal 1).

At batch 1 every new token reads every weight once, and does about 2 FLOPs per weight: far too little arithmetic
per byte for a CPU's matrix units, so the speed limit is memory bandwidth. The limit in tokens/s is

    measured bandwidth (bytes/s)  /  bytes of weights read per token

with the bandwidth measured in the same run as the decoding: a float32 `sum` over a 1 GiB tensor, interleaved
with the decoding repetitions so that both see the same machine load. Bytes per token counts every parameter once
(the tied embedding / output head once), except the position embedding, of which one row is read. Reported:

- course and Hugging Face tokens/s, each as a share of the limit, medians of interleaved repetitions; course / HF
  by wall time and by CPU time (one thread: the CPU time hardly moves when other jobs share the cores);
- the KV cache judged by what it is for: the course's per-token time stays flat along the sequence (tokens 180-200
  within 10% of tokens 20-40), and the FLOPs it removes (torch.utils.flop_counter: one cached step against
  re-reading the whole sequence at the same position).

Every variant's tokens are asserted equal to Hugging Face's greedy tokens.

    python benchmarks/decode_limits.py            # about 3 minutes on 2 cores
    python benchmarks/decode_limits.py --quick    # smoke run
"""

import time

import torch
from common import (Run, build_pair, hf_greedy, median, paired_ratio, parse_args, print_table, summarize,
                    time_interleaved)
from torch.utils.flop_counter import FlopCounterMode

from course_lib.tokenization import gpt2_tokenizer

PROMPT = "Every effort moves you"
BANDWIDTH_BYTES = 1 << 30  # the tensor summed to measure bandwidth: far larger than any cache


def weight_bytes_per_token(model) -> int:
    "Bytes of parameters one decoding step reads: all of them once, but only one row of the position embedding."
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # the tied matrix counted once
    pos = model.embedding.pos_emb.weight
    return total - pos.numel() * pos.element_size() + pos.shape[1] * pos.element_size()


def course_stepwise(model, prompt: torch.Tensor, new_tokens: int):
    "Greedy decoding with the KV cache, one forward per token, timing each step: (tokens, seconds per step)."
    steps = []
    with torch.no_grad():
        caches = model.new_kv_caches()
        logits = model(prompt, kv_caches=caches, last_only=True)
        tokens = prompt
        for _ in range(new_tokens):
            start = time.perf_counter()
            next_id = logits[:, -1].argmax(dim=-1, keepdim=True)  # (1, 1)
            tokens = torch.cat([tokens, next_id], dim=1)
            logits = model(next_id, kv_caches=caches, last_only=True)
            steps.append(time.perf_counter() - start)
    return tokens, steps


def main():
    args = parse_args(__doc__)
    if args.threads is None:
        torch.set_num_threads(1)  # the limit is one core's bandwidth; see the docstring
    run = Run("decode_limits", args)
    if args.quick:
        shape, new_tokens, repeats = (64, 2, 4, 256), 40, args.repeats or 2
    else:
        shape, new_tokens, repeats = (768, 12, 12, 1024), 200, args.repeats or 5
    emb_dim, n_layers, n_heads, context_length = shape
    course, hf = build_pair(emb_dim, n_layers, n_heads, context_length)
    prompt = torch.tensor([gpt2_tokenizer().encode(PROMPT)])  # (1, prompt_tokens)
    hf_run = hf_greedy(hf, prompt, new_tokens)
    reference = hf_run()
    course_tokens, _ = course_stepwise(course, prompt, new_tokens)
    assert torch.equal(course_tokens, reference), "course and HF greedy tokens differ"

    big = torch.ones(BANDWIDTH_BYTES // 4)
    per_token_steps = []

    def course_run():
        tokens, steps = course_stepwise(course, prompt, new_tokens)
        per_token_steps.append(steps)
        assert torch.equal(tokens, reference)

    timings = time_interleaved({"bandwidth": lambda: big.sum(), "course": course_run, "hf": hf_run},
                               repeats=repeats, warmup=1)
    per_token_steps = per_token_steps[1:]  # the warm-up's steps are not counted
    bandwidth = BANDWIDTH_BYTES / median(timings.wall["bandwidth"])
    bytes_per_token = weight_bytes_per_token(course)
    limit = bandwidth / bytes_per_token
    tps = {name: new_tokens / median(timings.wall[name]) for name in ("course", "hf")}
    cpu_ratio = median(timings.cpu["hf"]) / median(timings.cpu["course"])  # course / HF tokens per CPU second

    # per-token time along the sequence: medians over repetitions of each step, then over the two windows
    step_medians = [median([steps[i] for steps in per_token_steps]) for i in range(new_tokens)]
    early, late = (20, 40), (new_tokens - 20, new_tokens)
    early_s, late_s = median(step_medians[slice(*early)]), median(step_medians[slice(*late)])

    # FLOPs of one step at the last position: cached (one token) against recomputing the whole sequence
    position = prompt.shape[1] + new_tokens - 1
    with torch.no_grad():
        caches = course.new_kv_caches()
        course(reference[:, :position], kv_caches=caches)
        with FlopCounterMode(display=False) as cached_flops:
            course(reference[:, position:position + 1], kv_caches=caches, last_only=True)
        with FlopCounterMode(display=False) as full_flops:
            course(reference[:, :position + 1], last_only=True)

    rows = [
        ["memory bandwidth, float32 sum over 1 GiB", f"{bandwidth / 1e9:.1f} GB/s", "", ""],
        ["weights read per token", f"{bytes_per_token / 1e6:.1f} MB", "", ""],
        ["limit = bandwidth / bytes per token", f"{limit:.1f} tokens/s", "100%", ""],
        ["course, KV cache", f"{tps['course']:.1f} tokens/s", f"{tps['course'] / limit:.0%}", ""],
        [f"HF generate ({hf.config._attn_implementation})", f"{tps['hf']:.1f} tokens/s", f"{tps['hf'] / limit:.0%}",
         ""],
        ["course / HF, wall time", f"{tps['course'] / tps['hf']:.2f}x", "",
         f"paired {1 / paired_ratio(timings.wall['course'], timings.wall['hf']):.2f}x"],
        ["course / HF, CPU time", f"{cpu_ratio:.2f}x", "", ""],
        [f"course per token, tokens {early[0]}-{early[1]} vs {late[0]}-{late[1]}",
         f"{early_s * 1e3:.1f} vs {late_s * 1e3:.1f} ms", f"{late_s / early_s - 1:+.1%}",
         "flat: within 10%" if abs(late_s / early_s - 1) <= 0.10 else "NOT flat"],
        [f"FLOPs of the step at position {position}", f"{cached_flops.get_total_flops() / 1e9:.3g} GFLOP cached",
         f"{full_flops.get_total_flops() / cached_flops.get_total_flops():.0f}x fewer",
         f"{full_flops.get_total_flops() / 1e9:.3g} GFLOP recomputed"],
    ]
    print_table(["what", "value", "share / change", ""], rows,
                title=f"greedy decoding, batch 1, {torch.get_num_threads()} thread(s), emb {emb_dim} / {n_layers} "
                      f"layers, {new_tokens} new tokens after {prompt.shape[1]}, float32; medians of {repeats} "
                      "interleaved repetitions; all tokens equal to HF's")
    run.finish({
        "emb_dim": emb_dim, "n_layers": n_layers, "new_tokens": new_tokens, "repeats": repeats,
        "threads": torch.get_num_threads(), "bandwidth_bytes_per_s": bandwidth,
        "bandwidth": summarize(timings.wall["bandwidth"], timings.cpu["bandwidth"]),
        "weight_bytes_per_token": bytes_per_token, "limit_tokens_per_s": limit, "tokens_per_s": tps,
        "share_of_limit": {name: value / limit for name, value in tps.items()},
        "course": summarize(timings.wall["course"], timings.cpu["course"]),
        "hf": summarize(timings.wall["hf"], timings.cpu["hf"]),
        "course_over_hf_wall": tps["course"] / tps["hf"], "course_over_hf_cpu": cpu_ratio,
        "per_token_ms": {"early_window": list(early), "late_window": list(late), "early": early_s * 1e3,
                         "late": late_s * 1e3, "late_over_early": late_s / early_s},
        "flops_at_position": position, "flops_cached": cached_flops.get_total_flops(),
        "flops_recomputed": full_flops.get_total_flops(),
    })


if __name__ == "__main__":
    main()

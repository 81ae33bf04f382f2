"""Greedy generation with a KV cache: course_lib's generate vs Hugging Face's GPT2LMHeadModel.generate on the
124M shape (random weights, the same in both), 200 new tokens from a short prompt, outputs asserted identical;
plus the course's own speedup of the KV cache over re-reading the whole sequence every step, and the
weight-reading floor: one single-token nn.Linear call per weight matrix, the least any float32 decoder with these
weights must do per new token (batch 1 is bound by memory bandwidth, not by arithmetic). No goal is judged here:
the course's founded decoding goals, shares of a measured bandwidth limit, are benchmarks/decode_limits.py's.

    python benchmarks/generation.py            # a few minutes on 2 cores
    python benchmarks/generation.py --quick    # smoke run
"""

import time

import torch
import torch.nn.functional as F
from common import (Run, build_pair, fmt_s, hf_greedy, median, paired_ratio, parse_args, print_table, summarize,
                    time_interleaved)
from course_lib.generation import generate
from course_lib.tokenization import gpt2_tokenizer

PROMPT = "Every effort moves you"
FLOOR_TOKENS = 20  # tokens' worth of weight reads per timed floor call


def weight_read_floor(model: torch.nn.Module, tokens: int):
    """A function that does, `tokens` times, one F.linear of a single token through every nn.Linear of the model
    (the tied output head included): the weight reads of `tokens` decoding steps and nothing else."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m.in_features: torch.randn(1, m.in_features) for m in layers}  # (1, in_features)

    def fn():
        with torch.no_grad():
            for _ in range(tokens):
                for m in layers:
                    F.linear(inputs[m.in_features], m.weight, m.bias)
    return fn


def main():
    args = parse_args(__doc__)
    run = Run("generation", args)
    if args.quick:
        shape, new_tokens, repeats = (64, 2, 4, 256), 20, args.repeats or 2
    else:
        shape, new_tokens, repeats = (768, 12, 12, 1024), 200, args.repeats or 3
    emb_dim, n_layers, n_heads, context_length = shape
    course, hf = build_pair(emb_dim, n_layers, n_heads, context_length)
    prompt = torch.tensor([gpt2_tokenizer().encode(PROMPT)])  # (1, prompt_tokens)

    def course_cached():
        return generate(course, prompt, max_new_tokens=new_tokens)  # greedy, use_cache=True

    def course_uncached():
        return generate(course, prompt, max_new_tokens=new_tokens, use_cache=False)

    # Greedy, KV cache, exactly new_tokens tokens and no end-of-text handling, like the course's call above
    # (eos_token_id=None: no stopping criterion and no min-length logits processor, which would be extra work).
    hf_cached = hf_greedy(hf, prompt, new_tokens)

    outputs = {"course": course_cached(), "hf": hf_cached()}  # also the warm-up
    assert outputs["course"].shape == (1, prompt.shape[1] + new_tokens), outputs["course"].shape
    if not torch.equal(outputs["course"], outputs["hf"]):
        differ = (outputs["course"] != outputs["hf"]).nonzero()
        raise AssertionError(f"course and HF greedy outputs differ from position {differ[0, 1].item()}")
    variants = {"course": course_cached, "hf": hf_cached, "floor": weight_read_floor(course, FLOOR_TOKENS)}
    timings = time_interleaved(variants, repeats=repeats, warmup=0)
    times = timings.wall
    start, start_cpu = time.perf_counter(), time.process_time()  # once: it is the slow one
    assert torch.equal(course_uncached(), outputs["course"]), "the KV cache changed the greedy tokens"
    uncached, uncached_cpu = [time.perf_counter() - start], [time.process_time() - start_cpu]

    tps = {k: new_tokens / median(times[k]) for k in ("course", "hf")}
    tps["weight_read_floor"] = FLOOR_TOKENS / median(times["floor"])
    tps["course_uncached"] = new_tokens / median(uncached)
    vs_hf = tps["course"] / tps["hf"]
    cache_speedup = tps["course"] / tps["course_uncached"]
    cpu_vs_hf = median(timings.cpu["hf"]) / median(timings.cpu["course"])
    rows = [
        ["course generate, KV cache", fmt_s(median(times["course"])), f"{tps['course']:.1f}", ""],
        [f"HF generate, use_cache=True ({hf.config._attn_implementation})", fmt_s(median(times["hf"])),
         f"{tps['hf']:.1f}", ""],
        ["course generate, use_cache=False", fmt_s(median(uncached)), f"{tps['course_uncached']:.1f}", ""],
        ["floor: weight reads only (nn.Linear, 1 token)", fmt_s(median(times["floor"]) / FLOOR_TOKENS * new_tokens),
         f"{tps['weight_read_floor']:.1f}", "ceiling of the course"],
        ["course / HF tokens/s", "", f"{vs_hf:.2f}x", ""],
        ["course cached / uncached", "", f"{cache_speedup:.2f}x", "machine-bound: see decode_limits.py"],
        ["course / HF, by CPU time", "", f"{cpu_vs_hf:.2f}x", "load-proof with 1 thread"],
        ["floor / HF tokens/s", "", f"{tps['weight_read_floor'] / tps['hf']:.2f}x", "the most course / HF can be"],
    ]
    print_table(["variant", "time", "tokens/s", ""], rows,
                title=f"greedy generation, {torch.get_num_threads()} threads, emb {emb_dim} / {n_layers} layers, "
                      f"prompt {prompt.shape[1]} tokens, "
                      f"{new_tokens} new tokens, batch 1, float32; medians of {repeats} interleaved runs "
                      "(uncached: 1 run); outputs identical")
    run.finish({
        "emb_dim": emb_dim, "n_layers": n_layers, "n_heads": n_heads, "context_length": context_length,
        "prompt": PROMPT, "prompt_tokens": prompt.shape[1], "new_tokens": new_tokens, "repeats": repeats,
        "hf_attn_implementation": hf.config._attn_implementation, "outputs_identical": True,
        "course": summarize(times["course"], timings.cpu["course"]),
        "hf": summarize(times["hf"], timings.cpu["hf"]),
        "course_uncached": summarize(uncached, uncached_cpu), "tokens_per_s": tps,
        "cpu_ratio_course_over_hf_tokens_per_s": cpu_vs_hf,
        "weight_read_floor": {**summarize(times["floor"], timings.cpu["floor"]), "tokens_per_call": FLOOR_TOKENS,
                              "bytes_per_token": sum(p.numel() * p.element_size() for m in course.modules()
                                                     if isinstance(m, torch.nn.Linear) for p in m.parameters())},
        "ratio_floor_over_hf_tokens_per_s": tps["weight_read_floor"] / tps["hf"],
        "ratio_course_over_hf_tokens_per_s": vs_hf,
        "paired_ratio": paired_ratio(times["hf"], times["course"]),
        "cache_speedup": cache_speedup,
    })


if __name__ == "__main__":
    main()

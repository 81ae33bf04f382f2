"""Greedy decoding of GPT-2 124M at batch 1 against its physical limit (issue 16), one thread unless said.

At batch 1 every new token reads every weight once and does about 2 FLOPs per weight: far too little arithmetic
per byte for a CPU's vector units, so the speed limit is memory bandwidth. The limit in tokens/s is

    measured bandwidth (bytes/s)  /  bytes of weights read per token

Bandwidth is measured in the same run, interleaved with the decoding so that both see the same machine load, by
two kernels that each read 1 GiB once: a float32 `sum`, and a matrix-vector product x @ A with A of shape
(768, 349525), the shape and layout in which this CPU's matrix-vector kernel streams fastest. The limit uses the
faster of the two: a limit some kernel beats is no limit. Bytes per token count every parameter once (the tied
embedding / output head once), except the position embedding, of which one row is read, plus the keys and values
the step reads from the cache, averaged over the run's positions (1.5% of the weights at these lengths).

Every variant decodes the same prompt; each step's effect is measured against the one before it:

- course, growing KVCache     the cache of notebook 05: torch.cat at every step
- course, StaticKVCache       notebook 08's cache, allocated once and written in place; what `generate` runs
- + head transposed           experiment: the tied output head multiplied as x @ W^T from a contiguous (emb, vocab)
                              copy (154 MB more memory, built once per model)
- + fc as (in, out)           experiment: the feed-forward's first matrix, the only block matrix of the course with
                              more outputs than inputs, stored (in, out) and computed with torch.addmm, as GPT-2's
                              Conv1D does; the rest stay nn.Linear
- GPT-2 layout everywhere     experiment: every block matrix (in, out), the head as the course has it
- Hugging Face generate       sdpa attention, its own Conv1D layout
- course, StaticKVCache, 2 threads    the thread policy: is a second thread ever faster for batch-1 decoding?
- course in bfloat16          weights and cache in bfloat16 (sampling stays float32), against the bfloat16 limit
                              (half the bytes)

Every float32 variant's tokens are asserted equal to Hugging Face's greedy tokens; the bfloat16 run reports where
its tokens first differ from float32's. Also reported: per-token time along the sequence (the cache keeps it
flat: tokens 180-200 within 10% of tokens 20-40), the FLOPs the cache removes (torch.utils.flop_counter), and
one StaticKVCache step split into its matrix products (profiled) and everything else (its unprofiled time
less the products), from which follows the best
share of the limit this code could reach if every matrix product ran at the measured bandwidth; and the weight
layout alone, per block matrix shape, in float32 and bfloat16.

    python benchmarks/decode_limits.py               # about 6 minutes on 2 cores
    python benchmarks/decode_limits.py --under-load  # the same beside two busy loops: the thread policy's test
    python benchmarks/decode_limits.py --quick       # smoke run
"""

import copy
import subprocess
import sys
import time

import torch
from common import (
    Run,
    build_pair,
    hf_greedy,
    median,
    paired_ratio,
    parse_args,
    print_table,
    summarize,
    time_interleaved,
)
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from course_lib.generation import StaticKVCache
from course_lib.tokenization import gpt2_tokenizer

PROMPT = "Every effort moves you"
BANDWIDTH_BYTES = 1 << 30  # what each bandwidth kernel reads: far larger than any cache
MATMUL_OPS = ("aten::addmm", "aten::mm", "aten::bmm")  # the matrix products of a decoding step


class InOutLinear(nn.Module):
    """nn.Linear's function with the weight stored (in_features, out_features), computed as GPT-2's Conv1D does."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().t().contiguous())  # (in, out)
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        out = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)  # (batch * tokens, out)
        return out.view(*x.shape[:-1], out.shape[-1])


class TransposedHead(nn.Module):
    """The output head's function, x @ W^T, with W^T stored contiguous (emb_dim, vocab_size)."""

    def __init__(self, head: nn.Linear):
        super().__init__()
        self.weight_t = nn.Parameter(head.weight.detach().t().contiguous())

    def forward(self, x):
        return x @ self.weight_t


def with_layout(model: nn.Module, in_out: tuple[str, ...] = (), transposed_head: bool = False) -> nn.Module:
    """A copy of the course model with the named block matrices in (in, out) layout and, optionally, the head
    transposed. Names: W_query, W_key, W_value, out_proj (attention), fc, proj (feed-forward)."""
    model = copy.deepcopy(model)
    for block in model.trf_blocks:
        for name in in_out:
            owner = block.att if hasattr(block.att, name) else block.ff
            setattr(owner, name, InOutLinear(getattr(owner, name)))
    if transposed_head:
        model.out_head = TransposedHead(model.out_head)
    return model


def weight_bytes_per_token(model) -> int:
    "Bytes of parameters one decoding step reads: all of them once, but only one row of the position embedding."
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # the tied matrix counted once
    pos = model.embedding.pos_emb.weight
    return total - pos.numel() * pos.element_size() + pos.shape[1] * pos.element_size()


def cache_bytes_per_token(model, prompt_tokens: int, new_tokens: int) -> float:
    """Bytes of cached keys and values one decoding step reads, averaged over the steps of a run: the step that
    feeds position t reads t + 1 positions' keys and values in every layer."""
    cfg, size = model.cfg, next(model.parameters()).element_size()
    positions = range(prompt_tokens, prompt_tokens + new_tokens - 1)  # the positions of the fed tokens
    return sum(2 * cfg.n_layers * (t + 1) * cfg.emb_dim * size for t in positions) / len(positions)


def course_stepwise(model, prompt: torch.Tensor, new_tokens: int, static: bool = True):
    """Greedy decoding with a KV cache, one forward per token, timing each step: (tokens, seconds per step).
    The loop of `generate`'s cached path, written out so that each step can be timed."""
    steps = []
    with torch.no_grad():
        if static:
            caches = [StaticKVCache(prompt.shape[1] + new_tokens) for _ in model.trf_blocks]
        else:
            caches = model.new_kv_caches()
        logits = model(prompt, kv_caches=caches, last_only=True)
        tokens = prompt
        for step in range(new_tokens):
            start = time.perf_counter()
            next_id = logits[:, -1].argmax(dim=-1, keepdim=True)  # (1, 1)
            tokens = torch.cat([tokens, next_id], dim=1)
            if step < new_tokens - 1:  # as generate: no forward for a token nobody will extend
                logits = model(next_id, kv_caches=caches, last_only=True)
            steps.append(time.perf_counter() - start)
    return tokens, steps


def with_threads(threads: int, fn):
    "fn run with `threads` intra-op threads, the count restored afterwards."
    def run():
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return fn()
        finally:
            torch.set_num_threads(before)
    return run


def profile_matmuls(model, prompt: torch.Tensor, position: int) -> float:
    """Self CPU seconds of the matrix products in one StaticKVCache step at `position`, median of 5 profiled steps
    (each on a cache refilled to `position`). The profiler slows the small operations, not these long kernels."""
    seconds = []
    with torch.no_grad():
        for _ in range(5):
            caches = [StaticKVCache(position + 1) for _ in model.trf_blocks]
            model(prompt.repeat(1, position // prompt.shape[1] + 1)[:, :position], kv_caches=caches)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                model(prompt[:, :1], kv_caches=caches, last_only=True)
            seconds.append(sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in MATMUL_OPS) / 1e6)
    return median(seconds)


def layout_times(dtype: torch.dtype, repeats: int, quick: bool) -> dict[str, dict[str, float]]:
    """Seconds to multiply one row by 12 matrices of each GPT-2 124M block shape (as one token does through the
    12 blocks), stored (out, in) for F.linear or (in, out) for x @ W: medians of `repeats` interleaved calls."""
    shapes = {"W_query, W_key, W_value or out_proj (768, 768), 12 of the 48": (768, 768),
              "the three fused, as GPT-2 stores them (2304, 768)": (2304, 768), "fc (3072, 768)": (3072, 768),
              "proj (768, 3072)": (768, 3072), "head (50257, 768), once": (50257, 768)}
    if quick:
        shapes = {name: (out // 8, inp // 8) for name, (out, inp) in shapes.items()}
    times = {}
    for name, (out, inp) in shapes.items():
        count = 1 if name.startswith("head") else 12
        out_in = [torch.randn(out, inp).to(dtype) for _ in range(count)]
        in_out = [w.t().contiguous() for w in out_in]
        x = torch.randn(1, inp).to(dtype)
        timed = time_interleaved({"(out, in)": lambda x=x, ws=out_in: [torch.nn.functional.linear(x, w) for w in ws],
                                  "(in, out)": lambda x=x, ws=in_out: [x @ w for w in ws]}, repeats=repeats, warmup=1)
        times[name] = {layout: median(t) for layout, t in timed.wall.items()}
    return times


def busy_loops(count: int) -> list[subprocess.Popen]:
    "Processes that each keep one core busy, so that the decoding shares the machine as on a busy day."
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main():
    args = parse_args(__doc__, extra=lambda parser: parser.add_argument(
        "--under-load", action="store_true",
        help="run beside two busy loops (one per core of the course's machine); writes decode_limits_under_load.json"))
    threads = args.threads  # 1 by default: the limit is one core's bandwidth; see the docstring
    loops = busy_loops(2) if args.under_load else []
    try:
        measure(args, threads)
    finally:
        for loop in loops:
            loop.kill()


def measure(args, threads: int):
    run = Run("decode_limits_under_load" if args.under_load else "decode_limits", args)
    if args.quick:
        shape, new_tokens, repeats = (64, 2, 4, 256), 40, args.repeats or 2
    else:
        shape, new_tokens, repeats = (768, 12, 12, 1024), 200, args.repeats or 5
    emb_dim, n_layers, n_heads, context_length = shape
    course, hf = build_pair(emb_dim, n_layers, n_heads, context_length)
    course_bf16 = copy.deepcopy(course).to(torch.bfloat16)
    prompt = torch.tensor([gpt2_tokenizer().encode(PROMPT)])  # (1, prompt_tokens)
    hf_run = hf_greedy(hf, prompt, new_tokens)
    reference = hf_run()

    models = {
        "course, growing KVCache": (course, False),
        "course, StaticKVCache": (course, True),
        "+ head transposed": (with_layout(course, transposed_head=True), True),
        "+ fc as (in, out)": (with_layout(course, ("fc",), True), True),
        "GPT-2 layout everywhere": (with_layout(course, ("W_query", "W_key", "W_value", "out_proj", "fc", "proj")),
                                    True),
    }
    per_token_steps = {name: [] for name in models}

    def course_run(name, model, static):
        def go():
            tokens, steps = course_stepwise(model, prompt, new_tokens, static)
            per_token_steps[name].append(steps)
            assert torch.equal(tokens, reference), f"{name}: tokens differ from HF's"
        return go

    bf16_tokens = []

    def bf16_run():
        tokens, _ = course_stepwise(course_bf16, prompt, new_tokens)
        bf16_tokens.append(tokens)

    sum_tensor = torch.ones(BANDWIDTH_BYTES // 4)
    columns = BANDWIDTH_BYTES // 4 // 768
    gemv_matrix, gemv_vector = sum_tensor[:768 * columns].view(768, columns), torch.ones(1, 768)
    fns = {"bandwidth, sum": lambda: sum_tensor.sum(),
           "bandwidth, x @ A": lambda: gemv_vector @ gemv_matrix}
    fns.update({name: course_run(name, model, static) for name, (model, static) in models.items()})
    fns["Hugging Face generate"] = hf_run
    fns["course, StaticKVCache, 2 threads"] = with_threads(2, course_run("2 threads", course, True))
    per_token_steps["2 threads"] = []
    fns["course in bfloat16"] = bf16_run
    timings = time_interleaved(fns, repeats=repeats, warmup=1)

    bandwidths = {"sum": BANDWIDTH_BYTES / median(timings.wall["bandwidth, sum"]),
                  "x @ A": gemv_matrix.numel() * 4 / median(timings.wall["bandwidth, x @ A"])}
    bandwidth = max(bandwidths.values())
    weight_bytes = weight_bytes_per_token(course)
    cache_bytes = cache_bytes_per_token(course, prompt.shape[1], new_tokens)
    bytes_per_token = weight_bytes + cache_bytes
    limit = bandwidth / bytes_per_token
    bf16_bytes = weight_bytes_per_token(course_bf16) + cache_bytes_per_token(course_bf16, prompt.shape[1], new_tokens)
    limit_bf16 = bandwidth / bf16_bytes
    decoders = [name for name in fns if not name.startswith("bandwidth")]
    tps = {name: new_tokens / median(timings.wall[name]) for name in decoders}
    static_name = "course, StaticKVCache"

    # per-token time along the sequence: medians over repetitions of each step, then over the two windows
    early, late = (20, 40), (new_tokens - 21, new_tokens - 1)  # the last step runs no forward
    windows = {}
    for name, runs in per_token_steps.items():
        runs = runs[1:]  # the warm-up's steps are not counted
        step_medians = [median([steps[i] for steps in runs]) for i in range(new_tokens)]
        windows[name] = (median(step_medians[slice(*early)]), median(step_medians[slice(*late)]))

    # FLOPs of one step at the last position: cached (one token) against recomputing the whole sequence
    position = prompt.shape[1] + new_tokens - 1
    with torch.no_grad():
        caches = [StaticKVCache(position + 1) for _ in course.trf_blocks]
        course(reference[:, :position], kv_caches=caches)
        with FlopCounterMode(display=False) as cached_flops:
            course(reference[:, position:position + 1], kv_caches=caches, last_only=True)
        with FlopCounterMode(display=False) as full_flops:
            course(reference[:, :position + 1], last_only=True)

    # where a StaticKVCache step's time goes, and the best share of the limit that follows
    middle = new_tokens // 2  # the step that feeds the token at position prompt + middle
    profile_at = prompt.shape[1] + middle
    matmul_s = profile_matmuls(course, prompt, profile_at)
    step_s = median([steps[middle] for steps in per_token_steps[static_name][1:]])  # unprofiled, same position
    rest_s = step_s - matmul_s
    best_share = (bytes_per_token / bandwidth) / (bytes_per_token / bandwidth + rest_s)

    layouts = {str(dtype): layout_times(dtype, 2 if args.quick else 15, args.quick)
               for dtype in (torch.float32, torch.bfloat16)}

    first_diff = (bf16_tokens[-1] != reference)[0].nonzero()
    bf16_agree = new_tokens if len(first_diff) == 0 else int(first_diff[0]) - prompt.shape[1]

    hf_ms = 1e3 / tps["Hugging Face generate"]
    rows = [
        ["bandwidth, float32 sum over 1 GiB", f"{bandwidths['sum'] / 1e9:.1f} GB/s", "", ""],
        ["bandwidth, x @ A, A (768, 349525) float32", f"{bandwidths['x @ A'] / 1e9:.1f} GB/s", "",
         "the limit uses the faster"],
        ["read per token, float32: weights + cache", f"{bytes_per_token / 1e6:.1f} MB", "",
         f"{weight_bytes / 1e6:.1f} + {cache_bytes / 1e6:.1f} MB (mean over the steps)"],
        ["limit = bandwidth / bytes per token", f"{limit:.1f} tokens/s", "100%",
         f"{1e3 / limit:.1f} ms per token"],
    ]
    previous = None
    for name in decoders:
        share = tps[name] / (limit_bf16 if name == "course in bfloat16" else limit)
        ms = 1e3 / tps[name]
        if name == "GPT-2 layout everywhere":
            change = f"{ms - 1e3 / tps[static_name]:+.1f} ms vs StaticKVCache"
        elif name in models and previous is not None:
            change = f"{ms - previous:+.1f} ms vs the row above"
        elif name == "Hugging Face generate":
            change = "peer"
        elif name == "course in bfloat16":
            change = f"of the bfloat16 limit, {limit_bf16:.1f} tokens/s"
        else:
            change = ""
        rows.append([name, f"{tps[name]:.1f} tokens/s", f"{share:.0%}", f"{ms:.1f} ms/token; {change}".rstrip("; ")])
        if name in models:
            previous = ms
    rows += [
        ["course StaticKVCache / HF, wall", f"{tps[static_name] / tps['Hugging Face generate']:.2f}x", "",
         f"paired {1 / paired_ratio(timings.wall[static_name], timings.wall['Hugging Face generate']):.2f}x"],
        ["course StaticKVCache / HF, CPU time",
         f"{median(timings.cpu['Hugging Face generate']) / median(timings.cpu[static_name]):.2f}x", "", ""],
        ["2 threads / 1 thread, StaticKVCache", f"{tps['course, StaticKVCache, 2 threads'] / tps[static_name]:.2f}x",
         "", "tokens/s"],
    ]
    for name in ("course, growing KVCache", static_name):
        e, late_s = windows[name]
        rows.append([f"{name}: per token, tokens {early[0]}-{early[1]} vs {late[0]}-{late[1]}",
                     f"{e * 1e3:.1f} vs {late_s * 1e3:.1f} ms", f"{late_s / e - 1:+.1%}",
                     "flat: within 10%" if abs(late_s / e - 1) <= 0.10 else "NOT flat"])
    rows += [
        [f"FLOPs of the step at position {position}", f"{cached_flops.get_total_flops() / 1e9:.3g} GFLOP cached",
         f"{full_flops.get_total_flops() / cached_flops.get_total_flops():.0f}x fewer",
         f"{full_flops.get_total_flops() / 1e9:.3g} GFLOP recomputed"],
        [f"StaticKVCache step at position {profile_at}: {step_s * 1e3:.1f} ms", f"{matmul_s * 1e3:.1f} ms matrix products",
         "", f"{rest_s * 1e3:.1f} ms everything else"],
        ["best share: products at the limit, the rest as measured", f"{best_share:.0%}", "",
         f"{(bytes_per_token / bandwidth + rest_s) * 1e3:.1f} ms per token"],
        ["bfloat16 greedy tokens equal to float32's", f"{bf16_agree} of {new_tokens}", "", ""],
    ]
    print_table(["what", "value", "share of limit", ""], rows,
                title=f"greedy decoding, batch 1, {threads} thread(s) unless said, emb {emb_dim} / {n_layers} "
                      f"layers, {new_tokens} new tokens after {prompt.shape[1]}; medians of {repeats} interleaved "
                      f"repetitions; every float32 variant's tokens equal to HF's (HF {hf_ms:.1f} ms/token)")
    print_table(["matrices of one token", *[f"{dtype[6:]} {layout}" for dtype in layouts for layout in
                                            ("(out, in)", "(in, out)")]],
                [[name, *[f"{layouts[dtype][name][layout] * 1e3:.2f} ms" for dtype in layouts
                          for layout in ("(out, in)", "(in, out)")]] for name in layouts["torch.float32"]],
                title="the weight layout alone: one row times each matrix, F.linear on (out, in) against x @ W on "
                      f"(in, out); medians of {2 if args.quick else 15}")
    run.finish({
        "emb_dim": emb_dim, "n_layers": n_layers, "new_tokens": new_tokens, "repeats": repeats, "threads": threads,
        "bandwidth_bytes_per_s": bandwidths, "limit_bandwidth_bytes_per_s": bandwidth,
        "weight_bytes_per_token": weight_bytes, "cache_bytes_per_token": cache_bytes,
        "bytes_per_token": bytes_per_token, "limit_tokens_per_s": limit,
        "limit_bf16_tokens_per_s": limit_bf16, "tokens_per_s": tps,
        "share_of_limit": {name: tps[name] / (limit_bf16 if name == "course in bfloat16" else limit)
                           for name in decoders},
        "times": {name: summarize(timings.wall[name], timings.cpu[name]) for name in fns},
        "per_token_ms": {"early_window": list(early), "late_window": list(late),
                         **{name: [w * 1e3 for w in windows[name]] for name in windows}},
        "flops_at_position": position, "flops_cached": cached_flops.get_total_flops(),
        "flops_recomputed": full_flops.get_total_flops(),
        "profile_position": profile_at, "step_s": step_s, "profile_matmul_s": matmul_s, "rest_s": rest_s,
        "best_share_of_limit": best_share, "bf16_tokens_equal_to_float32": bf16_agree, "layout_seconds": layouts,
    })


if __name__ == "__main__":
    main()

"""Notebook 11's two speed questions, on the course's shipped models (float32, CPU):

1. Batched prompts: 8 prompts of different lengths padded into one batch (left_pad + attention_mask) against
   the same 8 prompts generated one at a time; every row's tokens asserted equal to its prompt alone.
2. Speculative decoding: the shipped 3.2M model as the target, notebook 09's 0.35M model as the draft, greedy,
   against plain cached decoding of the target; outputs asserted identical; acceptance rates and target passes;
   and the cost of one draft step relative to one target step (the c of the speedup formula).

Wall-clock medians of interleaved repetitions (A B A B ...), with CPU time beside them; ratios, never absolute
goals. Run with one thread on a shared machine:

    python benchmarks/decoding.py --threads 1
    python benchmarks/decoding.py --threads 1 --quick    # smoke run
"""

import time

import torch
from common import Run, fmt_s, median, paired_ratio, parse_args, print_table, summarize, time_interleaved
from course_lib.decoding import SHAKESPEARE_DRAFT_DIR, generate_tokens, left_pad, speculative_generate
from course_lib.generation import generate
from course_lib.pretrained import load_gpt2, load_shakespeare_gpt

PROMPTS = ["ROMEO:\nBut soft", "JULIET:\n", "KING HENRY VI:\nWhat", "O", "First Citizen:\nWe are",
           "HAMLET:\nTo be, or not", "MERCUTIO:\n", "LADY MACBETH:\nOut, damned"]


def step_cost(model, prefix_len: int, repeats: int) -> float:
    """Median seconds of one cached single-token forward step after prefix_len tokens."""
    caches = model.new_kv_caches()
    with torch.no_grad():
        model(torch.randint(0, 65, (1, prefix_len)), kv_caches=caches)
        keys = [(c.keys, c.values) for c in caches]
        times = []
        for _ in range(repeats):
            for cache, (k, v) in zip(caches, keys):
                cache.keys, cache.values = k, v  # back to prefix_len tokens
            start = time.perf_counter()
            model(torch.randint(0, 65, (1, 1)), kv_caches=caches, last_only=True)
            times.append(time.perf_counter() - start)
    return median(times)


def main():
    args = parse_args(__doc__)
    run = Run("decoding", args)
    new_tokens, repeats = (20, args.repeats or 2) if args.quick else (100, args.repeats or 7)
    target, tokenizer = load_shakespeare_gpt("cpu")
    draft = load_gpt2(SHAKESPEARE_DRAFT_DIR, "cpu")
    prompts = [tokenizer.encode(p) for p in PROMPTS]

    # 1. one padded batch against one prompt at a time
    token_ids, mask = left_pad(prompts, pad_id=0)
    width = token_ids.shape[1]
    batched = generate_tokens(target, token_ids, new_tokens, attention_mask=mask)
    for row, ids in enumerate(prompts):
        alone = generate(target, torch.tensor([ids]), new_tokens)
        assert torch.equal(batched[row, width - len(ids):], alone[0]), f"row {row} differs from its prompt alone"
    batch_timings = time_interleaved({
        "batch": lambda: generate_tokens(target, token_ids, new_tokens, attention_mask=mask),
        "one_by_one": lambda: [generate(target, torch.tensor([ids]), new_tokens) for ids in prompts],
    }, repeats=repeats)
    total = new_tokens * len(prompts)
    batch_speedup = median(batch_timings.wall["one_by_one"]) / median(batch_timings.wall["batch"])

    # 2. speculative decoding against plain cached greedy decoding of the target
    prompt = torch.tensor([prompts[0]])
    plain = generate(target, prompt, new_tokens)
    variants = {"plain": lambda: generate(target, prompt, new_tokens)}
    acceptance = {}
    for k in (1, 2, 4):
        result = speculative_generate(target, draft, prompt, new_tokens, num_draft=k)
        assert torch.equal(result.tokens, plain), f"speculative (k={k}) differs from the target's greedy text"
        acceptance[k] = {"accepted": result.accepted, "drafted": result.drafted, "target_calls": result.target_calls}
        variants[f"speculative_k{k}"] = lambda k=k: speculative_generate(target, draft, prompt, new_tokens, num_draft=k)
    spec_timings = time_interleaved(variants, repeats=repeats)
    spec_speedup = {name: median(spec_timings.wall["plain"]) / median(spec_timings.wall[name])
                    for name in variants if name != "plain"}
    cost = {"target": step_cost(target, 40, 50 if not args.quick else 5),
            "draft": step_cost(draft, 40, 50 if not args.quick else 5)}

    rows = [["8 prompts, one padded batch", fmt_s(median(batch_timings.wall["batch"])),
             f"{total / median(batch_timings.wall['batch']):.0f}", f"{batch_speedup:.2f}x"],
            ["8 prompts, one at a time", fmt_s(median(batch_timings.wall["one_by_one"])),
             f"{total / median(batch_timings.wall['one_by_one']):.0f}", "1.00x"],
            ["target alone, cached greedy", fmt_s(median(spec_timings.wall["plain"])),
             f"{new_tokens / median(spec_timings.wall['plain']):.0f}", "1.00x"]]
    for k in (1, 2, 4):
        a = acceptance[k]
        rows.append([f"speculative, k={k} ({a['accepted']}/{a['drafted']} accepted, {a['target_calls']} target passes)",
                     fmt_s(median(spec_timings.wall[f'speculative_k{k}'])),
                     f"{new_tokens / median(spec_timings.wall[f'speculative_k{k}']):.0f}",
                     f"{spec_speedup[f'speculative_k{k}']:.2f}x"])
    print_table(["variant", "time", "tokens/s", "speedup"], rows,
                title=f"decoding, {torch.get_num_threads()} thread(s), {new_tokens} new tokens per prompt, float32; "
                      f"medians of {repeats} interleaved runs; outputs asserted equal")
    print(f"one cached step: target {cost['target'] * 1e3:.2f} ms, draft {cost['draft'] * 1e3:.2f} ms, "
          f"c = {cost['draft'] / cost['target']:.2f}")
    run.finish({
        "new_tokens": new_tokens, "repeats": repeats, "prompts": PROMPTS,
        "batch": summarize(batch_timings.wall["batch"], batch_timings.cpu["batch"]),
        "one_by_one": summarize(batch_timings.wall["one_by_one"], batch_timings.cpu["one_by_one"]),
        "batch_speedup": batch_speedup,
        "batch_paired_ratio": paired_ratio(batch_timings.wall["one_by_one"], batch_timings.wall["batch"]),
        "plain": summarize(spec_timings.wall["plain"], spec_timings.cpu["plain"]),
        **{name: summarize(spec_timings.wall[name], spec_timings.cpu[name]) for name in spec_speedup},
        "speculative_speedup": spec_speedup, "acceptance": acceptance,
        "step_seconds": cost, "draft_over_target_step": cost["draft"] / cost["target"],
    })


if __name__ == "__main__":
    main()

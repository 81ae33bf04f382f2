"""The multi-head attention variants of notebook 05 at GPT-2 small's width and full context: forward and
forward + backward time (eval mode, dropout 0, float32, CPU) and peak tensor memory, same weights in all.

    python benchmarks/attention.py            # a few minutes on 2 cores
    python benchmarks/attention.py --quick    # smoke run
"""

import torch

from common import (Run, fmt_s, median, parse_args, peak_tensor_memory, print_table, summarize,
                    time_interleaved)
from course_lib.attention import (MultiHeadAttention, MultiHeadAttentionEinsum, MultiHeadAttentionWrapper,
                                  copy_fused_weights_to_wrapper)
from course_lib.config import GPTConfig


KERNEL = "MultiHeadAttention (SDPA kernel)"


def build_variants(d: int, context_length: int, heads: int) -> dict[str, torch.nn.Module]:
    """name -> layer; every layer computes the same function (GPT-2: qkv biases)."""
    cfg = GPTConfig(context_length=context_length, emb_dim=d, n_heads=heads, n_layers=1, drop_rate=0.0,
                    qkv_bias=True)
    kernel = MultiHeadAttention(cfg).eval()
    wrapper = MultiHeadAttentionWrapper(cfg).eval()
    copy_fused_weights_to_wrapper(kernel, wrapper)
    explicit = MultiHeadAttentionEinsum(cfg).eval()
    explicit.load_state_dict(kernel.state_dict())
    return {
        f"wrapper ({heads} CausalAttention heads)": wrapper,
        "MultiHeadAttentionEinsum (explicit formula)": explicit,
        KERNEL: kernel,
    }


def main():
    args = parse_args(__doc__)
    run = Run("attention", args)
    batch, tokens, d, heads = (2, 128, 64, 4) if args.quick else (8, 1024, 768, 12)
    repeats = args.repeats or (2 if args.quick else 3)
    torch.manual_seed(123)
    variants = build_variants(d, tokens, heads)
    x = torch.randn(batch, tokens, d)  # (batch, tokens, emb_dim)
    grad_out = torch.randn(batch, tokens, d)  # a fixed upstream gradient for the backward pass

    def forward_fn(layer):
        def fn():
            with torch.no_grad():
                return layer(x)  # (batch, tokens, emb_dim)
        return fn

    def forward_backward_fn(layer):
        def fn():
            layer.zero_grad(set_to_none=True)
            layer(x).backward(grad_out)
        return fn

    reference = forward_fn(variants[KERNEL])()
    for name, layer in variants.items():  # all variants compute the same function
        torch.testing.assert_close(forward_fn(layer)(), reference, rtol=1e-4, atol=1e-5, msg=name)

    results = {}
    for mode, make in (("forward", forward_fn), ("forward+backward", forward_backward_fn)):
        fns = {name: make(layer) for name, layer in variants.items()}
        timings = time_interleaved(fns, repeats=repeats, warmup=1)
        memory = {name: peak_tensor_memory(fn) for name, fn in fns.items()}
        for name in fns:
            results.setdefault(name, {})[mode] = {**summarize(timings.wall[name], timings.cpu[name]),
                                                  "peak_tensor_bytes": memory[name]}

    sdpa = results[KERNEL]
    rows = []
    for name, r in results.items():
        rows.append([name, fmt_s(r["forward"]["median_s"]),
                     f"{r['forward']['median_s'] / sdpa['forward']['median_s']:.2f}x",
                     f"{r['forward']['peak_tensor_bytes'] / 2**20:.0f} MiB",
                     fmt_s(r["forward+backward"]["median_s"]),
                     f"{r['forward+backward']['median_s'] / sdpa['forward+backward']['median_s']:.2f}x",
                     f"{r['forward+backward']['peak_tensor_bytes'] / 2**20:.0f} MiB"])
    print_table(["variant", "forward", "vs SDPA", "peak mem", "fwd+bwd", "vs SDPA", "peak mem"], rows,
                title=f"attention, {torch.get_num_threads()} threads, batch {batch} x {tokens} tokens x {d} dims, "
                      f"{heads} heads, float32, eval mode, "
                      f"dropout 0; medians of {repeats} interleaved repetitions after warm-up; peak mem = peak "
                      "bytes of tensors created during the call (inputs and weights excluded)")
    run.finish({"batch": batch, "tokens": tokens, "d": d, "heads": heads, "repeats": repeats,
                "memory_method": "TorchDispatchMode counting storages created and freed during one call; "
                                 "kernel-internal scratch buffers are not seen",
                "variants": results})


if __name__ == "__main__":
    main()

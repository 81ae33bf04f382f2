"""The course on one GPU against Hugging Face in the same run (issue 31): training, the pretraining command, decoding.

GPT-2 124M's shape with random weights; the course and Hugging Face get identical weights (common.build_pair).

- ceilings: copy bandwidth (a device-to-device copy of 2 GiB, bytes read + written) and the matmul peak (8192^3
  products in bfloat16 and in float32 with TF32), measured with CUDA events in this run
- correctness: float32 logits of both models on one batch (TF32 off), and the decoding tokens below
- training step, micro-batch 16 x 1024, bfloat16 autocast, forward + cross-entropy + backward + clip + AdamW: the
  levers of issue 31 one at a time on the eager step (the course before them first), the micro-batch, the
  attention kernels, then the course compiled with all levers against Hugging Face eager and compiled (the same
  optimizer, TF32, loss and loop for both)
- the pretraining command, `pretrain(RunConfig(...))` in this process, GPT-2 tokens of the shipped Shakespeare,
  131,072-token steps, compiled and eager: tokens/s, MFU by the command's own measured peak, final losses
- batch-1 greedy decoding, 200 new tokens after an 8-token prompt, float32 and bfloat16: course `generate`, HF
  `generate` (dynamic cache), HF with `cache_implementation="static"` (which compiles itself on CUDA), and the
  course's GraphedGreedyDecoder (graph of the eager step, graph of the compiled step), against the bandwidth limit

    python benchmarks/gpu.py                      # about 5 minutes on one H100 or H200; writes results/gpu.json
    python benchmarks/gpu.py --smoke --out F.json # any device, tiny sizes, nothing compiled: the code paths only
"""

import argparse
import copy
import datetime
import json
import platform
import statistics
import sys
import tempfile
import time
import traceback
from contextlib import nullcontext
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from common import RESULTS_DIR, build_pair, count_params

from course_lib.distributed import batch_to, flops_per_token, padded_gpt, real_vocab
from course_lib.generation import GraphedGreedyDecoder, generate
from course_lib.pretrain import RunConfig, pretrain
from course_lib.shards import prepare
from course_lib.tokenization import gpt2_tokenizer
from course_lib.training import TrainConfig, batch_loss, load_shakespeare, make_optimizer

ANCHORS = {"llm.c, 8 H100s, tokens/s per GPU": 470_000, "modded-nanogpt records, tokens/s per GPU": 680_000,
           "plain PyTorch step (issue 31), tokens/s": 437_000, "plain CUDA graph decoding (issue 31), tokens/s": 1_497}


class Clock:
    """Seconds between marks: CUDA events on a GPU (no host wait while timing), perf_counter elsewhere."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        if not self.cuda:
            return end - start
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------- ceilings

def ceilings(device: torch.device, smoke: bool) -> dict:
    clock = Clock(device)
    n = 2**20 if smoke else 2**29  # float32 elements: 2 GiB
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(12):
        start = clock.mark()
        dst.copy_(src)
        times.append(clock.seconds(start, clock.mark()))
    bandwidth = 2 * src.numel() * 4 / statistics.median(times[2:])
    del src, dst
    peaks = {}
    size = 256 if smoke else 8192
    for name, dtype, precision in (("bfloat16", torch.bfloat16, "highest"), ("float32_tf32", torch.float32, "high")):
        torch.set_float32_matmul_precision(precision)
        a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
        times = []
        for _ in range(12):
            start = clock.mark()
            a @ b
            times.append(clock.seconds(start, clock.mark()))
        peaks[name] = 2 * size**3 / statistics.median(times[2:])
        torch.set_float32_matmul_precision("highest")
    return {"copy_bandwidth_bytes_per_s": bandwidth, "matmul_peak_flops": peaks}


# ----------------------------------------------------------------------------- training

def one_step(model, loss_fn, optimizer, batch, device, autocast, pinned: bool) -> torch.Tensor:
    """One training step on one micro-batch: forward and loss, backward, clipping, AdamW; the loss, on the device."""
    inputs, targets = batch_to(batch, device) if pinned else tuple(t.to(device) for t in batch)
    with autocast:
        loss = loss_fn(inputs, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def train_rate(model, loss_fn, optimizer, batches, device, *, autocast, pinned, read_every_step, steps,
               warmup) -> dict:
    """Tokens/s of training steps (one micro-batch each), median over `steps` after `warmup`; the step's GPU time
    between CUDA events, so a host that waits (read_every_step) shows as idle GPU time."""
    clock = Clock(device)
    model.train()
    marks, losses = [], []
    for i in range(warmup + steps):
        if i >= warmup:
            marks.append(clock.mark())
        loss = one_step(model, loss_fn, optimizer, batches[i % len(batches)], device, autocast, pinned)
        losses.append(loss.item() if read_every_step else loss)
    marks.append(clock.mark())
    sync(device)
    seconds = [clock.seconds(a, b) for a, b in zip(marks, marks[1:])]
    tokens = batches[0][0].numel()
    return {"tokens_per_s": tokens / statistics.median(seconds), "step_ms": [s * 1e3 for s in seconds],
            "last_loss": float(losses[-1])}


def profile_step(model, loss_fn, optimizer, batch, device, autocast) -> list[dict]:
    """Where one step's time goes: the PyTorch profiler's 15 most expensive operators by self device time."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        one_step(model, loss_fn, optimizer, batch, device, autocast, pinned=True)
        sync(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:15]
    return [{"op": e.key, "calls": e.count, "self_ms": getattr(e, key) / 1e3} for e in rows]


def training_setup(cfg, device, smoke: bool):
    """The micro-batch, step counts, schedule, autocast and random batches every training variant shares."""
    micro, steps, warmup = (2, 2, 1) if smoke else (16, 6, 3)
    generator = torch.Generator().manual_seed(0)

    def batches_of(rows):
        data = torch.randint(0, cfg.vocab_size, (3, rows, cfg.context_length + 1), generator=generator)
        return [(d[:, :-1], d[:, 1:]) for d in data]

    tcfg = TrainConfig(max_lr=6e-4, min_lr=6e-5, warmup_steps=1, total_steps=10, weight_decay=0.1)
    return micro, steps, warmup, tcfg, torch.autocast(device.type, dtype=torch.bfloat16), batches_of


def course_run(cfg, device, smoke, *, fused, tf32, pinned, read, vocab_multiple, compiled=False, rows=None,
               backend=None, profiled=False):
    micro, steps, warmup, tcfg, autocast, batches_of = training_setup(cfg, device, smoke)
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.manual_seed(0)
    model = padded_gpt(cfg, vocab_multiple, device)
    loss_fn = partial(batch_loss, real_vocab(model, cfg.vocab_size))
    loss_fn = torch.compile(loss_fn) if compiled else loss_fn
    try:
        optimizer, batches = make_optimizer(model, tcfg, fused=fused), batches_of(rows or micro)
        with sdpa_kernel(backend) if backend is not None else nullcontext():
            result = train_rate(model, loss_fn, optimizer, batches, device, autocast=autocast, pinned=pinned,
                                read_every_step=read, steps=steps, warmup=warmup + (2 if compiled else 0))
            if profiled:
                result["profile"] = profile_step(model, loss_fn, optimizer, batches[0], device, autocast)
        return result
    finally:
        torch.set_float32_matmul_precision("highest")


ALL_LEVERS = dict(fused=True, tf32=True, pinned=True, read=False, vocab_multiple=128)


def training_levers(cfg, device, smoke: bool, report) -> dict:
    """Issue 31's levers one at a time on the eager step (cumulative), the micro-batch, the attention kernels."""
    levers = {}
    settings = dict(fused=False, tf32=False, pinned=False, read=True, vocab_multiple=1)
    cumulative = [("the course before issue 31 (eager)", {}), ("+ no host read per step", {"read": False}),
                  ("+ fused AdamW", {"fused": True}), ("+ TF32 for float32 products", {"tf32": True}),
                  ("+ pinned memory, non_blocking copies", {"pinned": True}),
                  ("+ vocabulary padded to a multiple of 128", {"vocab_multiple": 128})]
    for name, change in cumulative:
        settings.update(change)
        levers[name] = report(f"train lever: {name}", lambda: course_run(cfg, device, smoke, **settings,
                                                                         profiled=settings == ALL_LEVERS))
    assert settings == ALL_LEVERS
    for rows in ((4,) if smoke else (32, 64)):
        levers[f"micro-batch {rows} (all levers, eager)"] = report(
            f"train micro-batch {rows}", lambda: course_run(cfg, device, smoke, **ALL_LEVERS, rows=rows))
    attention = {}
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "memory-efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    for name, backend in backends.items():
        if smoke and name != "math":
            continue
        attention[name] = report(f"train attention {name}",
                                 lambda: course_run(cfg, device, smoke, **ALL_LEVERS, backend=backend))
    return {"levers": levers, "attention": attention}


def training_peers(cfg, device, smoke: bool, report) -> dict:
    """The course compiled with all levers against Hugging Face eager and compiled: the same loss (the model's
    logits into batch_loss), fused AdamW, TF32, pinned batches and no host reads for both."""
    micro, steps, warmup, tcfg, autocast, batches_of = training_setup(cfg, device, smoke)
    peers = {}
    if not smoke:
        peers["course compiled (all levers)"] = report(
            "train course compiled", lambda: course_run(cfg, device, smoke, **ALL_LEVERS, compiled=True, profiled=True))
    course, hf = build_pair(cfg.emb_dim, cfg.n_layers, cfg.n_heads, cfg.context_length, cfg.vocab_size)
    del course

    def hf_run(compiled, rows=micro):
        torch.set_float32_matmul_precision("high")
        model = copy.deepcopy(hf).to(device)
        loss_fn = partial(batch_loss, lambda ids: model(input_ids=ids, use_cache=False).logits)
        loss_fn = torch.compile(loss_fn) if compiled else loss_fn
        optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.99), weight_decay=0.1,
                                      fused=device.type == "cuda")
        try:
            return train_rate(model, loss_fn, optimizer, batches_of(rows), device, autocast=autocast, pinned=True,
                              read_every_step=False, steps=steps, warmup=warmup + (2 if compiled else 0))
        finally:
            torch.set_float32_matmul_precision("highest")

    peers["Hugging Face eager"] = report("train HF eager", lambda: hf_run(False))
    if not smoke:
        peers["Hugging Face compiled"] = report("train HF compiled", lambda: hf_run(True))
        peers["course compiled (all levers), micro-batch 64"] = report(
            "train course compiled 64", lambda: course_run(cfg, device, smoke, **ALL_LEVERS, compiled=True, rows=64))
        peers["Hugging Face compiled, micro-batch 64"] = report("train HF compiled 64", lambda: hf_run(True, 64))
    return {"micro_batch": micro, "context": cfg.context_length, "peers": peers}


def pretraining_command(device, smoke: bool, report) -> dict:
    """`pretrain` as `python -m course_lib.pretrain train ...` runs it, compiled and eager, on the same data."""
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        prepare(data, [load_shakespeare()], gpt2_tokenizer(), val_tokens=30_000 if smoke else 140_000)
        if smoke:
            runs = {"eager": dict(preset="shakespeare-char", batch_tokens=256, micro_batch=2, compile=False)}
        else:
            common = dict(preset="gpt2-124m", batch_tokens=131_072, dtype="bfloat16", vocab_multiple=128)
            runs = {"compiled, micro-batch 64": dict(common, micro_batch=64, compile=True),
                    "eager, micro-batch 64": dict(common, micro_batch=64, compile=False)}
        steps, log_every = (4, 2) if smoke else (16, 2)
        for name, settings in runs.items():
            def run_command(settings=settings, name=name):
                started = time.perf_counter()
                run = RunConfig(str(data), str(Path(tmp) / name.replace(" ", "_").replace(",", "")),
                                total_steps=steps, log_every=log_every, checkpoint_every=10**6, device=str(device),
                                **settings)
                history = pretrain(run, progress=False)
                skip = 2 * log_every if steps > 2 * log_every else 0  # the first two intervals: compilation
                return {"settings": settings, "steps": steps, "tokens_per_s": statistics.median(
                        history["tokens_per_s"][skip:]), "mfu": statistics.median(history["mfu"][skip:]), "final_loss": history["loss"][-1],
                        "val_loss": history["val_loss"][-1], "wall_s": time.perf_counter() - started}
            results[name] = report(f"pretrain {name}", run_command)
    return results


# ----------------------------------------------------------------------------- decoding

def decoding(course, hf, device, smoke: bool, bandwidth: float, report) -> dict:
    from common import hf_greedy
    new, repeats = (8, 2) if smoke else (200, 3)
    clock = Clock(device)
    prompt = torch.randint(0, course.cfg.vocab_size, (1, 8), generator=torch.Generator().manual_seed(1)).to(device)

    def rate(fn):
        fn()  # warm-up: compilation, graph capture, allocations
        fn()
        times = []
        for _ in range(repeats):
            start = clock.mark()
            out = fn()
            times.append(clock.seconds(start, clock.mark()))
        return {"tokens_per_s": new / statistics.median(times), "tokens": out[0].tolist()}

    results = {}
    for dtype_name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        model = copy.deepcopy(course).to(dtype).eval()
        peer = copy.deepcopy(hf).to(dtype).eval()
        limit = bandwidth / (count_params(model) * model.out_head.weight.element_size())
        variants = {
            "course generate (eager)": lambda: generate(model, prompt, new),
            "Hugging Face generate (eager)": hf_greedy(peer, prompt, new),
        }
        if not smoke and device.type == "cuda":
            static = copy.deepcopy(hf).to(dtype).eval()
            variants["Hugging Face static cache (compiled)"] = partial(
                lambda p: static.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=new, do_sample=False,
                                          eos_token_id=None, pad_token_id=None, cache_implementation="static"),
                prompt)
        graphed = GraphedGreedyDecoder(model, capacity=8 + new)
        variants["course GraphedGreedyDecoder (eager step)"] = lambda: graphed.generate(prompt, new)
        if not smoke:
            fused = GraphedGreedyDecoder(model, capacity=8 + new, compile=True)
            variants["course GraphedGreedyDecoder (compiled step)"] = lambda: fused.generate(prompt, new)
        if not smoke and dtype == torch.bfloat16:
            tuned = GraphedGreedyDecoder(model, capacity=8 + new, compile="max-autotune-no-cudagraphs")
            variants["course GraphedGreedyDecoder (step compiled, max-autotune)"] = lambda: tuned.generate(prompt, new)
        rows = {name: report(f"decode {dtype_name} {name}", lambda fn=fn: rate(fn)) for name, fn in variants.items()}
        reference = rows["course generate (eager)"].get("tokens")
        for row in rows.values():
            if "tokens" in row and reference is not None:
                same = [a == b for a, b in zip(row["tokens"], reference)]
                row["tokens_equal_to_course_eager"] = all(same)
                row["first_difference"] = None if all(same) else same.index(False)
                row["share_of_limit"] = row["tokens_per_s"] / limit
        results[dtype_name] = {"limit_tokens_per_s": limit, "variants": rows}
        del model, peer
    return results


# ----------------------------------------------------------------------------- the run

def device_info(device: torch.device) -> dict:
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "date": datetime.date.today().isoformat()}
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    multiprocessors=props.multi_processor_count)
    else:
        info["gpu"] = None
    return info


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on any device, nothing compiled")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "gpu.json", help="where the JSON goes")
    parser.add_argument("--skip", action="append", default=[], choices=["training", "command", "decoding"])
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.smoke:
        sys.exit("benchmarks/gpu.py measures a CUDA GPU and found none (torch.cuda.is_available() is False): run it "
                 "on a machine with an NVIDIA GPU and a CUDA build of PyTorch, or pass --smoke to check the code paths")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    started = time.perf_counter()
    payload = {"benchmark": "gpu", "command": "python benchmarks/gpu.py " + " ".join(sys.argv[1:] if argv is None
                                                                                    else argv),
               "smoke": args.smoke, "device": device_info(device), "anchors": ANCHORS, "errors": {}}

    def save():
        payload["wall_s"] = round(time.perf_counter() - started, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(payload, indent=1) + "\n")

    def report(name, fn):
        t0 = time.perf_counter()
        try:
            result = fn()
        except Exception as error:  # one broken variant must not cost the others: record it, go on
            payload["errors"][name] = "".join(traceback.format_exception_only(error)).strip()[-2000:]
            print(f"[{time.perf_counter() - started:6.1f} s] {name}: FAILED {payload['errors'][name]}", flush=True)
            traceback.print_exc()
            return {"error": payload["errors"][name]}
        shown = {k: (f"{v:,.4g}" if isinstance(v, float) else v) for k, v in result.items()
                 if k in ("tokens_per_s", "mfu", "final_loss", "share_of_limit", "last_loss")}
        print(f"[{time.perf_counter() - started:6.1f} s] {name} ({time.perf_counter() - t0:.1f} s): {shown}", flush=True)
        sync(device)
        torch._dynamo.reset()  # compiled code and its guards of this variant are not needed again
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return result

    from course_lib.config import GPT2_CONFIGS, GPTConfig
    cfg = (GPTConfig(vocab_size=50257, context_length=64, emb_dim=32, n_heads=2, n_layers=2, drop_rate=0.0)
           if args.smoke else replace(GPT2_CONFIGS["gpt2"], drop_rate=0.0))
    payload["ceilings"] = report("ceilings", lambda: ceilings(device, args.smoke))
    save()
    course, hf = build_pair(cfg.emb_dim, cfg.n_layers, cfg.n_heads, cfg.context_length, cfg.vocab_size)
    course, hf = course.to(device), hf.to(device)

    def correctness():
        ids = torch.randint(0, cfg.vocab_size, (2, 64), generator=torch.Generator().manual_seed(2)).to(device)
        with torch.no_grad():
            return {"max_abs_logit_difference_float32": (course(ids) - hf(input_ids=ids).logits).abs().max().item()}
    payload["correctness"] = report("correctness", correctness)
    n_params = count_params(course)
    payload["model"] = {"params": n_params, "flops_per_token": flops_per_token(cfg, n_params)}
    save()
    if "decoding" not in args.skip:
        bandwidth = payload["ceilings"].get("copy_bandwidth_bytes_per_s", float("nan"))
        payload["decoding"] = decoding(course, hf, device, args.smoke, bandwidth, report)
        save()
    del course, hf
    if "command" not in args.skip:
        payload["pretraining_command"] = pretraining_command(device, args.smoke, report)
        save()
    if "training" not in args.skip:
        payload["training"] = training_levers(cfg, device, args.smoke, report)
        save()
        payload["training"].update(training_peers(cfg, device, args.smoke, report))
        save()
    summary(payload)
    return payload


def summary(payload: dict) -> None:
    """The short table the reply shows: the figures the issue's targets are about."""
    print(f"\n{payload['device'].get('gpu')} | torch {payload['device']['torch']} | CUDA {payload['device']['cuda']} "
          f"| wall {payload['wall_s']} s | errors: {len(payload['errors'])}")
    peak = payload.get("ceilings", {}).get("matmul_peak_flops", {}).get("bfloat16")
    flops = payload["model"]["flops_per_token"]
    for section in ("levers", "attention", "peers"):
        for name, row in payload.get("training", {}).get(section, {}).items():
            if "tokens_per_s" in row:
                print(f"train  {name:55s} {row['tokens_per_s']:>11,.0f} tok/s  MFU {row['tokens_per_s'] * flops / peak:.1%}"
                      if peak else f"train  {name:55s} {row['tokens_per_s']:>11,.0f} tok/s")
    for name, row in payload.get("pretraining_command", {}).items():
        if "tokens_per_s" in row:
            print(f"cmd    {name:55s} {row['tokens_per_s']:>11,.0f} tok/s  MFU {row['mfu']:.1%}  loss "
                  f"{row['final_loss']:.4f}")
    for dtype, block in payload.get("decoding", {}).items():
        for name, row in block["variants"].items():
            if "tokens_per_s" in row:
                print(f"decode {dtype:8s} {name:46s} {row['tokens_per_s']:>9,.0f} tok/s  "
                      f"{row.get('share_of_limit', float('nan')):.1%} of {block['limit_tokens_per_s']:,.0f}  "
                      f"same tokens: {row.get('tokens_equal_to_course_eager')}")


if __name__ == "__main__":
    main()

"""Shared helpers of the benchmarks: timing (warm-up, interleaved A B A B repetitions, medians), the
course/Hugging Face model pair with identical weights, a training step, a peak-memory probe, table
printing, JSON results and the machine description. Every script in benchmarks/ imports from here."""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- command line and machine

def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None):
    """The common command line: --quick (a smoke run in seconds) and --repeats (timed repetitions)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few repetitions: a smoke run")
    parser.add_argument("--repeats", type=int, default=None, help="timed repetitions per variant")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads for both peers (default 1, the course's thread policy: on a "
                             "machine shared with other jobs, more keep OpenMP workers waiting for busy cores at "
                             "every operation; docs/performance.md, Thread policy)")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    return args


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> list[str]:
    """The SIMD extensions that matter for float32 matmuls (avx2, fma, avx512f, amx...), from /proc/cpuinfo."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return sorted(f for f in flags if f in {"avx", "avx2", "fma", "avx512f", "avx512_bf16",
                                                        "avx512_vnni", "amx_tile", "amx_bf16"})
    except OSError:
        pass
    return []


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info() -> dict:
    """What a reader needs to compare these numbers with their own."""
    info = {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "logical_cores": os.cpu_count(),
        "cores_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "mkl": torch.backends.mkl.is_available(),
        "python": platform.python_version(),
        "os": platform.platform(),
    }
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    return info


def describe_machine(info: dict) -> str:
    return (f"{info['cpu']} ({info['cores_available']} cores, {', '.join(info['cpu_flags'])}), "
            f"torch {info['torch']} with {info['torch_threads']} threads, transformers {info['transformers']}, "
            f"Python {info['python']}")


class Run:
    """One benchmark run: prints the machine and the load at the start, and `finish` writes
    benchmarks/results/<name>.json with the command, the machine, the load at start and end, and the results."""

    def __init__(self, name: str, args):
        self.name, self.args = name, args
        self.started = time.time()
        self.machine = machine_info()
        self.load_start = load_average()
        print(f"{name}: {describe_machine(self.machine)}")
        print(f"load average at start (1, 5, 15 min): {self.load_start}"
              + ("   [--quick: smoke run, numbers not meaningful]" if args.quick else ""))

    def finish(self, results: dict) -> Path:
        load_end = load_average()
        payload = {
            "benchmark": self.name,
            "command": " ".join(["python", os.path.relpath(Path(sys.argv[0]).resolve(), REPO_ROOT),
                                 *sys.argv[1:]]),
            "quick": bool(self.args.quick),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)),
            "wall_s": round(time.time() - self.started, 1),
            "load_average_start": self.load_start,
            "load_average_end": load_end,
            "machine": self.machine,
            "results": results,
        }
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"{self.name}{'_quick' if self.args.quick else ''}.json"
        path.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"load average at end: {load_end}; wall {payload['wall_s']} s; wrote {path.relative_to(REPO_ROOT)}")
        return path


# ----------------------------------------------------------------------------- timing

def median(values: list[float]) -> float:
    return statistics.median(values)


@dataclass
class Timings:
    """Seconds of every timed call, per variant name: `wall` (the clock on the wall) and `cpu` (CPU time this
    process used, all its threads together). With one thread, cpu counts only the work done, so it hardly
    moves when other jobs share the cores; with several threads it also counts OpenMP workers spinning."""
    wall: dict[str, list[float]]
    cpu: dict[str, list[float]]


def time_interleaved(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> Timings:
    """Run every function `warmup` times, then `repeats` rounds of A B C A B C ...; return the wall and CPU
    seconds of each timed call per name. Interleaving spreads a change of machine load over all variants
    alike, so ratios of medians stay meaningful on a busy machine."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    timings = Timings(wall={name: [] for name in fns}, cpu={name: [] for name in fns})
    for _ in range(repeats):
        for name, fn in fns.items():
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            timings.wall[name].append(time.perf_counter() - wall)
            timings.cpu[name].append(time.process_time() - cpu)
    return timings


def paired_ratio(numerator: list[float], denominator: list[float]) -> float:
    """Median of the per-round ratios a_i / b_i of two interleaved series (robust to slow load drift)."""
    return median([a / b for a, b in zip(numerator, denominator)])


def summarize(times: list[float], cpu: list[float] | None = None) -> dict:
    """Median, min, max and every value of a list of wall-clock seconds (and of the CPU seconds, if given)."""
    summary = {"median_s": median(times), "min_s": min(times), "max_s": max(times), "times_s": times}
    if cpu is not None:
        summary.update({"cpu_median_s": median(cpu), "cpu_times_s": cpu})
    return summary


def fmt_s(seconds: float) -> str:
    """A duration with a unit that keeps 3 significant digits readable."""
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def print_table(headers: list[str], rows: list[list], title: str | None = None) -> None:
    """A plain-text table, columns as wide as their widest cell; numbers right-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    numeric = [all(c[i][:1].isdigit() for c in cells if c[i]) for i in range(len(headers))]

    def line(values):
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric))

    if title:
        print(f"\n{title}")
    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print(line(row))


# ----------------------------------------------------------------------------- the two models

def hf_config(emb_dim: int, n_layers: int, n_heads: int, context_length: int, vocab_size: int = 50257):
    """A GPT-2 config for transformers with every dropout at 0 (so a training step is deterministic and
    both models compute the same function) and the GPT-2 defaults otherwise: tied head, tanh GELU."""
    from transformers import GPT2Config
    return GPT2Config(vocab_size=vocab_size, n_positions=context_length, n_embd=emb_dim, n_layer=n_layers,
                      n_head=n_heads, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)


def build_pair(emb_dim: int, n_layers: int, n_heads: int, context_length: int, vocab_size: int = 50257,
               seed: int = 123, attn_implementation: str = "sdpa"):
    """(course GPTModel, transformers GPT2LMHeadModel) with identical float32 weights on the CPU: the HF
    model is initialised at random, saved with save_pretrained and read back with course_lib's load_gpt2.
    Both come back in eval mode; the course model has drop_rate 0.0 (from resid_pdrop 0)."""
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    from course_lib.pretrained import load_gpt2

    hf_logging.disable_progress_bar()

    torch.manual_seed(seed)
    config = hf_config(emb_dim, n_layers, n_heads, context_length, vocab_size)
    hf = GPT2LMHeadModel._from_config(config, attn_implementation=attn_implementation, dtype=torch.float32)
    hf.eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        course = load_gpt2(tmp, device="cpu")
    course.eval()
    assert course.cfg.drop_rate == 0.0
    assert course.out_head.weight is course.embedding.tok_emb.weight, "the course model should be tied like HF"
    assert hf.lm_head.weight is hf.transformer.wte.weight
    return course, hf


def hf_greedy(hf, prompt: torch.Tensor, new_tokens: int) -> Callable[[], torch.Tensor]:
    """A function running Hugging Face's greedy generate with its KV cache, exactly new_tokens tokens (no eos
    stop, like the course's generate without eos_id): (1, prompt tokens) -> (1, prompt tokens + new_tokens)."""
    from transformers import GenerationConfig
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, use_cache=True, eos_token_id=None,
                              pad_token_id=None)

    def run():
        with torch.no_grad():
            return hf.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config)
    return run


def count_params(model: torch.nn.Module) -> int:
    """Distinct parameters (a tied matrix counts once)."""
    return sum(p.numel() for p in model.parameters())


def course_logits(model, ids):
    return model(ids)


def hf_logits(model, ids):
    return model(input_ids=ids, use_cache=False).logits


def make_train_step(model: torch.nn.Module, logits_fn, ids: torch.Tensor, targets: torch.Tensor,
                    lr: float = 3e-4, weight_decay: float = 0.1) -> Callable[[], float]:
    """A closure doing one training step: zero grads, forward, cross-entropy on all positions, backward,
    AdamW step (PyTorch's default implementation for the device). Returns the loss as a float."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        logits = logits_fn(model, ids)  # (batch, tokens, vocab_size)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def random_batch(batch: int, tokens: int, vocab_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (batch, tokens) and next-token targets, drawn at random (the cost does not depend on them)."""
    generator = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab_size, (batch, tokens + 1), generator=generator)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


# ----------------------------------------------------------------------------- memory

class _LiveTensorBytes(TorchDispatchMode):
    """Counts the bytes of every tensor storage an op creates and frees, to find the peak of live memory."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.seen: set[int] = set()

    def _release(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self.seen.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self.seen:
                    self.seen.add(key)
                    nbytes = storage.nbytes()
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._release, key, nbytes)
        return out


def peak_tensor_memory(fn: Callable[[], object]) -> int:
    """Peak bytes held by tensors that `fn` creates while it runs (forward activations, saved tensors,
    gradients, outputs), counted at the dispatcher; tensors alive before the call are not counted, and
    scratch buffers a fused kernel allocates internally are not seen. Slow: do not time it."""
    mode = _LiveTensorBytes()
    with mode:
        result = fn()
    del result
    return mode.peak

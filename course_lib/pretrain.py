"""Not a lesson: notebook 13's pretraining command, which assembles the lesson's pieces (course_lib/distributed.py
and course_lib/shards.py) into a run: the presets, a run's settings and their checks, the device and backend of a
rank, the model, optimizer and loaders of a run, the matmul peak and MFU, the loop with its logging, evaluation and
checkpoints, and the command line.

    python -m course_lib.pretrain prepare DATA_DIR [--tokenizer gpt2|char] [--text FILE] [--text FILE2] ...
                                                             # no --text: the shipped Shakespeare
    python -m course_lib.pretrain train DATA_DIR OUT_DIR [--preset ...]              # one process
    torchrun --standalone --nproc_per_node=2 -m course_lib.pretrain train DATA_DIR OUT_DIR ...   # two
"""

import argparse
import json
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from .config import GPT2_CONFIGS, GPTConfig
from .distributed import (accumulation_steps, batch_to, data_parallel, environment, flops_per_token, load_run,
                          padded_gpt, process_group, real_vocab, save_run, train_step)
from .guards import as_device, require_bool, require_int, require_type
from .model import GPTModel
from .shards import ShardLoader, prepare
from .tokenization import CharTokenizer, gpt2_tokenizer
from .training import TrainConfig, batch_loss, load_shakespeare, lr_at, make_optimizer

PRESETS = {  # name -> (model, schedule): notebook 09's character model, and GPT-2 124M as llm.c trains it
    "shakespeare-char": (GPTConfig(vocab_size=65, context_length=64, emb_dim=96, n_heads=4, n_layers=3, drop_rate=0.0,
                                   qkv_bias=False, tie_weights=False),
                         TrainConfig(total_steps=1100, max_lr=6e-3, min_lr=6e-4, warmup_steps=50, eval_every=100)),
    "gpt2-124m": (replace(GPT2_CONFIGS["gpt2"], drop_rate=0.0),
                  TrainConfig(total_steps=19073, max_lr=6e-4, min_lr=6e-5, warmup_steps=700, eval_every=250,
                              eval_batches=20)),
}


@dataclass(frozen=True)
class RunConfig:
    "One pretraining run: the data, the batch in tokens, the precision and where checkpoints go."
    data_dir: str
    out_dir: str
    preset: str = "shakespeare-char"
    batch_tokens: int = 1024  # tokens per optimizer step, over all ranks and micro-batches
    micro_batch: int = 16  # rows per forward pass on one rank
    total_steps: int | None = None  # None: the preset's
    dtype: str = "float32"  # (TF32 products on CUDA) or "bfloat16": autocast, float32 master weights
    compile: bool = False
    checkpoint_every: int = 100
    log_every: int = 10  # steps between two reads of the loss by the host (each read waits for the GPU)
    vocab_multiple: int = 1  # the model's vocabulary rounded up to a multiple of this (128: GPU-friendly shapes)
    seed: int = 0
    device: str | None = None  # None: this rank's GPU if there is one, else the CPU
    backend: str | None = None  # None: nccl on CUDA, gloo on the CPU

    def __post_init__(self):
        """A known preset, dtype and backend, counts of at least one, directory paths, and a device name torch knows
        (a clear error now, not at the start of the run)."""
        known = {"preset": sorted(PRESETS), "dtype": ["float32", "bfloat16"], "backend": [None, "gloo", "nccl"]}
        for name, choices in known.items():
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} {getattr(self, name)!r} is unknown: choose one of {choices}")
        for name in ("batch_tokens", "micro_batch", "checkpoint_every", "log_every", "vocab_multiple"):
            require_int(name, getattr(self, name), minimum=1)
        if self.total_steps is not None:
            require_int("total_steps", self.total_steps, minimum=1)
        require_bool("compile", self.compile)
        require_int("seed", self.seed)
        for name in ("data_dir", "out_dir"):
            if not isinstance(getattr(self, name), (str, os.PathLike)):
                raise TypeError(f"{name} must be a directory path (str or Path), got {getattr(self, name)!r}")
        if self.device is not None:
            require_type("device", self.device, str, "name it, e.g. 'cpu', 'cuda' or 'cuda:1'")
            as_device(self.device)


def pick_device_and_backend(run: RunConfig, local_rank: int) -> tuple[torch.device, str]:
    """The device this rank trains on (run.device, else this rank's GPU by local_rank if there is one, else the CPU)
    and the process-group backend that fits it (NCCL moves GPU tensors only), or a clear error: CUDA named on a
    machine without it (it would fail later, deep in the first step), NCCL on the CPU, or bfloat16 on a GPU that
    predates Ampere. A GPU index the machine does not have needs no check: CUDA refuses it as an invalid ordinal."""
    require_type("run", run, RunConfig, "build it with RunConfig(data_dir, out_dir, ...)")
    require_int("local_rank", local_rank, minimum=0)
    cuda = torch.cuda.is_available()
    device = as_device(run.device or ("cuda" if cuda else "cpu"))
    if device.type == "cuda" and not cuda:
        raise ValueError(f"device {run.device!r}: this machine has no CUDA (torch.cuda.is_available() is False); "
                         "use device='cpu', or leave device unset to train on the CPU")
    if device.type == "cuda":
        device = torch.device("cuda", local_rank if device.index is None else device.index)  # one GPU per rank
    backend = run.backend or ("nccl" if device.type == "cuda" else "gloo")
    if backend == "nccl" and device.type != "cuda":
        raise ValueError(f"backend 'nccl' needs CUDA GPUs; this rank runs on {device}: use backend 'gloo' "
                         "(or leave backend unset) on the CPU")
    if run.dtype == "bfloat16" and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] < 8:
        raise ValueError(f"dtype 'bfloat16': {torch.cuda.get_device_name(device)} predates NVIDIA's Ampere "
                         "generation and would only emulate it; train with dtype 'float32'")
    return device, backend


def matmul_peak(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, size: int = 2048,
                repeats: int = 5) -> float:
    """FLOP/s of the fastest of `repeats` square matmuls of this size: the peak that MFU is measured against. On a
    GPU it synchronises before and after each product: CUDA runs them asynchronously."""
    for name, value in (("size", size), ("repeats", repeats)):
        require_int(name, value, minimum=1)  # size 0 would time nothing, repeats 0 would leave no timing
    device = as_device(device)
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype such as torch.bfloat16, got {dtype!r}")
    a, b = torch.randn(size, size, device=device, dtype=dtype), torch.randn(size, size, device=device, dtype=dtype)
    times = []
    for _ in range(repeats + 1):  # the first is a warmup
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return 2 * size**3 / min(times[1:])


def job_peak(device: torch.device, dtype: str, world_size: int) -> float:
    "FLOP/s of the whole job: the sum of every rank's matmul_peak, measured at the same time."
    peak = torch.tensor(matmul_peak(device, torch.bfloat16 if dtype == "bfloat16" else torch.float32,
                                    size=8192 if device.type == "cuda" else 2048), device=device)
    if world_size > 1:
        dist.all_reduce(peak)
    return peak.item()


def pretrain(run: RunConfig, progress: bool = True) -> dict:
    """Train the preset's GPTModel on run.data_dir's shards, on one process or as one rank of a torchrun job;
    resume from run.out_dir/checkpoint.pt if it exists. Returns the history (on every rank)."""
    require_type("run", run, RunConfig, "build it with RunConfig(data_dir, out_dir, ...)")
    require_bool("progress", progress)
    rank, world_size, local_rank = environment()
    device, backend = pick_device_and_backend(run, local_rank)
    precision = torch.get_float32_matmul_precision()
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # float32 products on the tensor cores, in TF32
    try:
        with process_group(backend, world_size, device):
            return _train(run, rank, world_size, device, progress and rank == 0)
    finally:
        torch.set_float32_matmul_precision(precision)


def shard_loaders(data_dir: Path, meta: dict, context_length: int, run: RunConfig, rank: int, world_size: int) -> dict:
    "split -> its ShardLoader for this rank, steps of run.batch_tokens tokens over all ranks."
    rows = run.batch_tokens // context_length  # windows per optimizer step, all ranks together
    fixes = {"train": "a smaller val_tokens or more text", "val": "a larger val_tokens"}
    loaders = {}
    for split, fix in fixes.items():
        try:
            loaders[split] = ShardLoader([data_dir / name for name in meta["shards"][split]], context_length,
                                         run.micro_batch, rank, world_size, run.seed, rows_per_step=rows)
        except ValueError as error:
            raise ValueError(f"{split} shards of {data_dir}: {error} (prepare with {fix})") from error
    return loaders


def build_run(run: RunConfig, rank: int, world_size: int, device: torch.device) -> tuple:
    """(model, optimizer, schedule, micro-batches per step and rank, loaders, the data's vocabulary size) of a run; a
    missing meta.json: FileNotFoundError. The same seed gives every rank the same initial weights; on a GPU AdamW is
    fused (one kernel for all parameters), on the CPU it stays the one the shipped models were trained with."""
    data_dir = Path(run.data_dir)
    try:  # a missing file: FileNotFoundError names it
        meta = json.loads((data_dir / "meta.json").read_text(encoding="utf-8"))
        [meta["shards"][split] for split in ("train", "val")], int(meta["vocab_size"])
    except (ValueError, KeyError, TypeError) as error:  # not JSON, not UTF-8, a key missing
        raise ValueError(f"{data_dir / 'meta.json'} is not the meta.json prepare writes (JSON with vocab_size and "
                         f"shards/train, shards/val): {error!r}; prepare the data again") from error
    cfg, tcfg = PRESETS[run.preset]
    vocab = meta["vocab_size"]
    total_steps = run.total_steps or tcfg.total_steps  # a short run keeps its warmup inside it
    tcfg = replace(tcfg, total_steps=total_steps, warmup_steps=min(tcfg.warmup_steps, total_steps - 1))
    accumulate = accumulation_steps(run.batch_tokens, world_size, run.micro_batch, cfg.context_length)
    torch.manual_seed(run.seed)  # the same initial weights on every rank (DDP also copies rank 0's)
    model = padded_gpt(replace(cfg, vocab_size=vocab), run.vocab_multiple, device)
    optimizer = make_optimizer(model, tcfg, fused=device.type == "cuda")  # the CPU keeps the shipped runs' AdamW
    loaders = shard_loaders(data_dir, meta, cfg.context_length, run, rank, world_size)
    return model, optimizer, tcfg, accumulate, loaders, vocab


@torch.no_grad()
def evaluate_shards(model: GPTModel, loader: ShardLoader, steps: int, world_size: int, autocast, device,
                    vocab_size: int | None = None) -> float:
    """Mean loss on the first `steps` global batches of validation windows (fewer if the split is shorter), all ranks;
    vocab_size: the data's; pass it for a model with a padded vocabulary (None: all the model's logits count). The
    same windows at every call and for any world size, on the unwrapped model (no gradients: nothing for DDP)."""
    require_int("steps", steps, minimum=1)  # 0 batches have no mean loss
    model.eval()
    saved = loader.state_dict()
    loader.epoch, loader.position = 0, 0  # the same windows at every evaluation, whatever the world size
    batches = min(steps, loader.steps_per_epoch) * loader.accumulate
    forward = model if vocab_size is None else real_vocab(model, vocab_size)
    total = torch.zeros((), device=device)
    for _ in range(batches):
        inputs, targets = batch_to(loader.next_batch(), device)  # (micro_batch, context_length) each
        with autocast:
            total += batch_loss(forward, inputs, targets).float()
    loader.load_state_dict(saved)
    if world_size > 1:
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
    model.train()
    return total.item() / batches


def log_steps(history: dict, bar, pending: list, batch_tokens: int, started: float, mfu_per_token_s: float) -> None:
    """Read the losses of the steps in pending, (step, lr, loss tensor) each, in one go, then time the interval
    since `started`; record every step with the interval's throughput and MFU, and show the last on the bar. The
    read is where the host waits for the GPU: a clock read before it would stop when the work was merely queued."""
    losses = torch.stack([loss for _, _, loss in pending]).tolist()  # the host's one wait for the GPU
    tokens_per_s = batch_tokens * len(pending) / (time.perf_counter() - started)  # after the wait: all work counted
    mfu = tokens_per_s * mfu_per_token_s
    for (step, lr, _), loss in zip(pending, losses):
        for key, value in zip(("step", "loss", "lr", "tokens_per_s", "mfu"), (step + 1, loss, lr, tokens_per_s, mfu)):
            history[key].append(value)
    bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{tokens_per_s:.0f}", mfu=f"{mfu:.0%}", refresh=False)


def _train(run: RunConfig, rank: int, world_size: int, device: torch.device, progress: bool) -> dict:
    model, optimizer, tcfg, accumulate, loaders, vocab = build_run(run, rank, world_size, device)
    checkpoint = Path(run.out_dir) / "checkpoint.pt"
    step, history = 0, {key: [] for key in ("step", "loss", "lr", "tokens_per_s", "mfu", "eval_step", "val_loss")}
    if checkpoint.exists():
        step, history = load_run(checkpoint, model, optimizer, run, world_size, loaders["train"], device)
    ddp = data_parallel(model, device, world_size)
    loss_fn = partial(batch_loss, real_vocab(ddp, vocab))  # forward and loss compiled together (DDP's hooks split it)
    loss_fn = torch.compile(loss_fn) if run.compile else loss_fn
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if run.dtype == "bfloat16" else nullcontext()
    flops = flops_per_token(model.cfg, sum(p.numel() for p in model.parameters()))
    mfu_per_token_s = flops / job_peak(device, run.dtype, world_size)  # MFU = tokens/s x this
    if rank == 0:
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(range(step, tcfg.total_steps), desc=f"pretraining on {world_size} process(es)", disable=not progress,
               mininterval=1.0)
    model.train()
    pending, started = [], time.perf_counter()  # steps whose loss the host has not read yet
    for step in bar:
        lr = lr_at(step, tcfg)
        pending.append((step, lr, train_step(loss_fn, ddp, optimizer, loaders["train"], accumulate, autocast, lr,
                                             tcfg.grad_clip, device)))
        last = step + 1 == tcfg.total_steps
        evaluate, save = (step + 1) % tcfg.eval_every == 0 or last, (step + 1) % run.checkpoint_every == 0 or last
        if (step + 1) % run.log_every == 0 or evaluate or save:
            log_steps(history, bar, pending, run.batch_tokens, started, mfu_per_token_s)  # waits for the GPU
            if evaluate:
                history["eval_step"].append(step + 1)
                history["val_loss"].append(evaluate_shards(model, loaders["val"], tcfg.eval_batches, world_size,
                                                           autocast, device, vocab))
            if save and rank == 0:
                save_run(checkpoint, model, optimizer, run, world_size, step + 1, loaders["train"], history)
            if save and world_size > 1:
                dist.barrier()  # no rank runs ahead of a checkpoint it may have to resume from
            pending, started = [], time.perf_counter()
    bar.close()
    return history


def main(argv: list[str] | None = None) -> None:
    "python -m course_lib.pretrain prepare|train ...; under torchrun, every rank runs train."
    parser = argparse.ArgumentParser(prog="python -m course_lib.pretrain")
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="tokenize a corpus into shards (default: the shipped Shakespeare)")
    prep.add_argument("out_dir")
    prep.add_argument("--tokenizer", choices=("gpt2", "char"), default="gpt2")
    prep.add_argument("--val-tokens", type=int, default=30_000)
    prep.add_argument("--shard-tokens", type=int, default=100_000_000)
    prep.add_argument("--text", action="append", default=[], metavar="FILE",
                      help="a UTF-8 text file, one document; repeat for several")
    train = commands.add_parser("train", help="pretrain a preset on prepared shards")
    train.add_argument("data_dir")
    train.add_argument("out_dir")
    train.add_argument("--preset", choices=sorted(PRESETS), default="shakespeare-char")
    train.add_argument("--batch-tokens", type=int, default=1024, help="tokens per optimizer step, all ranks")
    train.add_argument("--micro-batch", type=int, default=16, help="rows per forward pass on one rank")
    train.add_argument("--total-steps", type=int, default=None, help="default: the preset's")
    train.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    train.add_argument("--compile", action="store_true", help="torch.compile the model")
    train.add_argument("--checkpoint-every", type=int, default=100)
    train.add_argument("--log-every", type=int, default=10, help="steps between two reads of the loss")
    train.add_argument("--vocab-multiple", type=int, default=1, help="round the vocabulary up (128 on a GPU)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--device", default=None, help="default: this rank's GPU if any, else cpu")
    train.add_argument("--backend", choices=("gloo", "nccl"), default=None, help="default: nccl on CUDA, else gloo")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        texts = [Path(f).read_text(encoding="utf-8") for f in args.text] or [load_shakespeare()]
        tokenizer = gpt2_tokenizer() if args.tokenizer == "gpt2" else CharTokenizer(sorted(set("".join(texts))))
        meta = prepare(args.out_dir, texts, tokenizer, args.val_tokens, args.shard_tokens)
        print(f"{meta['tokens']['train']:,} training and {meta['tokens']['val']:,} validation tokens in {args.out_dir}")
    else:
        run = RunConfig(**{name: value for name, value in vars(args).items() if name != "command"})
        history = pretrain(run)
        if environment()[0] == 0:
            print(f"step {history['step'][-1]}: loss {history['loss'][-1]:.3f}, validation {history['val_loss'][-1]:.3f}")


if __name__ == "__main__":
    main()

"""Not a lesson: the doors of notebook 13 (course_lib/distributed.py): the FLOPs' and the matmul peak's arguments,
a RunConfig's fields, the environment torchrun sets, the device and backend a rank can have, the batch arithmetic,
a checkpoint to resume from, and the counts of the pretraining helpers. The shards and the loader have their own
door, course_lib/doors/shards.py."""

import os

import torch

from ..config import GPTConfig
from ..guards import as_device, require_bool, require_int, require_lesson_type, require_type


def flops_per_token(cfg, n_params) -> None:
    require_type("cfg", cfg, GPTConfig, "pass the model's config, model.cfg")
    require_int("n_params", n_params, minimum=1)


def matmul_peak(device, dtype, size, repeats) -> torch.device:
    """Counts of at least one (size 0 would time nothing, repeats 0 would leave no timing), a floating-point dtype;
    returns the device as a torch.device."""
    for name, value in (("size", size), ("repeats", repeats)):
        require_int(name, value, minimum=1)
    device = as_device(device)
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype such as torch.bfloat16, got {dtype!r}")
    return device


def run_config(run) -> None:
    """RunConfig's __post_init__: a known preset, dtype and backend, counts of at least one, directory paths, and a
    device name torch knows (a clear error now, not at the start of the run)."""
    from ..distributed import PRESETS  # this lesson's own presets: imported when called, so no import cycle
    known = {"preset": sorted(PRESETS), "dtype": ["float32", "bfloat16"], "backend": [None, "gloo", "nccl"]}
    for name, choices in known.items():
        if getattr(run, name) not in choices:
            raise ValueError(f"{name} {getattr(run, name)!r} is unknown: choose one of {choices}")
    for name in ("batch_tokens", "micro_batch", "checkpoint_every", "log_every", "vocab_multiple"):
        require_int(name, getattr(run, name), minimum=1)
    if run.total_steps is not None:
        require_int("total_steps", run.total_steps, minimum=1)
    require_bool("compile", run.compile)
    require_int("seed", run.seed)
    for name in ("data_dir", "out_dir"):
        if not isinstance(getattr(run, name), (str, os.PathLike)):
            raise TypeError(f"{name} must be a directory path (str or Path), got {getattr(run, name)!r}")
    if run.device is not None:
        require_type("device", run.device, str, "name it, e.g. 'cpu', 'cuda' or 'cuda:1'")
        as_device(run.device)


def environment(values: dict[str, str]) -> None:
    """RANK, WORLD_SIZE and LOCAL_RANK as torchrun sets them: whole numbers, at least one process, a rank among
    them."""
    for name, value in values.items():
        if not value.isdigit():
            raise ValueError(f"environment variable {name}={value!r} is not a whole number: torchrun sets it; "
                             "unset it to train in one process")
    rank, world_size = int(values["RANK"]), int(values["WORLD_SIZE"])
    if not 0 <= rank < world_size:
        raise ValueError(f"environment variables RANK={rank} and WORLD_SIZE={world_size}: a rank is one of "
                         "0 .. WORLD_SIZE - 1; torchrun sets both, unset them to train in one process")


def pick_device_and_backend(run, local_rank) -> None:
    """A RunConfig whose device this machine has (device='cuda' on a machine without CUDA would fail later, deep in
    the first step), a backend that fits the device (NCCL moves GPU tensors only), and bfloat16 only on a GPU that
    computes in it (Ampere or later). The device is this rank's as the lesson picks it: run.device, else this
    rank's GPU if there is one, else the CPU."""
    from ..distributed import RunConfig  # this lesson's own class: imported when called, so no import cycle
    require_lesson_type("run", run, RunConfig, "build it with RunConfig(data_dir, out_dir, ...)")
    require_int("local_rank", local_rank, minimum=0)
    cuda = torch.cuda.is_available()
    device = as_device(run.device or ("cuda" if cuda else "cpu"))
    if device.type == "cuda" and not cuda:
        raise ValueError(f"device {run.device!r}: this machine has no CUDA (torch.cuda.is_available() is False); "
                         "use device='cpu', or leave device unset to train on the CPU")
    if device.type == "cuda":
        device = torch.device("cuda", local_rank if device.index is None else device.index)
    backend = run.backend or ("nccl" if device.type == "cuda" else "gloo")
    if backend == "nccl" and device.type != "cuda":
        raise ValueError(f"backend 'nccl' needs CUDA GPUs; this rank runs on {device}: use backend 'gloo' "
                         "(or leave backend unset) on the CPU")
    if run.dtype == "bfloat16" and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] < 8:
        raise ValueError(f"dtype 'bfloat16': {torch.cuda.get_device_name(device)} predates NVIDIA's Ampere "
                         "generation and would only emulate it; train with dtype 'float32'")


def accumulation_steps(batch_tokens, world_size, micro_batch, context_length) -> None:
    """Counts of at least one, and a batch that all ranks' micro-batches fill exactly (rounding it silently would
    change the batch the learning rate was chosen for); the error suggests a batch that does."""
    for name, value in (("batch_tokens", batch_tokens), ("world_size", world_size), ("micro_batch", micro_batch),
                        ("context_length", context_length)):
        require_int(name, value, minimum=1)
    per_pass = world_size * micro_batch * context_length
    if batch_tokens % per_pass:
        raise ValueError(f"batch_tokens {batch_tokens} is not a multiple of world_size x micro_batch x context_length"
                         f" = {world_size} x {micro_batch} x {context_length} = {per_pass}: use batch_tokens "
                         f"{max(per_pass, batch_tokens // per_pass * per_pass)} or change micro_batch")


def load_run(path, model, run, world_size: int, device) -> dict:
    """The checkpoint at path, read onto device: a readable file, a pretraining checkpoint, and one of this run
    (the same settings, number of processes and model), or one error that names every difference. Returns it."""
    from dataclasses import asdict

    from ..distributed import RUN_CHECKPOINT_FORMAT  # this lesson's own format: no import cycle
    try:
        payload = torch.load(path, map_location=device, weights_only=True)
    except Exception as error:  # a truncated zip, a pickle error, another file type
        raise ValueError(f"{path} cannot be read ({str(error).split('. ')[0]}): it is truncated or not a checkpoint; "
                         "delete it to start afresh, or restore a copy") from error
    if not isinstance(payload, dict) or payload.get("format") != RUN_CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a pretraining checkpoint ({RUN_CHECKPOINT_FORMAT!r}): start a new out_dir")
    saved = payload["run"]
    differ = [f"{name} {saved[name]!r} (now {getattr(run, name)!r})" for name in
              ("preset", "batch_tokens", "micro_batch", "total_steps", "seed", "dtype", "vocab_multiple")
              if saved[name] != getattr(run, name)]
    if payload["world_size"] != world_size:
        differ.append(f"world_size {payload['world_size']} (now {world_size})")
    if payload["model_config"] != asdict(model.cfg):
        differ.append(f"model config {payload['model_config']} (now {asdict(model.cfg)})")
    if differ:
        raise ValueError(f"{path} belongs to another run: {'; '.join(differ)}. Resume with the same settings "
                         "and number of processes, or give a new out_dir to start afresh")
    return payload


def pretrain(run, progress) -> None:
    from ..distributed import RunConfig  # this lesson's own class: no import cycle
    require_lesson_type("run", run, RunConfig, "build it with RunConfig(data_dir, out_dir, ...)")
    require_bool("progress", progress)


def padded_gpt(vocab_multiple, device) -> None:
    require_int("vocab_multiple", vocab_multiple, minimum=1)
    as_device(device)


def real_vocab(vocab_size) -> None:
    require_int("vocab_size", vocab_size, minimum=1)


def evaluate_shards(steps) -> None:
    require_int("steps", steps, minimum=1)  # 0 batches have no mean loss



"""Not a lesson: the doors of notebook 13 (course_lib/distributed.py): the FLOPs' arguments, the environment torchrun
sets, the batch arithmetic, a checkpoint to resume from, and the padded vocabulary's counts. The shards and the loader
have their own door, course_lib/doors/shards.py; the pretraining command (course_lib/pretrain.py, not a lesson)
checks its own settings."""

from dataclasses import asdict

from ..config import GPTConfig
from ..guards import as_device, require_int, require_type
from .training import readable


def flops_per_token(cfg, n_params) -> None:
    require_type("cfg", cfg, GPTConfig, "pass the model's config, model.cfg")
    require_int("n_params", n_params, minimum=1)


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


def load_run(path, payload, model, run, world_size: int) -> dict:
    """What load_payload read from path: a readable file, a pretraining checkpoint, and one of this run (the same
    settings, number of processes and model), or one error that names every difference. Returns it."""
    from ..distributed import RUN_CHECKPOINT_FORMAT  # this lesson's own format: no import cycle
    readable(str(path), payload, "it is truncated or not a checkpoint; delete it to start afresh, or restore a copy")
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


def padded_gpt(vocab_multiple, device) -> None:
    require_int("vocab_multiple", vocab_multiple, minimum=1)
    as_device(device)


def real_vocab(vocab_size) -> None:
    require_int("vocab_size", vocab_size, minimum=1)


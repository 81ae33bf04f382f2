"""Issue 30: every public door of course_lib.distributed and course_lib.shards, and the checks of the pretraining
command (course_lib.pretrain), called the way a user who has not read the code might. One table of cases: ("error",
type, fragment of our message naming the argument) or ("result", check). `python tests/test_doors_distributed.py`
prints the counts of clear errors, correct results, unclear errors and silent wrong answers."""

import dataclasses
import math
import tempfile
from contextlib import nullcontext
from pathlib import Path

import torch

from course_lib.config import GPTConfig
from course_lib.distributed import (
    accumulation_steps, environment, flops_per_token, load_run, padded_gpt, real_vocab, save_run,
)
from course_lib.model import GPTModel
from course_lib.pretrain import PRESETS, RunConfig, evaluate_shards, matmul_peak, pick_device_and_backend, pretrain
from course_lib.shards import (
    HEADER_BYTES, ShardLoader, prepare, rank_windows, read_header, read_shard, write_shard,
)
from course_lib.tokenization import CharTokenizer
from course_lib.training import make_optimizer

from doors import door_tests, report

TEXT = "to be or not to be, that is the question. " * 40
TOK = CharTokenizer.from_text(TEXT)


def tmp():
    return Path(tempfile.mkdtemp())


def shard(ids=torch.arange(100) % 10, vocab_size=10):
    return write_shard(tmp() / "s.bin", ids, vocab_size)


def damaged_shard():
    "A shard whose header says vocab_size 10 but that holds id 500."
    path = shard()
    raw = bytearray(path.read_bytes())
    raw[HEADER_BYTES:HEADER_BYTES + 2] = (500).to_bytes(2, "little")
    path.write_bytes(bytes(raw))
    return path


def data_dir():
    out = tmp()
    prepare(out, [TEXT], TOK, val_tokens=600)
    return out


def run(**settings):
    return RunConfig(**{"data_dir": str(data_dir()), "out_dir": str(tmp()), "batch_tokens": 128, "micro_batch": 2,
                        "total_steps": 2, **settings})


def pretrain_with(checkpoint: bytes | None = None, meta: str | None = None, **settings):
    r = run(**settings)
    if checkpoint is not None:
        Path(r.out_dir, "checkpoint.pt").write_bytes(checkpoint)
    if meta is not None:
        Path(r.data_dir, "meta.json").write_text(meta)
    return pretrain(r, progress=False)


def loader(**settings):
    d = data_dir()
    return ShardLoader([d / "train_000000.bin"], **{"context_length": 8, "micro_batch": 2, **settings})


def run_state():
    "(path of a saved run, its model, optimizer, run and loader)."
    r = run()
    cfg = PRESETS["shakespeare-char"][0]
    model = GPTModel(GPTConfig(**{**cfg.__dict__, "vocab_size": TOK.vocab_size}))
    optimizer = make_optimizer(model, PRESETS["shakespeare-char"][1])
    ld = ShardLoader([Path(r.data_dir) / "train_000000.bin"], 64, 2, rows_per_step=2)
    path = Path(r.out_dir) / "checkpoint.pt"
    return path, model, optimizer, r, ld


def saved_run(**history):
    path, model, optimizer, r, ld = run_state()
    save_run(path, model, optimizer, r, 1, 1, ld, history.get("history", {"loss": [1.0]}))
    return path, model, optimizer, r, ld


def load_saved():
    path, model, optimizer, r, ld = saved_run()
    return load_run(path, model, optimizer, r, 1, ld, torch.device("cpu"))


def load_damaged(data: bytes):
    path, model, optimizer, r, ld = run_state()
    path.write_bytes(data)
    return load_run(path, model, optimizer, r, 1, ld, torch.device("cpu"))


def save_run_str_path():
    path, model, optimizer, r, ld = run_state()
    save_run(str(path), model, optimizer, r, 1, 1, ld, {"loss": [1.0]})
    return path.exists()


def eval_shards(steps):
    ld = loader(context_length=8, micro_batch=2)
    torch.manual_seed(0)
    model = GPTModel(GPTConfig(vocab_size=TOK.vocab_size, context_length=8, emb_dim=16, n_heads=2, n_layers=1))
    return evaluate_shards(model, ld, steps, 1, nullcontext(), torch.device("cpu"))


def env(monkeypatch_values):
    import os
    old = {k: os.environ.get(k) for k in monkeypatch_values}
    os.environ.update(monkeypatch_values)
    try:
        return environment()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


def load_other_run(**changes):
    "A checkpoint saved by run_state's run, loaded by a run with these changes."
    path, model, optimizer, r, ld = saved_run()
    return load_run(path, model, optimizer, dataclasses.replace(r, **changes), 1, ld, torch.device("cpu"))


def pick_on_this_machine(device):
    """pick_device_and_backend with device named: on a machine without CUDA a clear error (checked here, on the
    CPU-only test machine); with CUDA, this rank's GPU and NCCL."""
    return pick_device_and_backend(RunConfig("d", "o", device=device), 0)


def prepare_refused_writes_nothing(documents):
    out = tmp() / "data"
    try:
        prepare(out, documents, TOK, 600)
    except TypeError:
        return not out.exists()
    return False


def load_state_with(**changes):
    ld = loader()
    ld.load_state_dict(ld.state_dict() | changes)
    return ld.epoch, ld.position


CPU = RunConfig("d", "o", device="cpu")
PICK_CUDA = [  # device="cuda" named: refused on a machine without CUDA (the CPU-only test machine), taken on a GPU
    ("pick cuda, machine without CUDA", lambda: pick_on_this_machine("cuda"), "error", ValueError,
     "device 'cuda': this machine has no CUDA"),
    ("pick cuda:1, machine without CUDA", lambda: pick_on_this_machine("cuda:1"), "error", ValueError,
     "use device='cpu', or leave device unset"),
] if not torch.cuda.is_available() else [
    ("pick cuda", lambda: pick_on_this_machine("cuda"), "result", lambda r: r == (torch.device("cuda", 0), "nccl")),
]
SMALL = GPTConfig(vocab_size=10, context_length=8, emb_dim=16, n_heads=2, n_layers=1)

CASES = [
    # flops_per_token / matmul_peak
    ("flops ok", lambda: flops_per_token(SMALL, 1000), "result", lambda r: r == 6000 + 12 * 1 * 8 * 16),
    ("flops params -1", lambda: flops_per_token(SMALL, -1), "error", ValueError, "n_params"),
    ("flops params float", lambda: flops_per_token(SMALL, 1e6), "error", TypeError, "n_params"),
    ("flops cfg dict", lambda: flops_per_token({"n_layers": 1}, 10), "error", TypeError, "cfg"),
    ("peak ok", lambda: matmul_peak("cpu", size=8, repeats=1), "result", lambda r: r > 0),
    ("peak size 0", lambda: matmul_peak("cpu", size=0), "error", ValueError, "size"),
    ("peak dtype int", lambda: matmul_peak("cpu", torch.int64, size=8, repeats=1), "error", TypeError, "dtype"),
    ("peak dtype str", lambda: matmul_peak("cpu", "bfloat16", size=8, repeats=1), "error", TypeError, "dtype"),
    ("peak device bad", lambda: matmul_peak("gpu", size=8), "error", ValueError, "device"),
    # RunConfig
    ("run ok", lambda: RunConfig("d", "o", compile=True).compile, "result", lambda r: r is True),
    ("run compile 'no'", lambda: RunConfig("d", "o", compile="no"), "error", TypeError, "compile"),
    ("run compile 1", lambda: RunConfig("d", "o", compile=1), "error", TypeError, "compile"),
    ("run seed float", lambda: RunConfig("d", "o", seed=1.5), "error", TypeError, "seed"),
    ("run seed -1", lambda: RunConfig("d", "o", seed=-1).seed, "result", lambda r: r == -1),  # torch takes it
    ("run data_dir None", lambda: RunConfig(None, "o"), "error", TypeError, "data_dir"),
    ("run out_dir int", lambda: RunConfig("d", 3), "error", TypeError, "out_dir"),
    ("run data_dir Path", lambda: RunConfig(Path("d"), "o").data_dir, "result", lambda r: str(r) == "d"),
    ("run device bad", lambda: RunConfig("d", "o", device="gpu"), "error", ValueError, "device"),
    ("run device int", lambda: RunConfig("d", "o", device=0), "error", TypeError, "device"),
    ("run dtype fp16", lambda: RunConfig("d", "o", dtype="float16"), "error", ValueError, "dtype"),
    ("run preset", lambda: RunConfig("d", "o", preset="gpt3"), "error", ValueError, "preset"),
    ("run batch 0", lambda: RunConfig("d", "o", batch_tokens=0), "error", ValueError, "batch_tokens"),
    ("run steps 0", lambda: RunConfig("d", "o", total_steps=0), "error", ValueError, "total_steps"),
    ("run micro 2.0", lambda: RunConfig("d", "o", micro_batch=2.0), "error", TypeError, "micro_batch"),
    ("run backend", lambda: RunConfig("d", "o", backend="mpi"), "error", ValueError, "backend"),
    # environment / pick_device_and_backend
    ("env default", lambda: env({}), "result", lambda r: len(r) == 3),
    ("env bad rank", lambda: env({"RANK": "x"}), "error", ValueError, "RANK"),
    ("pick cpu", lambda: pick_device_and_backend(CPU, 0), "result", lambda r: (r[0].type, r[1]) == ("cpu", "gloo")),
    ("pick nccl cpu", lambda: pick_device_and_backend(RunConfig("d", "o", device="cpu", backend="nccl"), 0),
     "error", ValueError, "nccl"),
    ("pick run dict", lambda: pick_device_and_backend({"device": "cpu"}, 0), "error", TypeError, "run"),
    *PICK_CUDA,
    ("pick local_rank -1", lambda: pick_device_and_backend(CPU, -1), "error", ValueError, "local_rank"),
    ("pick local_rank str", lambda: pick_device_and_backend(CPU, "0"), "error", TypeError, "local_rank"),
    ("env rank 2 of 2", lambda: env({"RANK": "2", "WORLD_SIZE": "2"}), "error", ValueError, "RANK=2 and WORLD_SIZE=2"),
    ("env world 0", lambda: env({"WORLD_SIZE": "0"}), "error", ValueError, "WORLD_SIZE=0"),
    ("env rank 1 of 2", lambda: env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}), "result",
     lambda r: r == (1, 2, 1)),
    ("run replace keeps checks", lambda: dataclasses.replace(CPU, micro_batch=0), "error", ValueError, "micro_batch"),
    ("peak repeats 0", lambda: matmul_peak("cpu", size=8, repeats=0), "error", ValueError, "repeats"),
    ("padded_gpt multiple 0", lambda: padded_gpt(SMALL, 0), "error", ValueError, "vocab_multiple"),
    ("padded_gpt device bad", lambda: padded_gpt(SMALL, 8, "gpu"), "error", ValueError, "device"),
    ("padded_gpt ok", lambda: padded_gpt(SMALL, 8), "result",
     lambda m: m.out_head.weight.shape[0] == 16 and bool((m.out_head.weight[10:] == 0).all())),
    ("real_vocab 0", lambda: real_vocab(GPTModel(SMALL), 0), "error", ValueError, "vocab_size"),
    # accumulation_steps
    ("accum ok", lambda: accumulation_steps(1024, 2, 4, 64), "result", lambda r: r == 2),
    ("accum 0 tokens", lambda: accumulation_steps(0, 1, 4, 64), "error", ValueError, "batch_tokens"),
    ("accum world 0", lambda: accumulation_steps(1024, 0, 4, 64), "error", ValueError, "world_size"),
    ("accum neg", lambda: accumulation_steps(-256, 1, 4, 64), "error", ValueError, "batch_tokens"),
    ("accum float", lambda: accumulation_steps(1024.0, 1, 4, 64), "error", TypeError, "batch_tokens"),
    ("accum not multiple", lambda: accumulation_steps(1000, 1, 4, 64), "error", ValueError, "not a multiple"),
    # save_run / load_run
    ("save/load ok", load_saved, "result", lambda r: r == (1, {"loss": [1.0]})),
    ("save_run str path", save_run_str_path, "result", lambda r: r is True),
    ("load_run truncated", lambda: load_damaged(saved_run()[0].read_bytes()[:500]), "error", ValueError,
     "truncated"),
    ("load_run json", lambda: load_damaged(b"{}"), "error", ValueError, "checkpoint"),
    ("load_run other fmt", lambda: load_damaged(torch_bytes({"format": "x"})), "error", ValueError,
     "not a pretraining checkpoint"),
    ("load_run list", lambda: load_damaged(torch_bytes([1, 2])), "error", ValueError, "not a pretraining checkpoint"),
    ("load_run other micro_batch", lambda: load_other_run(micro_batch=4), "error", ValueError,
     "belongs to another run: micro_batch 2 (now 4)"),
    # pretrain
    ("pretrain truncated ckpt", lambda: pretrain_with(checkpoint=b"PK\x03\x04" + b"\0" * 100), "error", ValueError,
     "checkpoint.pt"),
    ("pretrain meta not json", lambda: pretrain_with(meta="{oops"), "error", ValueError, "meta.json"),
    ("pretrain meta no shards", lambda: pretrain_with(meta='{"vocab_size": 30}'), "error", ValueError, "meta.json"),
    ("pretrain meta list", lambda: pretrain_with(meta="[]"), "error", ValueError, "meta.json"),
    ("pretrain no data", lambda: pretrain(RunConfig(str(tmp() / "none"), str(tmp())), progress=False), "error",
     FileNotFoundError, "meta.json"),
    ("pretrain run dict", lambda: pretrain({"data_dir": "d"}), "error", TypeError, "run"),
    ("pretrain progress str", lambda: pretrain(CPU, progress="no"), "error", TypeError, "progress"),
    # evaluate_shards
    ("eval shards ok", lambda: eval_shards(1), "result", lambda r: math.isfinite(r)),
    ("eval shards 0", lambda: eval_shards(0), "error", ValueError, "steps"),
    # write_shard / read_header / read_shard
    ("shard round trip", lambda: read_shard(shard()).tolist(), "result",
     lambda r: r == (torch.arange(100) % 10).tolist()),
    ("shard list", lambda: write_shard(tmp() / "s.bin", [1, 2, 3], 10), "error", TypeError, "token_ids"),
    ("shard float ids", lambda: write_shard(tmp() / "s.bin", torch.ones(3), 10), "error", ValueError, "token_ids"),
    ("shard 2-D", lambda: write_shard(tmp() / "s.bin", torch.ones(2, 2, dtype=torch.long), 10), "error", ValueError,
     "token_ids"),
    ("shard id >= vocab", lambda: write_shard(tmp() / "s.bin", torch.tensor([10]), 10), "error", ValueError,
     "token_ids"),
    ("shard negative", lambda: write_shard(tmp() / "s.bin", torch.tensor([-1]), 10), "error", ValueError,
     "token_ids"),
    ("shard vocab float", lambda: write_shard(tmp() / "s.bin", torch.tensor([1]), 10.0), "error", TypeError,
     "vocab_size"),
    ("shard vocab 70000", lambda: write_shard(tmp() / "s.bin", torch.tensor([1]), 70000), "error", ValueError,
     "vocab_size"),
    ("shard bool ids", lambda: write_shard(tmp() / "s.bin", torch.tensor([True]), 10), "error", ValueError,
     "token_ids"),
    ("header truncated", lambda: read_header(truncate(shard(), 70)), "error", ValueError, "not a whole"),
    ("header empty file", lambda: read_header(truncate(shard(), 0)), "error", ValueError, "not a whole"),
    ("header missing", lambda: read_header(tmp() / "none.bin"), "error", FileNotFoundError, "none.bin"),
    ("read damaged ids", lambda: read_shard(damaged_shard()), "error", ValueError, "vocab_size"),
    ("read vocab 0", lambda: read_shard(patch(shard(), 24, 0)), "error", ValueError, "vocab_size"),
    ("header vocab 0", lambda: read_header(patch(shard(), 24, 0)), "error", ValueError,
     "s.bin: its header's vocab_size is 0"),
    ("header vocab 70000", lambda: read_header(patch(shard(), 24, 70000)), "error", ValueError,
     "its header's vocab_size is 70000"),
    ("header vocab 65536", lambda: read_header(patch(shard(), 24, 65536)).vocab_size, "result", lambda r: r == 65536),
    # prepare
    ("prepare ok", lambda: prepare(tmp(), [TEXT], TOK, 600)["tokens"], "result",
     lambda r: r == {"val": 600, "train": len(TEXT) - 600}),
    ("prepare str docs", lambda: prepare(tmp(), TEXT, TOK, 600), "error", TypeError, "documents"),
    ("prepare docs None", lambda: prepare(tmp(), None, TOK, 600), "error", TypeError, "documents"),
    ("prepare doc int", lambda: prepare(tmp(), [TEXT, 3], TOK, 600), "error", TypeError, "documents"),
    ("prepare val 0", lambda: prepare(tmp(), [TEXT], TOK, 0), "error", ValueError, "val_tokens"),
    ("prepare tok str", lambda: prepare(tmp(), [TEXT], "gpt2", 600), "error", TypeError, "tokenizer"),
    ("prepare unknown char", lambda: prepare(tmp(), [TEXT + "Z"], TOK, 600), "error", ValueError, "vocabulary"),
    ("prepare doc int writes nothing", lambda: prepare_refused_writes_nothing([TEXT, 3]), "result",
     lambda r: r is True),
    ("prepare generator", lambda: prepare(tmp(), (t for t in [TEXT]), TOK, 600)["tokens"], "result",
     lambda r: r == {"val": 600, "train": len(TEXT) - 600}),
    ("prepare generator doc int", lambda: prepare(tmp(), (t for t in [TEXT, 3]), TOK, 600), "error", TypeError,
     "documents' item"),
    ("prepare bytes", lambda: prepare(tmp(), TEXT.encode(), TOK, 600), "error", TypeError, "documents' item"),
    ("prepare shard_tokens 0", lambda: prepare(tmp(), [TEXT], TOK, 600, 0), "error", ValueError, "shard_tokens"),
    # ShardLoader / rank_windows / LoaderPosition
    ("loader ok", lambda: [t.shape for t in loader().next_batch()], "result", lambda r: r == [(2, 8), (2, 8)]),
    ("loader one path str", lambda: ShardLoader(str(data_dir() / "train_000000.bin"), 8, 2), "error", TypeError,
     "paths"),
    ("loader no paths", lambda: ShardLoader([], 8, 2), "error", ValueError, "windows"),
    ("loader seed float", lambda: loader(seed=0.5), "error", TypeError, "seed"),
    ("loader rank 2", lambda: loader(rank=2, world_size=2), "error", ValueError, "rank"),
    ("loader ctx 0", lambda: loader(context_length=0), "error", ValueError, "context_length"),
    ("loader damaged", lambda: ShardLoader([damaged_shard()], 8, 2), "error", ValueError, "vocab_size"),
    ("loader state missing", lambda: loader().load_state_dict({"seed": 0}), "error", ValueError, "loader state"),
    ("loader state list", lambda: loader().load_state_dict([]), "error", TypeError, "state"),
    ("window past end", lambda: loader().window_tokens(10_000), "error", ValueError, "window"),
    ("window -1", lambda: loader().window_tokens(-1), "error", ValueError, "window"),
    ("epoch -1", lambda: loader().epoch_windows(-1), "error", ValueError, "epoch"),
    ("loader rows not multiple", lambda: loader(rows_per_step=3), "error", ValueError, "rows_per_step 3"),
    ("loader too few windows", lambda: loader(rows_per_step=1000), "error", ValueError, "fewer than one step's 1000"),
    ("loader state position str", lambda: load_state_with(position="0"), "error", ValueError, "position"),
    ("loader state epoch -1", lambda: load_state_with(epoch=-1), "error", ValueError, "epoch"),
    ("loader state round trip", lambda: load_state_with(epoch=2, position=1), "result", lambda r: r == (2, 1)),
    ("window float", lambda: loader().window_tokens(1.0), "error", TypeError, "window"),
    ("window True", lambda: loader().window_tokens(True), "error", TypeError, "window"),
    ("rank_windows list", lambda: rank_windows(list(range(8)), 2, 2, 2, 0), "error", TypeError, "order"),
    ("rank_windows accumulate 0", lambda: rank_windows(torch.arange(8), 0, 2, 2, 0), "error", ValueError,
     "accumulate"),
    ("rank_windows ok", lambda: rank_windows(torch.arange(8), 2, 2, 2, 1).tolist(), "result",
     lambda r: r == [2, 3, 6, 7]),
    ("rank_windows rank 2", lambda: rank_windows(torch.arange(8), 2, 2, 2, 2), "error", ValueError, "rank"),
    ("rank_windows uneven", lambda: rank_windows(torch.arange(7), 2, 2, 2, 0), "error", ValueError, "order"),
]


def torch_bytes(obj) -> bytes:
    path = tmp() / "x.pt"
    torch.save(obj, path)
    return path.read_bytes()


def truncate(path, size):
    path.write_bytes(path.read_bytes()[:size])
    return path


def patch(path, offset, value):
    raw = bytearray(path.read_bytes())
    raw[offset:offset + 4] = value.to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    return path


test_door = door_tests(CASES)


if __name__ == "__main__":  # the counts of issue 30's closing note
    report(CASES)

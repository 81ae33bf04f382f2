"""Notebook 13's course_lib.distributed: token shards, prepare, the sharded loader, run settings and checkpoints,
and real runs of `python -m course_lib.pretrain` on one and two CPU processes (DDP over gloo)."""

import json
import os
import signal
import struct
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from course_lib.distributed import RUN_CHECKPOINT_FORMAT, accumulation_steps, flops_per_token, load_run, save_run
from course_lib.model import GPTModel
from course_lib.pretrain import (PRESETS, RunConfig, evaluate_shards, main, matmul_peak, pick_device_and_backend,
                                 pretrain)
from course_lib.shards import (HEADER_BYTES, SHARD_MAGIC, ShardHeader, ShardLoader, prepare, read_header, read_shard,
                               write_shard)
from course_lib.tokenization import EOS_ID
from course_lib.tokenization import CharTokenizer, gpt2_tokenizer
from course_lib.training import load_shakespeare, make_optimizer

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # one thread per process: 2 ranks, 2 cores


@pytest.fixture(scope="module")
def char_data(tmp_path_factory):
    "The first 12,000 characters of Shakespeare as char shards: 2,000 validation and 10,000 training tokens."
    text = load_shakespeare()[:12_000]
    tokenizer = CharTokenizer.from_text(text)
    data_dir = tmp_path_factory.mktemp("char_data")
    meta = prepare(data_dir, [text], tokenizer, val_tokens=2_000)
    return data_dir, text, tokenizer, meta


def shard_tokens(data_dir, meta) -> list[int]:
    "Every token of the val shards, then of the train shards, in order."
    names = meta["shards"]["val"] + meta["shards"]["train"]
    return torch.cat([read_shard(data_dir / name).long() for name in names]).tolist()


def train_command(data_dir, out_dir, *options, processes=1) -> list[str]:
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    return [*launcher, "-m", "course_lib.pretrain", "train", str(data_dir), str(out_dir), *map(str, options)]


def start(command, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kwargs)


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    stdout, stderr = process.communicate(timeout=300)
    return process.returncode, stdout, stderr


def finish_ok(process: subprocess.Popen) -> str:
    returncode, stdout, stderr = finish(process)
    assert returncode == 0, f"{process.args} failed:\n{stderr[-4000:]}"
    return stdout


def load_checkpoint(out_dir) -> dict:
    return torch.load(Path(out_dir) / "checkpoint.pt", weights_only=True)


# Shards

def test_shard_round_trip(tmp_path):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50_257, (1_000,), generator=generator)
    path = write_shard(tmp_path / "a.bin", ids, 50_257)
    assert path == tmp_path / "a.bin"
    assert read_header(path) == ShardHeader(version=1, bytes_per_token=2, vocab_size=50_257, n_tokens=1_000)
    tokens = read_shard(path)
    assert tokens.dtype == torch.uint16 and tokens.shape == (1_000,)
    assert torch.equal(tokens.long(), ids)
    raw = path.read_bytes()  # the documented layout, byte for byte
    assert len(raw) == HEADER_BYTES + 2 * 1_000
    assert struct.unpack_from("<16sIIIQ", raw) == (SHARD_MAGIC, 1, 2, 50_257, 1_000)
    assert raw[36:HEADER_BYTES] == bytes(HEADER_BYTES - 36)
    assert list(struct.unpack_from("<1000H", raw, HEADER_BYTES)) == ids.tolist()
    top = torch.tensor([0, 32_767, 32_768, 65_535], dtype=torch.int32)  # the whole uint16 range survives
    assert read_shard(write_shard(tmp_path / "top.bin", top, 65_536)).long().tolist() == [0, 32_767, 32_768, 65_535]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "top.bin"]  # no .partial left behind


def test_empty_shard(tmp_path):
    path = write_shard(tmp_path / "empty.bin", torch.empty(0, dtype=torch.long), 65)
    assert path.stat().st_size == HEADER_BYTES
    assert read_header(path) == ShardHeader(1, 2, 65, 0)
    tokens = read_shard(path)
    assert tokens.dtype == torch.uint16 and tokens.shape == (0,)


@pytest.mark.parametrize("ids, vocab_size, error, message", [
    (torch.arange(3), 65_537, ValueError, r"token_ids must be 1-D integer ids in \[0, vocab_size=65537\), vocab_size "
                                          r"<= 65536 \(uint16\); got shape \(3,\), torch.int64, ids in \[0, 2\]"),
    (torch.tensor([0, 10, 3]), 10, ValueError, r"in \[0, vocab_size=10\), .*; got shape \(3,\), torch.int64, ids in \[0, 10\]"),
    (torch.tensor([2, -1, 3]), 10, ValueError, r"in \[0, vocab_size=10\), .*, ids in \[-1, 3\]"),
    (torch.zeros(2, 3, dtype=torch.long), 10, ValueError, r"token_ids must be 1-D .*; got shape \(2, 3\)"),
    (torch.tensor(3), 10, ValueError, r"token_ids must be 1-D .*; got shape \(\)"),
    (torch.rand(4), 10, ValueError, r"token_ids must be 1-D integer ids .*; got shape \(4,\), torch.float32"),
    ([1, 2, 3], 10, TypeError, r"token_ids must be a Tensor, got list: wrap a list of ids with torch.tensor"),
    (torch.arange(3), 0, ValueError, r"vocab_size must be >= 1, got 0"),
    (torch.tensor([True, False]), 10, ValueError, r"token_ids must be 1-D integer ids .*torch.bool"),
])
def test_write_shard_refuses(tmp_path, ids, vocab_size, error, message):
    with pytest.raises(error, match=message):
        write_shard(tmp_path / "bad.bin", ids, vocab_size)
    assert list(tmp_path.iterdir()) == []  # neither the shard nor a .partial


def test_a_failed_write_keeps_the_old_shard(tmp_path, monkeypatch):
    path = write_shard(tmp_path / "s.bin", torch.arange(5), 10)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "from_file", broken)
    with pytest.raises(OSError, match="disk full"):
        write_shard(path, torch.arange(7), 10)
    monkeypatch.undo()
    assert read_shard(path).long().tolist() == [0, 1, 2, 3, 4]
    assert [p.name for p in tmp_path.iterdir()] == ["s.bin"]


def patched(path: Path, offset: int, value: int) -> Path:
    "A copy of the shard at path with one uint32 header field replaced."
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, offset, value)
    copy = path.with_name(f"patched_{offset}.bin")
    copy.write_bytes(bytes(raw))
    return copy


def test_read_header_errors(tmp_path):
    good = write_shard(tmp_path / "good.bin", torch.arange(10), 10)
    text = tmp_path / "notes.bin"
    text.write_bytes(b"just some text, not a shard at all" * 3)
    fields = r"is not a whole course_lib shard: \(magic, version, bytes per token, file size, byte order\) = "
    with pytest.raises(ValueError, match=r"notes.bin " + fields + r"\(b'just some text, ', "):
        read_header(text)
    short = tmp_path / "short.bin"
    short.write_bytes(good.read_bytes()[:HEADER_BYTES - 1])  # the magic is there, the rest of the header is not
    with pytest.raises(ValueError, match=r"short.bin " + fields + r"\(b'course_lib tokns', 1, 2, 63, 'little'\)"):
        read_header(short)
    expected = r", expected \(b'course_lib tokns', 1, 2, 84, 'little'\) for its 10 tokens; prepare the data again"
    with pytest.raises(ValueError, match=r"patched_16.bin " + fields + r"\(b'course_lib tokns', 2, 2, 84, 'little'\)"
                                         + expected):
        read_header(patched(good, 16, 2))  # version: the uint32 after the 16-byte magic
    with pytest.raises(ValueError, match=r"patched_20.bin " + fields + r"\(b'course_lib tokns', 1, 4, 84, 'little'\)"):
        read_header(patched(good, 20, 4))  # bytes per token: the next uint32
    truncated = tmp_path / "truncated.bin"
    truncated.write_bytes(good.read_bytes()[:-1])
    with pytest.raises(ValueError, match=r"truncated.bin " + fields + r"\(b'course_lib tokns', 1, 2, 83, 'little'\)"
                                         + expected):
        read_header(truncated)
    with pytest.raises(ValueError, match=r"truncated.bin is not a whole course_lib shard"):
        read_shard(truncated)
    longer = tmp_path / "longer.bin"
    longer.write_bytes(good.read_bytes() + b"\0\0")
    with pytest.raises(ValueError, match=r"longer.bin " + fields + r"\(b'course_lib tokns', 1, 2, 86, 'little'\)"):
        read_header(longer)
    with pytest.raises(FileNotFoundError, match=r"No such file or directory: .*missing.bin"):  # Python's own error
        read_header(tmp_path / "missing.bin")
    with pytest.raises(FileNotFoundError, match=r"No such file or directory: .*missing.bin"):
        read_shard(tmp_path / "missing.bin")
    with pytest.raises(IsADirectoryError, match=r"Is a directory"):
        read_header(tmp_path)  # a folder is not a shard either
    assert read_header(good) == ShardHeader(1, 2, 10, 10)  # reading never changes the file


# prepare

def test_prepare_char_shards(tmp_path):
    text = load_shakespeare()[:9_000]
    tokenizer = CharTokenizer.from_text(text)
    documents = [text[:3_000], text[3_000:5_000], text[5_000:]]
    meta = prepare(tmp_path, documents, tokenizer, val_tokens=1_000, shard_tokens=2_500)
    assert meta == json.loads((tmp_path / "meta.json").read_text(encoding="utf-8"))
    assert meta["tokenizer"] == {"kind": "char", "chars": tokenizer.chars}
    assert meta["vocab_size"] == tokenizer.vocab_size
    assert meta["shards"] == {"val": ["val_000000.bin"],
                              "train": ["train_000000.bin", "train_000001.bin", "train_000002.bin", "train_000003.bin"]}
    sizes = {name: read_header(tmp_path / name).n_tokens for name in meta["shards"]["val"] + meta["shards"]["train"]}
    assert sizes == {"val_000000.bin": 1_000, "train_000000.bin": 2_500, "train_000001.bin": 2_500,
                     "train_000002.bin": 2_500, "train_000003.bin": 500}
    assert meta["tokens"] == {"val": 1_000, "train": 8_000}
    assert all(read_header(tmp_path / name).vocab_size == tokenizer.vocab_size for name in sizes)
    assert shard_tokens(tmp_path, meta) == tokenizer.encode(text)  # no EOS between char documents
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*sizes, "meta.json"])


def test_prepare_fills_the_last_shard_exactly(tmp_path):
    text = load_shakespeare()[:9_000]
    tokenizer = CharTokenizer.from_text(text)
    meta = prepare(tmp_path, [text], tokenizer, val_tokens=1_000, shard_tokens=2_000)
    assert [read_header(tmp_path / n).n_tokens for n in meta["shards"]["train"]] == [2_000] * 4  # no empty 5th
    assert meta["tokens"] == {"val": 1_000, "train": 8_000}
    assert shard_tokens(tmp_path, meta) == tokenizer.encode(text)


def test_prepare_gpt2_puts_eos_before_each_document(tmp_path):
    tokenizer = gpt2_tokenizer()
    text = load_shakespeare()
    documents = [text[:1_500], text[1_500:2_000], text[10_000:12_000]]
    expected = []
    for document in documents:
        expected += [EOS_ID] + tokenizer.encode(document)
    meta = prepare(tmp_path, documents, tokenizer, val_tokens=100, shard_tokens=400)
    assert meta["tokenizer"] == {"kind": "gpt2"} and meta["vocab_size"] == 50_257
    assert shard_tokens(tmp_path, meta) == expected
    assert expected.count(EOS_ID) == 3 and expected[0] == EOS_ID
    sizes = [read_header(tmp_path / n).n_tokens for n in meta["shards"]["train"]]
    assert sizes[:-1] == [400] * (len(sizes) - 1) and 0 < sizes[-1] <= 400
    assert sum(sizes) == len(expected) - 100
    assert meta["tokens"] == {"val": 100, "train": len(expected) - 100}
    assert read_header(tmp_path / "val_000000.bin") == ShardHeader(1, 2, 50_257, 100)


@pytest.mark.parametrize("val_tokens", [26, 27, 1_000])
def test_val_taking_every_token_is_refused_where_the_run_starts(tmp_path, val_tokens):
    tokenizer = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz")
    meta = prepare(tmp_path, ["abcdefghijklm", "nopqrstuvwxyz"], tokenizer, val_tokens=val_tokens)
    assert meta["shards"]["train"] == [] and meta["tokens"] == {"val": 26, "train": 0}
    with pytest.raises(ValueError, match=r"^train shards of .*: the shards hold 0 windows of 65 tokens, fewer than one "
                                         r"step's 16: .* \(prepare with a smaller val_tokens or more text\)$"):
        pretrain(RunConfig(str(tmp_path), str(tmp_path / "out")), progress=False)
    with pytest.raises(ValueError, match=r"val_tokens must be >= 1, got 0"):
        prepare(tmp_path, ["abc"], tokenizer, val_tokens=0)


# ShardLoader on shards whose token values are their positions: what a batch holds says where it came from

CONTEXT, MICRO = 8, 4
POSITION_SHARDS = [torch.arange(0, 1_000), torch.arange(0), torch.arange(1_500, 1_505), torch.arange(2_000, 3_501)]
N_WINDOWS = 999 // CONTEXT + 1_500 // CONTEXT  # 124 + 187: the empty and the 5-token shard hold no window


@pytest.fixture(scope="module")
def position_shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("positions")
    return [write_shard(folder / f"train_{i:06d}.bin", ids, 65_536) for i, ids in enumerate(POSITION_SHARDS)]


def window_start(window: int) -> int:
    "The position (token value) where window `window` starts."
    return CONTEXT * window if window < 124 else 2_000 + CONTEXT * (window - 124)


def window_of(start: int) -> int:
    if start < 1_000:
        assert start % CONTEXT == 0
        return start // CONTEXT
    assert start >= 2_000 and (start - 2_000) % CONTEXT == 0
    return 124 + (start - 2_000) // CONTEXT


def read_windows(loader: ShardLoader, batches: int) -> list[int]:
    "The windows of the next `batches` micro-batches, checking that each holds its shifted tokens."
    windows = []
    for _ in range(batches):
        inputs, targets = loader.next_batch()
        assert inputs.shape == targets.shape == (loader.micro_batch, CONTEXT)
        assert inputs.dtype == targets.dtype == torch.int64
        for row_inputs, row_targets in zip(inputs, targets):
            window = window_of(int(row_inputs[0]))
            expected = window_start(window) + torch.arange(CONTEXT + 1)  # consecutive tokens of one shard
            assert torch.equal(row_inputs, expected[:-1]) and torch.equal(row_targets, expected[1:])
            windows.append(window)
    return windows


def permutation(paths, seed: int, epoch: int) -> list[int]:
    "The epoch's order of all N_WINDOWS windows: what one process with micro_batch 1 reads, untruncated."
    order = ShardLoader(paths, CONTEXT, 1, 0, 1, seed=seed).epoch_windows(epoch).tolist()
    assert sorted(order) == list(range(N_WINDOWS))
    return order


@pytest.mark.parametrize("rows_per_step, steps, per_rank", [
    (None, 38, 152),  # world_size x micro_batch = 8 windows a step, one micro-batch per rank: 311 // 8 = 38 steps
    (16, 19, 152),  # two micro-batches per rank and step
    (24, 12, 144),  # three: 311 // 24 = 12 steps, 23 windows wait for the next epoch
])
def test_loader_ranks_split_an_epoch(position_shards, rows_per_step, steps, per_rank):
    loaders = [ShardLoader(position_shards, CONTEXT, MICRO, rank, 2, seed=0, rows_per_step=rows_per_step)
               for rank in range(2)]
    rows = rows_per_step or 2 * MICRO
    accumulate = rows // (2 * MICRO)
    assert [(loader.n_windows, loader.rows_per_step, loader.steps_per_epoch, loader.accumulate, loader.per_rank)
            for loader in loaders] == [(311, rows, steps, accumulate, per_rank)] * 2
    assert per_rank == steps * accumulate * MICRO and N_WINDOWS - steps * rows < rows
    read = [read_windows(loader, per_rank // MICRO) for loader in loaders]
    assert [loader.state_dict()["epoch"] for loader in loaders] == [1, 1]  # the epoch is over
    assert [loader.state_dict()["position"] for loader in loaders] == [0, 0]
    assert [len(r) for r in read] == [per_rank, per_rank]
    assert not set(read[0]) & set(read[1])  # every window goes to one rank
    assert len(set(read[0]) | set(read[1])) == steps * rows and set(read[0]) | set(read[1]) <= set(range(N_WINDOWS))
    positions = [window_start(w) + i for w in read[0] + read[1] for i in range(CONTEXT)]
    assert len(positions) == len(set(positions)) == steps * rows * CONTEXT  # no input position read twice
    # rank r's micro-batch j of step k is block j * world_size + r of the step: positions k * R + (j * 2 + r) * m ...
    order = permutation(position_shards, 0, 0)
    for rank in range(2):
        for k in range(steps):
            for j in range(accumulate):
                first = k * rows + (j * 2 + rank) * MICRO
                batch = (k * accumulate + j) * MICRO
                assert read[rank][batch:batch + MICRO] == order[first:first + MICRO], (rank, k, j)
    assert set(read[0]) | set(read[1]) == set(order[:steps * rows])  # the permutation's tail is what is left out
    assert [loader.epoch_windows(0).tolist() for loader in loaders] == read


def test_loader_order_follows_seed_and_epoch(position_shards):
    def order(seed, epoch, rank=0):
        return ShardLoader(position_shards, CONTEXT, MICRO, rank, 2, seed=seed).epoch_windows(epoch).tolist()

    assert order(0, 0) == order(0, 0) and order(5, 1) == order(5, 1)
    assert order(0, 0) != order(1, 0)
    assert order(0, 0) != order(0, 1)
    assert set(order(0, 1)) != set(order(0, 0))  # another epoch is not the same windows reshuffled
    assert not set(order(0, 1)) & set(order(0, 1, rank=1))  # the ranks split epoch 1 as well
    loader = ShardLoader(position_shards, CONTEXT, MICRO, 1, 2, seed=3)
    epoch0, epoch1 = read_windows(loader, 38), read_windows(loader, 38)  # the loader moves on by itself
    assert epoch0 == order(3, 0, rank=1) and epoch1 == order(3, 1, rank=1)


def test_loader_state_resumes_the_same_batches(position_shards):
    loader = ShardLoader(position_shards, CONTEXT, MICRO, 1, 2, seed=7, rows_per_step=16)  # 2 micro-batches a step
    read_windows(loader, 31)  # in the middle of step 15
    state = loader.state_dict()
    assert state == {"epoch": 0, "position": 31, "seed": 7, "world_size": 2, "micro_batch": MICRO,
                     "rows_per_step": 16, "n_windows": 311}  # position: micro-batches read in the epoch
    expected = [loader.next_batch() for _ in range(20)]  # across the end of epoch 0 (19 steps x 2 = 38 batches)
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["position"] == 13
    resumed = ShardLoader(position_shards, CONTEXT, MICRO, 1, 2, seed=7, rows_per_step=16)
    resumed.load_state_dict(state)
    for (inputs, targets), (want_inputs, want_targets) in zip([resumed.next_batch() for _ in range(20)], expected):
        assert torch.equal(inputs, want_inputs) and torch.equal(targets, want_targets)
    assert resumed.state_dict() == loader.state_dict()


RESUME_ADVICE = r": resume with the same data, seed, world size, batch and micro_batch"


@pytest.mark.parametrize("settings, message", [
    (dict(world_size=1, rank=0, rows_per_step=8), r"the loader state was saved with world_size=2, this loader has "
                                                  r"world_size=1" + RESUME_ADVICE),
    (dict(micro_batch=2, rows_per_step=8), r"saved with micro_batch=4, this loader has micro_batch=2" + RESUME_ADVICE),
    (dict(seed=8), r"saved with seed=7, this loader has seed=8" + RESUME_ADVICE),
    (dict(rows_per_step=16), r"saved with rows_per_step=8, this loader has rows_per_step=16" + RESUME_ADVICE),
    (dict(world_size=4, micro_batch=2), r"saved with world_size=2, micro_batch=4, this loader has world_size=4, "
                                        r"micro_batch=2" + RESUME_ADVICE),  # 8 rows a step, as before
    (dict(world_size=1, rank=0), r"saved with world_size=2, rows_per_step=8, this loader has world_size=1, "
                                 r"rows_per_step=4" + RESUME_ADVICE),  # the default rows_per_step follows
])
def test_loader_refuses_another_runs_state(position_shards, settings, message):
    saved = ShardLoader(position_shards, CONTEXT, MICRO, 1, 2, seed=7)
    read_windows(saved, 3)
    state = saved.state_dict()
    kwargs = dict(context_length=CONTEXT, micro_batch=MICRO, rank=1, world_size=2, seed=7) | settings
    loader = ShardLoader(position_shards, **kwargs)
    with pytest.raises(ValueError, match=message):
        loader.load_state_dict(state)
    assert (loader.epoch, loader.position) == (0, 0)


def test_loader_refuses_a_damaged_or_older_state(position_shards):
    loader = ShardLoader(position_shards, CONTEXT, MICRO, 0, 2, seed=7)
    state = loader.state_dict()
    older = {key: value for key, value in state.items() if key != "rows_per_step"}  # as the first format saved it
    with pytest.raises(ValueError, match=r"saved with rows_per_step=None, this loader has rows_per_step=8"):
        loader.load_state_dict(older)
    epoch_batches = loader.per_rank // MICRO
    for position in (-1, epoch_batches, 10_000):
        with pytest.raises(ValueError, match=rf"the loader state's position {position} is outside an epoch: the "
                                             r"state is damaged"):
            loader.load_state_dict(state | {"position": position})
    assert (loader.epoch, loader.position) == (0, 0)


def test_a_validation_split_too_small_for_a_step_is_named(char_data, tmp_path):
    data_dir, _, _, meta = char_data  # 2,000 validation tokens: 31 windows of 65, 156 for training
    run = RunConfig(str(data_dir), str(tmp_path / "out"), batch_tokens=64 * 32, micro_batch=16, total_steps=1)
    with pytest.raises(ValueError, match=r"^val shards of .*: the shards hold \d+ windows of 65 tokens, fewer than "
                                         r"one step's \d+: .* \(prepare with a larger val_tokens\)"):
        pretrain(run, progress=False)


def test_loader_refuses_other_data_and_bad_settings(position_shards):
    state = ShardLoader(position_shards, CONTEXT, MICRO, 0, 2).state_dict()
    with pytest.raises(ValueError, match=r"saved with n_windows=311, this loader has n_windows=124"):
        ShardLoader(position_shards[:1], CONTEXT, MICRO, 0, 2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"the shards hold 2 windows of 401 tokens, fewer than one step's 4: use "
                                         r"more data, a smaller batch or a shorter context"):
        ShardLoader(position_shards[:1], 400, 2, 0, 2)
    with pytest.raises(ValueError, match=r"the shards hold 0 windows of 9 tokens, fewer than one step's 1"):
        ShardLoader(position_shards[1:3], CONTEXT, 1)
    with pytest.raises(ValueError, match=r"the shards hold 311 windows of 9 tokens, fewer than one step's 312"):
        ShardLoader(position_shards, CONTEXT, MICRO, 1, 2, rows_per_step=312)  # enough for a micro-batch, not a step
    assert ShardLoader(position_shards, CONTEXT, MICRO, 1, 2, rows_per_step=304).steps_per_epoch == 1
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2: ranks are 0 .. world_size - 1"):
        ShardLoader(position_shards, CONTEXT, MICRO, 2, 2)
    with pytest.raises(FileNotFoundError, match=r"No such file or directory: .*nope.bin"):
        ShardLoader([Path(position_shards[0]).with_name("nope.bin")], CONTEXT, MICRO)


@pytest.mark.parametrize("world_size, micro_batch, rows_per_step, error, message", [
    (2, 4, 12, ValueError, r"rows_per_step 12 is not a multiple of world_size x micro_batch = 8$"),
    (2, 4, 4, ValueError, r"rows_per_step 4 is not a multiple of world_size x micro_batch = 8"),  # half a pass
    (1, 4, 6, ValueError, r"rows_per_step 6 is not a multiple of world_size x micro_batch = 4"),
    (2, 1, 3, ValueError, r"rows_per_step 3 is not a multiple of world_size x micro_batch = 2"),
    (2, 4, 0, ValueError, r"rows_per_step must be >= 1, got 0"),
    (2, 4, 16.0, TypeError, r"rows_per_step must be an int, got 16.0"),
])
def test_loader_refuses_rows_per_step_that_splits_a_micro_batch(position_shards, world_size, micro_batch,
                                                                 rows_per_step, error, message):
    with pytest.raises(error, match=message):
        ShardLoader(position_shards, CONTEXT, micro_batch, 0, world_size, rows_per_step=rows_per_step)
    assert ShardLoader(position_shards, CONTEXT, micro_batch, 0, world_size,
                       rows_per_step=3 * world_size * micro_batch).accumulate == 3  # a multiple is accepted


def step_micro_batches(loaders: list, accumulate: int, steps: int) -> list[list[list[int]]]:
    """The micro-batches of each optimizer step, read as pretrain reads them (accumulate per rank), in block order:
    rank r's micro-batch j is block j * world_size + r of the step."""
    return [[read_windows(loader, 1) for _ in range(accumulate) for loader in loaders] for _ in range(steps)]


def step_windows(loaders: list, accumulate: int, steps: int) -> list[list[int]]:
    "The sorted windows of each optimizer step, read as pretrain reads them: accumulate micro-batches per rank."
    return [sorted(w for batches in step for w in batches) for step in step_micro_batches(loaders, accumulate, steps)]


@pytest.mark.parametrize("accumulate", [1, 2])
def test_one_process_and_two_read_the_same_micro_batches(position_shards, accumulate):
    """rows_per_step = 2 x accumulate x MICRO, as pretrain sets it from batch_tokens: one process accumulates
    2 x accumulate micro-batches a step, each of two ranks accumulate; they read the same rows in the same
    micro-batches at every step, into the third epoch."""
    rows = 2 * accumulate * MICRO
    per_epoch = N_WINDOWS // rows  # 38 or 19 steps
    steps = 2 * per_epoch + 3
    single = step_micro_batches([ShardLoader(position_shards, CONTEXT, MICRO, 0, 1, rows_per_step=rows)],
                                2 * accumulate, steps)
    ranks = [ShardLoader(position_shards, CONTEXT, MICRO, r, 2, rows_per_step=rows) for r in range(2)]
    double = step_micro_batches(ranks, accumulate, steps)
    assert len(single) == steps and all(len(step) == 2 * accumulate for step in single)
    assert single == double
    orders = [permutation(position_shards, 0, epoch) for epoch in range(3)]
    for k, step in enumerate(single):  # step k is the next `rows` windows of its epoch's permutation, in blocks
        epoch, first = divmod(k, per_epoch)
        assert [w for batch in step for w in batch] == orders[epoch][first * rows:(first + 1) * rows], k
    assert [(loader.epoch, loader.position) for loader in ranks] == [(2, 3 * accumulate)] * 2
    # without rows_per_step, one process cuts its epochs into steps of one micro-batch (77 of 4 windows): the
    # first epoch agrees, then it reads the 4 windows that two ranks leave out and falls out of step
    default = step_micro_batches([ShardLoader(position_shards, CONTEXT, MICRO, 0, 1)], 2 * accumulate, per_epoch + 1)
    assert default[:per_epoch] == double[:per_epoch] and default[per_epoch] != double[per_epoch]


def test_one_process_and_two_read_the_same_windows_across_epochs(position_shards):
    # micro_batch 1, 2 windows a step: 311 windows are 155 steps on one process and on two, 1 window left over
    single = step_windows([ShardLoader(position_shards, CONTEXT, 1, 0, 1, rows_per_step=2)], 2, 200)
    double = step_windows([ShardLoader(position_shards, CONTEXT, 1, r, 2) for r in range(2)], 1, 200)
    assert single[:155] == double[:155]  # the first epoch agrees
    assert single == double
    assert single[155] == sorted(permutation(position_shards, 0, 1)[:2])  # step 155 opens epoch 1


# Run settings

def test_accumulation_steps():
    assert accumulation_steps(1024, 1, 8, 64) == 2
    assert accumulation_steps(1024, 2, 8, 64) == 1
    assert accumulation_steps(524_288, 8, 16, 1024) == 4  # GPT-2 124M's half a million tokens on 8 GPUs
    with pytest.raises(ValueError, match=r"batch_tokens 1000 is not a multiple of world_size x micro_batch x "
                                         r"context_length = 2 x 8 x 64 = 1024: use batch_tokens 1024 or change "
                                         r"micro_batch"):
        accumulation_steps(1000, 2, 8, 64)
    with pytest.raises(ValueError, match=r"batch_tokens 5000 is not a multiple .* = 2048: use batch_tokens 4096"):
        accumulation_steps(5000, 2, 16, 64)
    with pytest.raises(ValueError, match=r"batch_tokens 1024 is not a multiple .* = 2 x 16 x 64 = 2048: use "
                                         r"batch_tokens 2048"):
        accumulation_steps(1024, 2, 16, 64)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only choice")
def test_device_and_backend_on_the_cpu():
    assert pick_device_and_backend(RunConfig("d", "o"), 0) == (torch.device("cpu"), "gloo")
    assert pick_device_and_backend(RunConfig("d", "o", backend="gloo"), 1) == (torch.device("cpu"), "gloo")
    with pytest.raises(ValueError, match=r"backend 'nccl' needs CUDA GPUs; this rank runs on cpu: use backend "
                                         r"'gloo' \(or leave backend unset\) on the CPU"):
        pick_device_and_backend(RunConfig("d", "o", backend="nccl"), 0)


@pytest.mark.parametrize("settings, error, message", [
    (dict(preset="gpt3"), ValueError, r"preset 'gpt3' is unknown: choose one of \['gpt2-124m', 'shakespeare-char'\]"),
    (dict(dtype="float16"), ValueError, r"dtype 'float16' is unknown: choose one of \['float32', 'bfloat16'\]"),
    (dict(backend="mpi"), ValueError, r"backend 'mpi' is unknown: choose one of \[None, 'gloo', 'nccl'\]"),
    (dict(micro_batch=0), ValueError, r"micro_batch must be >= 1, got 0"),
    (dict(batch_tokens=1024.0), TypeError, r"batch_tokens must be an int, got 1024.0"),
    (dict(total_steps=0), ValueError, r"total_steps must be >= 1, got 0"),
    (dict(checkpoint_every=0), ValueError, r"checkpoint_every must be >= 1, got 0"),
])
def test_run_config_refuses(settings, error, message):
    with pytest.raises(error, match=message):
        RunConfig("data", "out", **settings)


def test_presets_and_flops():
    cfg, tcfg = PRESETS["shakespeare-char"]
    assert (cfg.context_length, cfg.emb_dim, cfg.n_heads, cfg.n_layers, cfg.drop_rate) == (64, 96, 4, 3, 0.0)
    assert tcfg.total_steps == 1100
    gpt2, gpt2_schedule = PRESETS["gpt2-124m"]
    assert (gpt2.vocab_size, gpt2.context_length, gpt2.emb_dim, gpt2.n_layers, gpt2.drop_rate) == (50257, 1024, 768,
                                                                                                    12, 0.0)
    assert gpt2_schedule.total_steps == 19073
    assert flops_per_token(cfg, 1_000) == 6_000 + 12 * 3 * 64 * 96
    assert flops_per_token(gpt2, 124_000_000) == 744_000_000 + 12 * 12 * 1024 * 768
    peak = matmul_peak("cpu", size=64, repeats=2)
    assert isinstance(peak, float) and peak > 0


# Checkpoints of a run

def small_run(data_dir, out_dir, **settings):
    "What pretrain builds for a run: model, optimizer and training loader, here without training."
    run = RunConfig(str(data_dir), str(out_dir), batch_tokens=256, micro_batch=2, **settings)
    meta = json.loads((Path(data_dir) / "meta.json").read_text(encoding="utf-8"))
    cfg, tcfg = PRESETS[run.preset]
    cfg = replace(cfg, vocab_size=meta["vocab_size"])
    torch.manual_seed(run.seed)
    model = GPTModel(cfg)
    loader = ShardLoader([Path(data_dir) / n for n in meta["shards"]["train"]], cfg.context_length, run.micro_batch,
                         0, 1, run.seed, rows_per_step=run.batch_tokens // cfg.context_length)  # 2 micro-batches
    return run, model, make_optimizer(model, tcfg), loader


def test_load_run_refuses_another_run(char_data, tmp_path):
    data_dir = char_data[0]
    run, model, optimizer, loader = small_run(data_dir, tmp_path)
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    optimizer.step()
    loader.next_batch()
    history = {"step": [1], "loss": [4.0]}
    path = tmp_path / "checkpoint.pt"
    save_run(path, model, optimizer, run, 1, 1, loader, history)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
    saved = path.read_bytes()

    other_run, other_model, other_optimizer, other_loader = small_run(data_dir, tmp_path, seed=1)
    with pytest.raises(ValueError, match=r"checkpoint.pt belongs to another run: seed 0 \(now 1\)\. Resume with the "
                                         r"same settings and number of processes, or give a new out_dir"):
        load_run(path, other_model, other_optimizer, other_run, 1, other_loader, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"belongs to another run: micro_batch 2 \(now 4\)"):
        load_run(path, other_model, other_optimizer, RunConfig(str(data_dir), str(tmp_path), batch_tokens=256,
                                                               micro_batch=4), 1, other_loader, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"belongs to another run: world_size 1 \(now 2\)\."):
        load_run(path, other_model, other_optimizer, run, 2, other_loader, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"belongs to another run: batch_tokens 256 \(now 512\); "
                                         r"dtype 'float32' \(now 'bfloat16'\); world_size 1 \(now 2\)\."):
        load_run(path, other_model, other_optimizer, RunConfig(str(data_dir), str(tmp_path), batch_tokens=512,
                 micro_batch=2, dtype="bfloat16"), 2, other_loader, torch.device("cpu"))
    assert path.read_bytes() == saved  # a refused resume leaves the checkpoint alone
    assert not torch.equal(other_model.out_head.weight, model.out_head.weight)  # and loads nothing

    _, fresh_model, fresh_optimizer, fresh_loader = small_run(data_dir, tmp_path)
    # the same run on other data: the loader refuses its state before any weight or moment is loaded
    val_loader = ShardLoader([data_dir / n for n in char_data[3]["shards"]["val"]], 64, 2, rows_per_step=4)
    with pytest.raises(ValueError, match=r"the loader state was saved with n_windows=156, this loader has "
                                         r"n_windows=31: resume with the same data"):
        load_run(path, fresh_model, fresh_optimizer, run, 1, val_loader, torch.device("cpu"))
    assert not torch.equal(fresh_model.out_head.weight, model.out_head.weight)
    assert fresh_optimizer.state_dict()["state"] == {} and (val_loader.epoch, val_loader.position) == (0, 0)

    step, restored = load_run(path, fresh_model, fresh_optimizer, run, 1, fresh_loader, torch.device("cpu"))
    assert (step, restored) == (1, history)
    assert all(torch.equal(a, b) for a, b in zip(fresh_model.state_dict().values(), model.state_dict().values()))
    assert fresh_loader.state_dict() == loader.state_dict() and fresh_loader.position == 1  # one micro-batch read
    assert fresh_optimizer.state_dict()["state"][0]["step"] == 1

    vocab_size = other_model.cfg.vocab_size
    with pytest.raises(ValueError, match=rf"belongs to another run: model config \{{'vocab_size': {vocab_size}, .*\}} "
                                         rf"\(now \{{'vocab_size': 65, .*\}}\)\."):
        wider = GPTModel(replace(other_model.cfg, vocab_size=65))
        load_run(path, wider, make_optimizer(wider, PRESETS[run.preset][1]), run, 1, other_loader, torch.device("cpu"))

    torch.save({"model": {}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"other.pt is not a pretraining checkpoint \('course_lib.distributed "
                                         r"checkpoint v1'\): start a new out_dir"):
        load_run(tmp_path / "other.pt", other_model, other_optimizer, run, 1, other_loader, torch.device("cpu"))


# Validation

class WindowRecorder(nn.Module):
    "Logits that depend on the inputs, for position shards; remembers the windows of every micro-batch it is shown."

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, inputs):
        self.seen.append([window_of(int(start)) for start in inputs[:, 0]])
        scale = (inputs[:, :1] % 13).float().unsqueeze(-1)  # (batch, 1, 1): one per window
        return nn.functional.one_hot(inputs + 1, 3_502).float() * scale  # each row's loss tells where it came from


@pytest.mark.parametrize("steps, evaluated", [(3, 3), (100, 19)])  # at most the 19 steps of an epoch
def test_evaluate_shards_reads_the_same_windows_for_any_world_size(position_shards, steps, evaluated):
    rows = 16  # 2 micro-batches of 4 a step on each of two ranks, 4 on one process
    single = ShardLoader(position_shards, CONTEXT, MICRO, 0, 1, seed=2, rows_per_step=rows)
    read_windows(single, 5)
    before = single.state_dict()
    model = WindowRecorder()
    loss = evaluate_shards(model, single, steps, 1, nullcontext(), torch.device("cpu"))
    assert model.training and single.state_dict() == before  # the training state and the loader's place come back
    order = permutation(position_shards, 2, 0)
    assert len(model.seen) == evaluated * 4
    assert model.seen == [order[i:i + MICRO] for i in range(0, evaluated * rows, MICRO)]  # epoch 0's first steps
    ranks, losses = [], []
    for rank in range(2):  # world_size 1 for evaluate_shards: no process group here, so each rank's own mean
        ranks.append(WindowRecorder())
        losses.append(evaluate_shards(ranks[-1], ShardLoader(position_shards, CONTEXT, MICRO, rank, 2, seed=2,
                                                             rows_per_step=rows), steps, 1, nullcontext(), "cpu"))
    assert [len(r.seen) for r in ranks] == [evaluated * 2] * 2
    assert sorted(b for r in ranks for b in r.seen) == sorted(model.seen)  # the same micro-batches, shared out
    assert (losses[0] + losses[1]) / 2 == pytest.approx(loss, abs=1e-5, rel=0)  # all_reduce(AVG); float32 sums
    assert len(set(losses)) == 2  # the ranks' halves differ: the test can tell a rank's windows from another's


# Real runs: one process against two, and a killed run against one that was not

def test_two_processes_train_like_one(char_data, tmp_path):
    """batch_tokens = 2 x 8 x 64: one process accumulates 2 micro-batches of 8 rows per step, each of two DDP ranks
    reads one of them, the same rows in the same grouping; with one thread per process (ENV) the sums round alike
    and the weights after 12 steps (past the end of the 9-step epoch) are bit for bit the same."""
    assert ENV["OMP_NUM_THREADS"] == "1"
    data_dir = char_data[0]
    options = ["--total-steps", 12, "--batch-tokens", 2 * 8 * 64, "--micro-batch", 8]
    one = start(train_command(data_dir, tmp_path / "one", *options))
    two = start(train_command(data_dir, tmp_path / "two", *options, processes=2))
    assert "step 12: loss" in finish_ok(one)
    assert "step 12: loss" in finish_ok(two)
    a, b = load_checkpoint(tmp_path / "one"), load_checkpoint(tmp_path / "two")
    assert a["format"] == b["format"] == RUN_CHECKPOINT_FORMAT
    assert (a["world_size"], b["world_size"]) == (1, 2)
    assert a["step"] == b["step"] == 12
    assert a["run"]["batch_tokens"] == b["run"]["batch_tokens"] == 1024 and a["run"]["micro_batch"] == 8
    # 156 windows are 9 steps of 16: 3 steps into epoch 1, 2 micro-batches a step against 1
    assert [(c["loader"]["epoch"], c["loader"]["position"], c["loader"]["rows_per_step"]) for c in (a, b)] == \
        [(1, 6, 16), (1, 3, 16)]
    assert a["model"].keys() == b["model"].keys()
    difference = max((a["model"][name] - b["model"][name]).abs().max().item() for name in a["model"])
    print(f"largest parameter difference, 1 process against 2: {difference:.3g}")
    assert all(torch.equal(a["model"][name], b["model"][name]) for name in a["model"]), difference
    assert not torch.equal(a["model"]["out_head.weight"], small_run(data_dir, tmp_path)[1].out_head.weight)  # it trained
    assert a["history"]["step"] == b["history"]["step"] == list(range(1, 13))
    assert a["history"]["lr"] == b["history"]["lr"]
    assert a["history"]["loss"] == b["history"]["loss"]
    assert a["history"]["loss"][-1] < a["history"]["loss"][0]
    # validation: one step of 16 of the 31 validation windows, 2 micro-batches on one process, 1 on each rank
    assert a["history"]["eval_step"] == b["history"]["eval_step"] == [12]
    print(f"validation loss, 1 process against 2: {a['history']['val_loss']} {b['history']['val_loss']}")
    assert a["history"]["val_loss"] == pytest.approx(b["history"]["val_loss"], abs=1e-5, rel=0)


def test_a_killed_run_resumes_to_the_same_weights(char_data, tmp_path):
    data_dir = char_data[0]
    total = 60  # 156 windows, 4 per step: epoch 0 ends at step 39, so the resumed part crosses it
    options = ["--total-steps", total, "--batch-tokens", 256, "--micro-batch", 2, "--checkpoint-every", 5]
    whole = start(train_command(data_dir, tmp_path / "whole", *options))
    killed = start(train_command(data_dir, tmp_path / "resumed", *options))
    checkpoint = tmp_path / "resumed" / "checkpoint.pt"
    deadline = time.monotonic() + 120
    while not checkpoint.exists():
        assert killed.poll() is None, f"the run ended before its first checkpoint:\n{killed.stderr.read()[-4000:]}"
        assert time.monotonic() < deadline, "no checkpoint in 120 s"
        time.sleep(0.01)
    killed.kill()
    killed.communicate()
    assert killed.returncode == -signal.SIGKILL
    step = load_checkpoint(tmp_path / "resumed")["step"]
    print(f"the killed run's checkpoint is at step {step}")
    assert 0 < step < total and step % 5 == 0

    assert f"step {total}: loss" in finish_ok(start(train_command(data_dir, tmp_path / "resumed", *options)))
    finish_ok(whole)
    a, b = load_checkpoint(tmp_path / "resumed"), load_checkpoint(tmp_path / "whole")
    assert a["step"] == b["step"] == total
    assert a["loader"] == b["loader"] and a["loader"]["epoch"] == 1  # past an epoch boundary
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][name], b["model"][name]) for name in a["model"])
    assert a["history"]["step"] == b["history"]["step"] == list(range(1, total + 1))
    assert a["history"]["loss"] == b["history"]["loss"]
    assert a["history"]["val_loss"] == b["history"]["val_loss"] and a["history"]["eval_step"] == [total]
    for state_a, state_b in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(torch.as_tensor(state_a[k]), torch.as_tensor(state_b[k])) for k in state_a)

    # resuming as another run is refused, naming what differs, and leaves the checkpoint as it was
    saved = checkpoint.read_bytes()
    two = start(train_command(data_dir, tmp_path / "resumed", *options, processes=2))
    micro = start(train_command(data_dir, tmp_path / "resumed", "--total-steps", total, "--batch-tokens", 256,
                                "--micro-batch", 4))
    returncode, _, stderr = finish(two)
    assert returncode != 0 and "belongs to another run: world_size 1 (now 2)." in stderr
    returncode, _, stderr = finish(micro)
    assert returncode != 0 and "belongs to another run: micro_batch 2 (now 4)." in stderr
    assert checkpoint.read_bytes() == saved


# The command line

@pytest.mark.parametrize("order", ["text last", "text first", "out_dir last"])
def test_main_prepare_char(tmp_path, capsys, order):
    text = load_shakespeare()[:31_000]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    out = tmp_path / "shards"
    arguments = {"text last": [str(out), "--tokenizer", "char", "--text", str(corpus)],
                 "text first": [str(out), "--text", str(corpus), "--tokenizer", "char"],
                 "out_dir last": ["--tokenizer", "char", "--text", str(corpus), str(out)]}[order]
    main(["prepare", *arguments])
    assert capsys.readouterr().out == f"1,000 training and 30,000 validation tokens in {out}\n"
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    assert meta["tokenizer"] == {"kind": "char", "chars": sorted(set(text))}
    assert meta["vocab_size"] == len(set(text))
    assert meta["tokens"] == {"val": 30_000, "train": 1_000}
    assert meta["shards"] == {"val": ["val_000000.bin"], "train": ["train_000000.bin"]}
    assert shard_tokens(out, meta) == CharTokenizer.from_text(text).encode(text)


def test_main_prepare_several_files(tmp_path, capsys):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("hello world\n" * 40, encoding="utf-8")
    second.write_text("ZYX!" * 100, encoding="utf-8")
    out = tmp_path / "shards"
    main(["prepare", str(out), "--text", str(first), "--tokenizer", "char", "--text", str(second), "--val-tokens",
          "100", "--shard-tokens", "300"])
    assert capsys.readouterr().out == f"780 training and 100 validation tokens in {out}\n"
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    chars = sorted(set("hello world\nZYX!"))
    assert meta["tokenizer"] == {"kind": "char", "chars": chars}
    assert [read_header(out / n).n_tokens for n in meta["shards"]["train"]] == [300, 300, 180]
    assert shard_tokens(out, meta) == CharTokenizer(chars).encode("hello world\n" * 40 + "ZYX!" * 100)
    with pytest.raises(SystemExit):
        main(["prepare", str(out), "--tokenizer", "bpe"])
    assert "invalid choice: 'bpe'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # files are no longer positional: each comes after its own --text
        main(["prepare", str(tmp_path / "other"), str(first), "--tokenizer", "char"])
    assert f"unrecognized arguments: {first}" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()


def test_inputs_refused_before_any_work(tmp_path):
    with pytest.raises(TypeError, match=r"documents must be an iterable of texts, got one str: pass \[text\]"):
        prepare(tmp_path / "a", "To be, or not to be", CharTokenizer.from_text("To be, or not"), val_tokens=4)

    class Words:  # a tokenizer a checkpoint cannot record
        n_vocab = 10

        def encode_ordinary(self, text):
            return [1, 2, 3]
    with pytest.raises(TypeError, match="tokenizer must be a CharTokenizer or gpt2_tokenizer"):
        prepare(tmp_path / "b", ["a text"], Words(), val_tokens=1)
    assert not list((tmp_path / "b").glob("*.bin")), "no shard written for a tokenizer that is then refused"
    with pytest.raises(FileNotFoundError, match=r"No such file or directory: .*meta.json"):  # Python's own error
        pretrain(RunConfig(str(tmp_path / "nothing"), str(tmp_path / "out")), progress=False)
    for name, value in (("size", 0), ("repeats", 0)):
        with pytest.raises(ValueError, match=f"{name} must be >= 1"):
            matmul_peak(**{name: value})


def test_a_shard_read_back_can_be_written_again(tmp_path):
    ids = torch.tensor([0, 7, 65535, 12])
    first = read_shard(write_shard(tmp_path / "a.bin", ids, vocab_size=65536))  # a uint16 tensor
    again = read_shard(write_shard(tmp_path / "b.bin", first, vocab_size=65536))
    assert torch.equal(again.long(), ids)


def test_resuming_with_another_length_of_run_is_refused(char_data, tmp_path):
    data_dir = char_data[0]
    run, model, optimizer, loader = small_run(data_dir, tmp_path, total_steps=10)
    save_run(tmp_path / "checkpoint.pt", model, optimizer, run, 1, 3, loader, {})
    longer, model, optimizer, loader = small_run(data_dir, tmp_path, total_steps=20)
    with pytest.raises(ValueError, match=r"belongs to another run: total_steps 10 \(now 20\)"):
        load_run(tmp_path / "checkpoint.pt", model, optimizer, longer, 1, loader, torch.device("cpu"))


# Issue 31: the GPU levers, tested where they run on the CPU

def run_config(char_data, out_dir, **changes) -> RunConfig:
    settings = dict(total_steps=7, batch_tokens=1024, micro_batch=8, checkpoint_every=100) | changes
    return RunConfig(str(char_data[0]), str(out_dir), **settings)


def test_reading_the_loss_every_few_steps_records_every_step(char_data, tmp_path):
    """log_every=3 reads the loss after steps 3, 6 and 7 (the last), yet the history has every step, with the same
    numbers as reading after each step: only when the host waits changes."""
    each = pretrain(run_config(char_data, tmp_path / "each", log_every=1), progress=False)
    grouped = pretrain(run_config(char_data, tmp_path / "grouped", log_every=3), progress=False)
    assert grouped["step"] == each["step"] == list(range(1, 8))
    assert grouped["loss"] == each["loss"] and grouped["lr"] == each["lr"] and grouped["val_loss"] == each["val_loss"]
    rates = grouped["tokens_per_s"]
    assert rates[0] == rates[1] == rates[2] and rates[3] == rates[4] == rates[5]  # one rate per interval read


def test_a_padded_vocabulary_is_the_same_function(char_data, tmp_path):
    """vocab_multiple=128: the model has 128 rows for the 65 characters; the padding rows start at zero and stay
    zero through training (no gradient reaches them), and the loss equals that of the real rows alone."""
    from course_lib.distributed import real_vocab
    from course_lib.pretrain import build_run
    from course_lib.training import batch_loss
    run = run_config(char_data, tmp_path / "padded", vocab_multiple=128)
    pretrain(run, progress=False)
    state = load_checkpoint(tmp_path / "padded")
    vocab = char_data[3]["vocab_size"]
    assert state["model"]["out_head.weight"].shape[0] == 128 and vocab < 128
    assert state["model"]["out_head.weight"][vocab:].abs().max() == 0  # untouched by 7 AdamW steps
    model, *_, loaders, real = build_run(run, 0, 1, torch.device("cpu"))
    model.load_state_dict(state["model"])
    unpadded = GPTModel(replace(model.cfg, vocab_size=vocab)).eval()
    unpadded.load_state_dict({name: t[:vocab] if t.shape[0] == 128 else t for name, t in state["model"].items()})
    inputs, targets = loaders["val"].next_batch()
    with torch.no_grad():
        padded_loss = batch_loss(real_vocab(model.eval(), real), inputs, targets)
        assert real == vocab and torch.allclose(padded_loss, batch_loss(unpadded, inputs, targets), atol=1e-6)


def test_the_compiled_run_ends_with_the_eager_loss(char_data, tmp_path):
    """compile=True compiles the forward pass and the loss into one graph; 7 steps end at the eager run's loss."""
    eager = pretrain(run_config(char_data, tmp_path / "eager"), progress=False)
    compiled = pretrain(run_config(char_data, tmp_path / "compiled", compile=True), progress=False)
    assert compiled["loss"] == pytest.approx(eager["loss"], rel=1e-4)


def test_the_fused_optimizer_is_for_gpus_only():
    """The CPU keeps AdamW's default implementation (the shipped models' rebuilds stay bit-exact); make_optimizer's
    fused switch is a bool."""
    from course_lib.pretrain import build_run  # noqa: F401 (the CPU path is what build_run takes here)
    model = GPTModel(PRESETS["shakespeare-char"][0])
    assert make_optimizer(model, PRESETS["shakespeare-char"][1]).defaults["fused"] in (None, False)
    assert make_optimizer(model, PRESETS["shakespeare-char"][1], fused=True).defaults["fused"] is True
    with pytest.raises(TypeError, match="fused"):
        make_optimizer(model, PRESETS["shakespeare-char"][1], fused="yes")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_run_pins_batches_and_fuses_adamw(char_data, tmp_path):
    """On a GPU: the batch arrives through pinned memory, AdamW is fused, TF32 is on inside the run and restored."""
    from course_lib.distributed import batch_to
    inputs, targets = batch_to((torch.arange(6).view(2, 3), torch.arange(6).view(2, 3)), torch.device("cuda"))
    assert inputs.is_cuda and torch.equal(inputs.cpu(), torch.arange(6).view(2, 3))
    before = torch.get_float32_matmul_precision()
    history = pretrain(run_config(char_data, tmp_path / "cuda", device="cuda", log_every=3), progress=False)
    assert torch.get_float32_matmul_precision() == before and len(history["loss"]) == 7
    assert load_checkpoint(tmp_path / "cuda")["optimizer"]["param_groups"][0]["fused"] is True


def test_the_throughput_counts_the_wait_for_the_device(char_data, tmp_path, monkeypatch):
    """The clock stops after the interval's losses are read back, the one place the host waits for a GPU: a read
    that takes 0.5 s (a stand-in for a GPU finishing its queue) must show in tokens/s."""
    import time as time_module
    real_tolist = torch.Tensor.tolist

    def slow_tolist(self):
        time_module.sleep(0.5)
        return real_tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", slow_tolist)
    history = pretrain(run_config(char_data, tmp_path / "slow", total_steps=4, log_every=2), progress=False)
    assert max(history["tokens_per_s"]) < 2 * 1024 / 0.5  # 2 steps of 1,024 tokens per interval of >= 0.5 s


def test_a_padded_run_is_resumed_only_with_the_same_padding(char_data, tmp_path):
    pretrain(run_config(char_data, tmp_path / "run", total_steps=2, vocab_multiple=128), progress=False)
    with pytest.raises(ValueError, match="vocab_multiple 128 \\(now 1\\)"):
        pretrain(run_config(char_data, tmp_path / "run", total_steps=2), progress=False)

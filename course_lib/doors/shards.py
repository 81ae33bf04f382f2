"""Not a lesson: the doors of notebook 13 (course_lib/shards.py, its second module): the ids and vocabulary of a shard
to write, a shard's header and ids as read from the file, prepare's documents and shard sizes, the windows' shards
and numbers, a rank's share of an epoch, a loader's settings and its saved state."""

import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from ..guards import require_int, require_number, require_type

MAX_VOCAB = 2**16  # ids are stored as uint16: 0 .. 65535


def write_shard(token_ids, vocab_size) -> None:
    """1-D integer ids in [0, vocab_size), and a vocab_size that uint16 ids can hold."""
    require_type("token_ids", token_ids, Tensor, "wrap a list of ids with torch.tensor(...)")
    require_int("vocab_size", vocab_size, minimum=1)
    low, high = (int(token_ids.long().min()), int(token_ids.long().max())) if token_ids.numel() else (0, 0)
    if token_ids.dim() != 1 or token_ids.dtype in (torch.bool, torch.float16, torch.bfloat16, torch.float32,
                                                   torch.float64) or not 0 <= low <= high < vocab_size <= MAX_VOCAB:
        raise ValueError(f"token_ids must be 1-D integer ids in [0, vocab_size={vocab_size}), vocab_size <= 65536 "
                         f"(uint16); got shape {tuple(token_ids.shape)}, {token_ids.dtype}, ids in [{low}, {high}]")


def read_header(path: Path, magic: bytes, version: int, bytes_per_token: int, vocab_size: int, n_tokens: int) -> None:
    """A header read from path, checked against the file: the magic string, the version, the bytes per token, a
    size that matches the token count, a little-endian machine, and a vocabulary that uint16 ids fit (a shard
    whose header says vocab_size 0 could hold no id at all)."""
    from ..shards import HEADER_BYTES, SHARD_MAGIC, SHARD_VERSION  # this lesson's own format: no import cycle
    found = (magic, version, bytes_per_token, path.stat().st_size, sys.byteorder)
    expected = (SHARD_MAGIC, SHARD_VERSION, 2, HEADER_BYTES + 2 * n_tokens, "little")
    if found != expected:
        raise ValueError(f"{path} is not a whole course_lib shard: (magic, version, bytes per token, file size, "
                         f"byte order) = {found}, expected {expected} for its {n_tokens} tokens; prepare the data again")
    if not 1 <= vocab_size <= MAX_VOCAB:
        raise ValueError(f"{path}: its header's vocab_size is {vocab_size}, which no shard can have (1 .. "
                         f"{MAX_VOCAB}, the ids being uint16): the header is damaged; prepare the data again")


def read_shard(path, tokens: Tensor, vocab_size: int) -> None:
    """Every id of the mapped tokens below the header's vocab_size: one pass, 64 MiB of int32 at a time."""
    high = max(int(chunk.int().max()) for chunk in tokens.split(1 << 24))
    if high >= vocab_size:
        raise ValueError(f"{path} holds token id {high} >= its header's vocab_size {vocab_size}: the shard is "
                         "damaged; prepare the data again")


def prepare(documents, val_tokens, shard_tokens) -> Iterable:
    """Shard sizes of at least one token, and documents that are an iterable of texts (one str would make every
    character a document). A list or tuple is checked whole before anything is written; the items of any other
    iterable (a stream read once) are checked as they come. Returns the documents to read."""
    for name, value in (("val_tokens", val_tokens), ("shard_tokens", shard_tokens)):
        require_int(name, value, minimum=1)  # 0 would never fill a shard
    if isinstance(documents, str) or not isinstance(documents, Iterable):
        got = "one str" if isinstance(documents, str) else type(documents).__name__
        raise TypeError(f"documents must be an iterable of texts, got {got}: pass [text]")
    if isinstance(documents, Sequence):
        for document in documents:
            _document(document)
        return documents
    return (_document(document) for document in documents)


def _document(document) -> str:
    require_type("documents' item", document, str, "every document is one text")
    return document


def shard_windows(paths, context_length) -> None:
    """A list of shard files (not one path, whose characters would be taken for files), and a window length."""
    if isinstance(paths, (str, os.PathLike)):
        raise TypeError(f"paths must be a list of shard files, got one {type(paths).__name__}: pass [path]")
    require_int("context_length", context_length, minimum=1)


def window(window, n_windows: int) -> None:
    require_int("window", window, minimum=0)
    require_number("window", window, 0, n_windows, high_open=True, why="the windows are 0 .. n_windows - 1")


def rank_windows(order, accumulate, world_size, micro_batch, rank) -> None:
    """A rank of the job, and an order of whole steps of accumulate x world_size x micro_batch windows."""
    require_type("order", order, Tensor, "pass the epoch's permutation of window ids")
    for name, value in (("accumulate", accumulate), ("world_size", world_size), ("micro_batch", micro_batch)):
        require_int(name, value, minimum=1)
    require_number("rank", rank, 0, world_size, high_open=True, why="ranks are 0 .. world_size - 1")
    if order.numel() % (accumulate * world_size * micro_batch):
        raise ValueError(f"order has {order.numel()} windows, not whole steps of accumulate x world_size x micro_batch "
                         f"= {accumulate * world_size * micro_batch}")


def loader_state(loader, state) -> None:
    """A state saved by a loader with the same settings that fix the order, at a position inside an epoch."""
    require_type("state", state, dict, "pass what state_dict() returned")
    mine = loader.state_dict()
    keys = [k for k in ("seed", "world_size", "micro_batch", "rows_per_step", "n_windows") if state.get(k) != mine[k]]
    saved, now = (", ".join(f"{k}={values.get(k)}" for k in keys) for values in (state, mine))
    if keys:
        raise ValueError(f"the loader state was saved with {saved}, this loader has {now}: resume with the same "
                         "data, seed, world size, batch and micro_batch")
    position, epoch = state.get("position"), state.get("epoch")
    if (isinstance(position, bool) or not isinstance(position, int)
            or not 0 <= position < loader.per_rank // loader.micro_batch):
        raise ValueError(f"the loader state's position {position} is outside an epoch: the state is damaged")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"the loader state's epoch {epoch} is not a count of epochs: the state is damaged")


def shard_loader(paths, context_length, micro_batch, rank, world_size, seed, rows_per_step) -> int:
    """ShardLoader's settings, and shards that hold at least one step's windows (counted from their headers,
    before any shard is mapped); returns rows_per_step (None: one forward pass of every rank)."""
    from ..shards import read_header  # this lesson's own function: no import cycle
    for name, value in (("context_length", context_length), ("micro_batch", micro_batch),
                        ("world_size", world_size)):
        require_int(name, value, minimum=1)
    per_pass = world_size * micro_batch  # rows of one forward pass, all ranks together
    rows_per_step = per_pass if rows_per_step is None else rows_per_step
    require_int("rows_per_step", rows_per_step, minimum=1)
    require_int("seed", seed)
    require_number("rank", rank, 0, world_size, high_open=True, why="ranks are 0 .. world_size - 1")
    if rows_per_step % per_pass:  # every rank must do whole micro-batches
        raise ValueError(f"rows_per_step {rows_per_step} is not a multiple of world_size x micro_batch = {per_pass}")
    shard_windows(paths, context_length)
    n_windows = sum(max(read_header(p).n_tokens - 1, 0) // context_length for p in paths)
    if n_windows < rows_per_step:
        raise ValueError(f"the shards hold {n_windows} windows of {context_length + 1} tokens, fewer than "
                         f"one step's {rows_per_step}: use more data, a smaller batch or a shorter context")
    return rows_per_step


def epoch(epoch) -> None:
    require_int("epoch", epoch, minimum=0)

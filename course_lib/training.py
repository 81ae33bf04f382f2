import hashlib
import math
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import tiktoken
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from course_lib.config import GPTConfig
from course_lib.generation import eval_mode, generate
from course_lib.model import GPTModel
from course_lib.tokenization import DATA_DIR, CharTokenizer, check_int, gpt2_tokenizer

SHAKESPEARE_FILE = DATA_DIR / "shakespeare.txt"
SHAKESPEARE_SHA256 = "dffdc9cb92e99db88713d3201a5e791de8370a952de2797c011d85f9f33ecfd0"


def load_shakespeare() -> str:
    """The course corpus: seven Shakespeare plays, speeches headed "SPEAKER:" (see SHAKESPEARE_PROVENANCE.md)."""
    raw = SHAKESPEARE_FILE.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != SHAKESPEARE_SHA256:
        raise ValueError(f"{SHAKESPEARE_FILE.name} has sha256 {digest}, expected {SHAKESPEARE_SHA256}: the "
                         "file is damaged or was edited; restore it from the course repository")
    return raw.decode("utf-8")


def check_token_stream(data, name: str = "data") -> None:
    """Raise a clear error unless `data` is a 1-D tensor of integer token ids."""
    if not isinstance(data, Tensor):
        raise TypeError(f"{name} must be a 1-D torch.Tensor of token ids, got {type(data).__name__}: "
                        "use torch.tensor(tokenizer.encode(text))")
    if data.dtype.is_floating_point or data.dtype.is_complex or data.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {data.dtype}: convert with .long()")
    if data.dim() != 1:
        raise ValueError(f"{name} must be one stream of tokens (1-D), got shape {tuple(data.shape)}: "
                         "flatten it with .flatten()")


def split_by_position(data: Tensor, val_fraction: float = 0.1) -> tuple[Tensor, Tensor]:
    """Cut a token stream in two: the first (1 - val_fraction) for training, the rest for validation."""
    check_token_stream(data)
    if not isinstance(val_fraction, float) or not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be a float strictly between 0 and 1, got {val_fraction!r}: "
                         "it is the share of the text, taken from its end, kept for validation")
    split = int(len(data) * (1.0 - val_fraction))
    if split == 0 or split == len(data):
        raise ValueError(f"val_fraction {val_fraction} of {len(data)} tokens leaves one part empty: "
                         "use a longer text or a val_fraction further from 0 and 1")
    return data[:split], data[split:]


def get_batch(data: Tensor, batch_size: int, context_length: int, generator: torch.Generator,
              device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """batch_size windows of data at random starts drawn from generator: inputs (batch_size, context_length)
    and targets, the same windows shifted one token to the right, both moved to device (default: data's)."""
    check_token_stream(data)
    check_int("batch_size", batch_size, 1)
    check_int("context_length", context_length, 1)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}: "
                        "create one with torch.Generator().manual_seed(123)")
    if len(data) < context_length + 1:
        raise ValueError(f"data has {len(data)} tokens but one window needs context_length + 1 = "
                         f"{context_length + 1}: use more text or a smaller context_length")
    starts = torch.randint(len(data) - context_length, (batch_size,), generator=generator,
                           device=generator.device).to(data.device)  # (batch_size,)
    offsets = torch.arange(context_length + 1, device=data.device)  # (context_length + 1,)
    windows = data[starts.unsqueeze(1) + offsets]  # (batch_size, context_length + 1)
    device = data.device if device is None else device
    return windows[:, :-1].to(device), windows[:, 1:].to(device)


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token loss: -log softmax(logits)[target] over every position.
    logits (batch, tokens, vocab_size), targets (batch, tokens) -> scalar."""
    if not isinstance(logits, Tensor) or not logits.dtype.is_floating_point or logits.dim() != 3:
        raise TypeError(f"logits must be a float tensor (batch, tokens, vocab_size), got "
                        f"{tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__}")
    if not isinstance(targets, Tensor) or targets.dtype != torch.long or targets.shape != logits.shape[:2]:
        got = (f"{targets.dtype} {tuple(targets.shape)}" if isinstance(targets, Tensor)
               else type(targets).__name__)
        raise ValueError(f"targets must be a long tensor of shape {tuple(logits.shape[:2])} (one id per "
                         f"position of logits), got {got}")
    if targets.numel() and not 0 <= int(targets.min()) <= int(targets.max()) < logits.shape[-1]:
        raise ValueError(f"targets must be token ids in [0, {logits.shape[-1] - 1}], got values from "
                         f"{int(targets.min())} to {int(targets.max())}")
    log_probs = torch.log_softmax(logits, dim=-1)  # (batch, tokens, vocab_size), stable: no exp overflow
    picked = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (batch, tokens): log p(target)
    return -picked.mean()


def batch_loss(model: nn.Module, inputs: Tensor, targets: Tensor) -> Tensor:
    """The model's mean next-token loss on one batch, with PyTorch's fused F.cross_entropy."""
    logits = model(inputs)  # (batch, tokens, vocab_size)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # (batch * tokens) rows at once


@dataclass(frozen=True)
class TrainConfig:
    """How to train: the length and learning-rate schedule of the run, the batch, the optimizer, evaluation."""

    total_steps: int = 1000  # optimizer steps of the whole run
    batch_size: int = 16  # windows per step
    max_lr: float = 4e-3  # peak learning rate, reached at the end of the warmup
    min_lr: float = 4e-4  # learning rate at the last step
    warmup_steps: int = 50  # steps of linear increase from max_lr / warmup_steps to max_lr
    weight_decay: float = 0.1  # AdamW decay of the weight matrices (not of biases and LayerNorm)
    grad_clip: float = 1.0  # largest gradient norm; larger gradients are scaled down to it
    eval_every: int = 100  # steps between evaluations (the last step is always evaluated)
    eval_batches: int = 8  # batches per split and evaluation

    def __post_init__(self):
        for name in ("total_steps", "batch_size", "eval_every", "eval_batches"):
            check_int(name, getattr(self, name), 1)
        check_int("warmup_steps", self.warmup_steps, 0)
        if self.warmup_steps >= self.total_steps:
            raise ValueError(f"warmup_steps {self.warmup_steps} must be < total_steps {self.total_steps}: "
                             "the warmup is the first part of the run")
        for name in ("max_lr", "min_lr", "weight_decay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not 0 < self.max_lr or self.min_lr > self.max_lr:
            raise ValueError(f"need 0 <= min_lr <= max_lr and max_lr > 0, got min_lr {self.min_lr} and "
                             f"max_lr {self.max_lr}")
        if isinstance(self.grad_clip, bool) or not isinstance(self.grad_clip, (int, float)) or not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be a number > 0, got {self.grad_clip!r}: it is the largest gradient "
                             "norm allowed (0 would zero every update; use math.inf for no clipping)")


def lr_at(step: int, tcfg: TrainConfig) -> float:
    """Learning rate of optimizer step `step` (0-based): a linear warmup to tcfg.max_lr at step
    warmup_steps - 1, then half a cosine down to tcfg.min_lr at the last step, total_steps - 1."""
    check_int("step", step, 0)
    if step >= tcfg.total_steps:
        raise ValueError(f"step {step} is past the run: steps go from 0 to total_steps - 1 = "
                         f"{tcfg.total_steps - 1}; to train longer, make a TrainConfig with more total_steps")
    if step < tcfg.warmup_steps:
        return tcfg.max_lr * (step + 1) / tcfg.warmup_steps
    decay_steps = tcfg.total_steps - 1 - tcfg.warmup_steps
    progress = (step - tcfg.warmup_steps) / decay_steps if decay_steps else 1.0  # 0 -> 1
    return tcfg.min_lr + 0.5 * (tcfg.max_lr - tcfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, tcfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with betas (0.9, 0.99); weight decay only on matrices (>= 2-D), not on biases and LayerNorm."""
    params = [p for p in model.parameters() if p.requires_grad]  # a tied weight counts once
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": tcfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tcfg.max_lr, betas=(0.9, 0.99))


@torch.no_grad()
def evaluate(model: GPTModel, splits: dict[str, Tensor], batch_size: int, num_batches: int,
             seed: int = 0) -> dict[str, float]:
    """Mean loss of the model on num_batches random batches of each split, in eval mode, without gradients.
    The batches come from a generator seeded with `seed`, so every evaluation sees the same windows."""
    check_int("num_batches", num_batches, 1)
    device = next(model.parameters()).device
    losses = {}
    with eval_mode(model):
        for name, data in splits.items():
            generator = torch.Generator().manual_seed(seed)
            total = 0.0
            for _ in range(num_batches):
                inputs, targets = get_batch(data, batch_size, model.cfg.context_length, generator, device)
                total += batch_loss(model, inputs, targets).item()
            losses[name] = total / num_batches
    return losses


def new_history() -> dict:
    """An empty record of a run: loss and learning rate of every step, the evaluations, seconds of training."""
    return {"loss": [], "lr": [], "eval_step": [], "train_loss": [], "val_loss": [], "seconds": 0.0}


def train(model: GPTModel, optimizer: torch.optim.Optimizer, train_data: Tensor, val_data: Tensor,
          tcfg: TrainConfig, generator: torch.Generator, start_step: int = 0, stop_step: int | None = None,
          history: dict | None = None, progress: bool = True) -> dict:
    """Run optimizer steps start_step .. stop_step - 1 (default: to the end of the run) and return the
    history, extended in place if one is passed. Evaluates every tcfg.eval_every steps and at the last step."""
    stop_step = tcfg.total_steps if stop_step is None else stop_step
    check_int("start_step", start_step, 0)
    check_int("stop_step", stop_step, start_step)
    if stop_step > tcfg.total_steps:
        raise ValueError(f"stop_step {stop_step} > total_steps {tcfg.total_steps}: the learning-rate "
                         "schedule ends there; make a TrainConfig with more total_steps")
    history = new_history() if history is None else history
    device = next(model.parameters()).device
    model.train()
    bar = tqdm(range(start_step, stop_step), desc="training", disable=not progress, mininterval=1.0)
    for step in bar:
        started = time.perf_counter()
        lr = lr_at(step, tcfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = get_batch(train_data, tcfg.batch_size, model.cfg.context_length, generator, device)
        loss = batch_loss(model, inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
        optimizer.step()
        history["loss"].append(loss.item())
        history["lr"].append(lr)
        history["seconds"] += time.perf_counter() - started  # training time only, not evaluation
        bar.set_postfix(loss=f"{history['loss'][-1]:.3f}", refresh=False)
        if (step + 1) % tcfg.eval_every == 0 or step + 1 == tcfg.total_steps:
            losses = evaluate(model, {"train": train_data, "val": val_data}, tcfg.batch_size, tcfg.eval_batches)
            history["eval_step"].append(step + 1)
            history["train_loss"].append(losses["train"])
            history["val_loss"].append(losses["val"])
    bar.close()
    return history


def sample_text(model: GPTModel, tokenizer, prompt: str, max_new_tokens: int, temperature: float = 0.8,
                top_k: int | None = None, seed: int = 123) -> str:
    """The prompt continued by max_new_tokens sampled tokens, as text; the same seed gives the same text."""
    device = next(model.parameters()).device
    idx = torch.tensor([tokenizer.encode(prompt)], device=device)  # (1, prompt tokens)
    generator = torch.Generator(device=device).manual_seed(seed)
    out = generate(model, idx, max_new_tokens, context_size=model.cfg.context_length,
                   temperature=temperature, top_k=top_k, generator=generator)  # (1, prompt + new tokens)
    return tokenizer.decode(out[0].tolist())


CHECKPOINT_FORMAT = "course_lib.training checkpoint v1"
CHECKPOINT_KEYS = ("format", "model_config", "tie_weights", "model", "optimizer", "train_config",
                   "tokenizer", "step", "generator", "torch_rng", "history")


def tokenizer_state(tokenizer) -> dict:
    """What a checkpoint stores to rebuild the tokenizer: a CharTokenizer's characters, or GPT-2's name."""
    if isinstance(tokenizer, CharTokenizer):
        return {"kind": "char", "chars": list(tokenizer.chars)}
    if isinstance(tokenizer, tiktoken.Encoding) and tokenizer.name == "gpt2":
        return {"kind": "gpt2"}
    raise TypeError(f"tokenizer must be a CharTokenizer or course_lib's gpt2_tokenizer(), got "
                    f"{type(tokenizer).__name__}")


def tokenizer_from_state(state: dict):
    """The tokenizer that tokenizer_state() described."""
    return CharTokenizer(state["chars"]) if state["kind"] == "char" else gpt2_tokenizer()


def save_checkpoint(path: str | Path, model: GPTModel, optimizer: torch.optim.Optimizer, tokenizer,
                    tcfg: TrainConfig, step: int, generator: torch.Generator,
                    history: dict | None = None) -> Path:
    """Write everything needed to rebuild the model and continue training exactly where step `step` ended:
    config, weights, optimizer moments, tokenizer vocabulary, batch generator and torch's random state.
    Written to a temporary file first and renamed, so an interrupted save never leaves a half file at path."""
    if not isinstance(model, GPTModel):
        raise TypeError(f"model must be a GPTModel, got {type(model).__name__}")
    check_int("step", step, 0)
    path = Path(path)
    payload = {
        "format": CHECKPOINT_FORMAT,
        "model_config": asdict(model.cfg),
        "tie_weights": model.out_head.weight is model.embedding.tok_emb.weight,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "train_config": asdict(tcfg),
        "tokenizer": tokenizer_state(tokenizer),
        "step": step,
        "generator": generator.get_state(),
        "torch_rng": torch.get_rng_state(),  # dropout draws from it
        "history": history,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    torch.save(payload, partial)
    os.replace(partial, path)  # atomic: path is either the old file or the complete new one
    return path


@dataclass
class Checkpoint:
    """Everything load_checkpoint() rebuilt; resume with train(..., start_step=ckpt.step, history=ckpt.history)."""

    model: GPTModel
    optimizer: torch.optim.AdamW
    tokenizer: object
    train_config: TrainConfig
    step: int
    generator: torch.Generator
    history: dict | None


def load_checkpoint(path: str | Path, device: torch.device | str | None = None,
                    expected_config: GPTConfig | None = None, expected_tokenizer=None) -> Checkpoint:
    """Rebuild model (on device, default cpu), optimizer, tokenizer, batch generator and step from a
    save_checkpoint() file, and restore torch's random state. expected_config / expected_tokenizer: raise
    if the checkpoint was made with another model shape or another vocabulary."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist: check the path, or create the file with "
                                "save_checkpoint(...)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated zip, a pickle error, another file type: all mean "not readable"
        reason = str(error).split(". ")[0].strip() or type(error).__name__  # the first sentence is enough
        raise ValueError(f"checkpoint {path} cannot be read ({reason}): the file is truncated or is not a "
                         "checkpoint, e.g. a copy or save was interrupted; save it again with "
                         "save_checkpoint(...)") from error
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(f"{path} is not a course_lib training checkpoint (format {found!r}, expected "
                         f"{CHECKPOINT_FORMAT!r}): write checkpoints with save_checkpoint(...)")
    missing = [key for key in CHECKPOINT_KEYS if key not in payload]
    if missing:
        raise ValueError(f"checkpoint {path} lacks {missing}: it was not written by save_checkpoint(...) "
                         "of this version; save it again")
    try:
        cfg = GPTConfig(**payload["model_config"])
        tcfg = TrainConfig(**payload["train_config"])
    except (TypeError, ValueError) as error:
        raise ValueError(f"checkpoint {path} holds a config this version cannot build ({error}); save it "
                         "again with save_checkpoint(...)") from error
    if expected_config is not None and cfg != expected_config:
        differ = [f"{f.name} {getattr(cfg, f.name)!r} (you expect {getattr(expected_config, f.name)!r})"
                  for f in fields(GPTConfig) if getattr(cfg, f.name) != getattr(expected_config, f.name)]
        raise ValueError(f"checkpoint {path} holds a model with {', '.join(differ)}: build the model from "
                         "the checkpoint's own config (ckpt.model.cfg) or load a checkpoint of this shape")
    tokenizer = tokenizer_from_state(payload["tokenizer"])
    if expected_tokenizer is not None and tokenizer_state(expected_tokenizer) != payload["tokenizer"]:
        raise ValueError(f"checkpoint {path} was trained with another vocabulary than expected_tokenizer, so "
                         "its token ids mean other characters: use the checkpoint's tokenizer (ckpt.tokenizer)")
    vocab_size = tokenizer.vocab_size if isinstance(tokenizer, CharTokenizer) else tokenizer.n_vocab
    if vocab_size != cfg.vocab_size:
        raise ValueError(f"checkpoint {path} is inconsistent: its tokenizer has {vocab_size} tokens but its "
                         f"model has vocab_size {cfg.vocab_size}; save it again with save_checkpoint(...)")
    model = GPTModel(cfg, tie_weights=payload["tie_weights"])
    try:
        model.load_state_dict(payload["model"])
        model.to(device if device is not None else "cpu")
        optimizer = make_optimizer(model, tcfg)
        optimizer.load_state_dict(payload["optimizer"])  # moves the moments to the parameters' device
    except (RuntimeError, ValueError) as error:
        lines = str(error).strip().splitlines()
        detail = lines[1].strip() if len(lines) > 1 else lines[0]  # the first key or shape that differs
        raise ValueError(f"checkpoint {path}: the stored weights do not fit its own config ({detail}); "
                         "save it again with save_checkpoint(...)") from error
    generator = torch.Generator()
    generator.set_state(payload["generator"])
    torch.set_rng_state(payload["torch_rng"])
    return Checkpoint(model, optimizer, tokenizer, tcfg, payload["step"], generator, payload["history"])

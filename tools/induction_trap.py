"""An experiment, not a timing: notebook 12's attention-only model trained on the "obvious" data, passages of
uniform random tokens repeated to fill the row, instead of the notebook's second-order Markov chain. Notebook 12,
section 6, quotes what this prints: the model learns to copy at one distance by position alone, and no induction
head forms.

    python tools/induction_trap.py             # 3,000 steps, about a minute on one thread
    python tools/induction_trap.py --steps 300 # a smoke run

Everything else is notebook 12's: the model (2 blocks of 4 attention heads of width 16, no feed-forward), AdamW at
3e-3, batches of 64 rows of 32 tokens, passages of 6 to 16 tokens, and its probe (64 rows of 12 uniform random
tokens, repeated once). Printed: the probe's loss on the second copy before and after, the best induction score in
block 1, how far back each block-0 head looks on average, and the loss on probes with passages of 6, 12 and 16.
"""

import argparse
import time

import torch
import torch.nn.functional as F

from course_lib.config import GPTConfig
from course_lib.interpretability import (SecondOrderChain, attention_only, induction_score, repeated_passages,
                                         run_with_cache)
from course_lib.model import GPTModel
from course_lib.training import batch_loss


def probe(period: int, seed: int = 2) -> torch.Tensor:
    """(64, 2 * period): 64 rows of `period` uniform random tokens, each repeated once."""
    half = torch.randint(0, 64, (64, period), generator=torch.Generator().manual_seed(seed))
    return torch.cat([half, half], dim=1)


def second_copy_loss(model: GPTModel, ids: torch.Tensor, period: int) -> float:
    with torch.no_grad():
        logits = model(ids)
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    return losses[:, period:].mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, context_length=32, emb_dim=64, n_heads=4, n_layers=2, drop_rate=0.0)
    model = attention_only(GPTModel(cfg))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    uniform = SecondOrderChain(vocab_size=64, strength=0.0, seed=0)  # strength 0: every token uniform
    data = torch.Generator().manual_seed(1)
    probe_12 = probe(12)
    before = second_copy_loss(model, probe_12, 12)
    start = time.perf_counter()
    for _ in range(args.steps):
        batch = repeated_passages(uniform, 64, cfg.context_length, range(6, 17), data)  # (64, 32)
        loss = batch_loss(model, batch[:, :-1], batch[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    seconds = time.perf_counter() - start

    _, cache = run_with_cache(model, probe_12)
    pattern0 = cache["blocks.0.attn.pattern"]  # (64, heads, 24, 24)
    positions = torch.arange(probe_12.shape[1])
    distance = (positions[:, None] - positions[None, :]).clamp(min=0).float()  # (24, 24): how far back a key is
    look_back = (pattern0 * distance).sum(-1)[:, :, 12:].mean(dim=(0, 2))  # (heads,): mean distance, second copy
    induction = induction_score(cache["blocks.1.attn.pattern"], 12)
    print(f"{args.steps} steps of uniform random passages of 6 to 16 tokens, repeated ({seconds:.0f} s)")
    print(f"probe (passages of 12), loss on the second copy: {before:.1f} nats before, "
          f"{second_copy_loss(model, probe_12, 12):.1f} after")
    print(f"best induction score in block 1: {induction.max():.2f}")
    print("block-0 heads look back on average: " + ", ".join(f"{d:.1f}" for d in look_back.tolist()) + " positions")
    print("loss on the second copy by passage length: " + ", ".join(
        f"{period}: {second_copy_loss(model, probe(period), period):.1f}" for period in (6, 12, 16)))


if __name__ == "__main__":
    main()

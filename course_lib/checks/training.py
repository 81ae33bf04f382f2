"""The checks of the exercises in notebooks/09_training.ipynb."""

import torch
import torch.nn.functional as F
from torch import Tensor

from .core import Checker, compare, isolated_rng, require_function


def reference_next_token_loss(logits: Tensor, token_ids: Tensor) -> Tensor:
    """Mean cross-entropy of predicting token_ids[:, t + 1] from logits[:, t]."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), token_ids[:, 1:].flatten())


@isolated_rng
def check_next_token_loss(learner_impl) -> None:
    """Check `learner_impl(logits, token_ids)`, the language-modelling loss of notebook 09.

    token_ids: integer ids (batch, tokens); logits: the model's output for them, (batch, tokens, vocab_size).
    Position t predicts token t + 1, so the last position has no target. Must return one number as a 0-d tensor
    that backward() can use: the mean cross-entropy over all batch * (tokens - 1) predictions, i.e.
    F.cross_entropy(logits[:, :-1].flatten(0, 1), token_ids[:, 1:].flatten())."""
    ck = Checker("check_next_token_loss")
    require_function(ck, learner_impl, "my_loss(logits, token_ids)")
    batch, tokens, vocab = 3, 6, 11

    def unshifted(lo, ids):
        return F.cross_entropy(lo.flatten(0, 1), ids.flatten())

    def per_prediction(lo, ids):
        return F.cross_entropy(lo[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")  # (batch, tokens - 1)

    for logits, ids, situation in (
            (torch.randn(batch, tokens, vocab, dtype=torch.float64), torch.randint(0, vocab, (batch, tokens)),
             f"for logits ({batch}, {tokens}, {vocab})"),
            (torch.randn(1, 2, vocab, dtype=torch.float64), torch.randint(0, vocab, (1, 2)),
             "for one sequence of two tokens (one prediction)")):
        logits.requires_grad_(True)
        expected = reference_next_token_loss(logits, ids)
        got = ck.call(f"my_loss {situation}", learner_impl, logits, ids.clone())
        if isinstance(got, (float, int)):
            ck.fail(f"{situation}, you return a Python number ({got:.4g})",
                    "the loss is turned into a number with .item(), so loss.backward() cannot work: return the tensor")
        if isinstance(got, Tensor) and got.dim() > 0 and got.numel() > 1:
            ck.fail(f"{situation}, your loss has shape {tuple(got.shape)}, expected one number (a 0-d tensor)",
                    "you return one loss per sequence or per token: average them all, e.g. with .mean() or "
                    "F.cross_entropy's default reduction")
        if isinstance(got, Tensor) and got.dim() > 0:
            got = got.reshape(())
        variants = [
            ("the targets are not shifted: position t predicts token t + 1, so compare logits[:, :-1] with "
             "token_ids[:, 1:]", lambda: unshifted(logits, ids)),
            ("the shift goes the wrong way: compare logits[:, :-1] (every position but the last) with "
             "token_ids[:, 1:] (every token but the first)", lambda: unshifted(logits[:, 1:], ids[:, :-1])),
            ("the losses are summed instead of averaged: take the mean over all predictions",
             lambda: per_prediction(logits, ids).sum()),
            ("the mean is taken over the batch only (the tokens are summed): average over all batch * (tokens - 1) "
             "predictions", lambda: per_prediction(logits, ids).sum(dim=1).mean()),
            ("the mean runs over the vocabulary as well: average over predictions only, -log_softmax(logits) "
             "at the target, not over all vocab_size entries",
             lambda: per_prediction(logits, ids).mean() / vocab),
            ("softmax applied before F.cross_entropy, which applies log_softmax itself: pass the raw logits",
             lambda: F.cross_entropy(torch.softmax(logits[:, :-1], -1).flatten(0, 1), ids[:, 1:].flatten())),
            ("the log is missing: the loss is the mean of -log(probability of the target), not of "
             "-probability", lambda: -torch.softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).mean()),
            ("the sign is wrong: cross-entropy is -log(probability of the target)",
             lambda: -reference_next_token_loss(logits, ids)),
        ]
        compare(ck, got, expected, variants, situation,
                "F.cross_entropy(logits[:, :-1].flatten(0, 1), token_ids[:, 1:].flatten())")
        if got.grad_fn is None:
            ck.fail(f"{situation}, your loss is not connected to the logits (no gradient)",
                    "the loss was computed from detached values (.detach(), .item(), torch.tensor(...), numpy): "
                    "build it from the logits with torch operations")
        got.backward()
        mine_grad = logits.grad.clone()
        logits.grad = None
        expected.backward()
        if not torch.allclose(mine_grad, logits.grad, atol=1e-8, rtol=1e-6):
            ck.fail(f"{situation}, the gradient of your loss differs from the reference's",
                    "part of your loss does not come from the logits; compute it with torch operations only")
        ck.ok()
    logits = 300 * torch.randn(2, 5, vocab)  # float32 logits far apart: softmax underflows to 0 for most tokens
    ids = torch.randint(0, vocab, (2, 5))
    got = ck.call("my_loss on large float32 logits", learner_impl, logits, ids)
    if isinstance(got, Tensor) and not bool(torch.isfinite(got).all()):
        ck.fail(f"for large float32 logits (300 * randn) your loss is {got.reshape(-1)[0].item()}",
                "log(softmax(...)) underflows to log(0) = -inf: use F.log_softmax or F.cross_entropy, which "
                "subtract the maximum first")
    compare(ck, got.reshape(()) if isinstance(got, Tensor) else got, reference_next_token_loss(logits, ids), [],
            "for large float32 logits (300 * randn)", "use F.cross_entropy or F.log_softmax", atol=1e-3, rtol=1e-4)
    ck.done("Your loss matches F.cross_entropy on next-token targets.")


@isolated_rng
def check_perplexity(learner_impl) -> None:
    """Check `learner_impl(logits, token_ids)`, the perplexity of notebook 09.

    token_ids: integer ids (batch, tokens); logits: the model's output for them, (batch, tokens, vocab_size).
    Must return one number (a float or a 0-d tensor): e ** (the mean next-token cross-entropy over all
    batch * (tokens - 1) predictions), i.e. torch.exp(F.cross_entropy(logits[:, :-1].flatten(0, 1),
    token_ids[:, 1:].flatten()))."""
    ck = Checker("check_perplexity")
    require_function(ck, learner_impl, "my_perplexity(logits, token_ids)")
    batch, tokens, vocab = 3, 6, 11

    def per_prediction(lo, ids):
        return F.cross_entropy(lo[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")  # (batch, tokens - 1)

    cases = [(torch.randn(batch, tokens, vocab, dtype=torch.float64), torch.randint(0, vocab, (batch, tokens)),
              f"for logits ({batch}, {tokens}, {vocab})"),
             (torch.randn(2, 9, vocab, dtype=torch.float64) * 3, torch.randint(0, vocab, (2, 9)),
              f"for peaked logits (2, 9, {vocab})"),
             (torch.zeros(2, 4, vocab, dtype=torch.float64), torch.randint(0, vocab, (2, 4)),
              f"for all-zero logits (a uniform guess over {vocab} tokens: perplexity {vocab})")]
    with torch.no_grad():
        for logits, ids, situation in cases:
            expected = torch.exp(reference_next_token_loss(logits, ids))
            got = ck.call(f"my_perplexity {situation}", learner_impl, logits.clone(), ids.clone())
            if isinstance(got, Tensor) and got.numel() > 1:
                ck.fail(f"{situation}, your perplexity has shape {tuple(got.shape)}, expected one number",
                        "one perplexity per sequence or per token: average the losses of all predictions first, "
                        "then take exp of that mean")
            if isinstance(got, (int, float)) or (isinstance(got, Tensor) and got.numel() == 1):
                got = torch.as_tensor(got, dtype=torch.float64).reshape(())
            losses = per_prediction(logits, ids)
            variants = [
                ("exp is missing: you return the loss; the perplexity is e ** loss, torch.exp(loss)",
                 lambda: losses.mean()),
                ("the perplexity is 2 ** loss, but the loss is in nats (natural log): use torch.exp(loss)",
                 lambda: 2 ** losses.mean()),
                ("the targets are not shifted: position t predicts token t + 1, so compare logits[:, :-1] with "
                 "token_ids[:, 1:]",
                 lambda: torch.exp(F.cross_entropy(logits.flatten(0, 1), ids.flatten()))),
                ("exp of the summed loss: average the losses over all predictions first, then take exp",
                 lambda: torch.exp(losses.sum())),
                ("the per-token perplexities are averaged (mean of exp): take exp of the mean loss instead, "
                 "a geometric mean of the inverse probabilities",
                 lambda: torch.exp(losses).mean()),
                ("the perplexities of the sequences are averaged: take exp of the mean loss over all predictions",
                 lambda: torch.exp(losses.mean(dim=1)).mean()),
                ("the inverse of the mean probability of the targets: the perplexity is exp of the mean of "
                 "-log(probability), not 1 / mean(probability)",
                 lambda: 1 / torch.exp(-losses).mean()),
                ("the mean runs over the batch only (the tokens are summed): average over all batch * (tokens - 1) "
                 "predictions", lambda: torch.exp(losses.sum(dim=1).mean())),
            ]
            compare(ck, got, expected, variants, situation,
                    "torch.exp(F.cross_entropy(logits[:, :-1].flatten(0, 1), token_ids[:, 1:].flatten()))",
                    atol=1e-8, rtol=1e-6)
        logits = 300 * torch.randn(2, 5, vocab)  # float32 logits far apart: softmax underflows to 0 for most tokens
        ids = logits.argmax(dim=-1)  # the targets are mostly likely ones, so the perplexity stays finite
        ids[:, 1:] = logits[:, :-1].argmax(dim=-1)
        got = ck.call("my_perplexity on large float32 logits", learner_impl, logits, ids)
        if isinstance(got, (int, float)) or (isinstance(got, Tensor) and got.numel() == 1):
            got = torch.as_tensor(got, dtype=torch.float64).reshape(())
        if isinstance(got, Tensor) and not bool(torch.isfinite(got).all()):
            ck.fail(f"for large float32 logits whose targets are their most likely tokens, your perplexity is "
                    f"{got.item()}", "log(softmax(...)) underflows to log(0) = -inf: use F.log_softmax or "
                    "F.cross_entropy, which subtract the maximum first")
        compare(ck, got, torch.exp(reference_next_token_loss(logits, ids)), [], "for large float32 logits",
                "use F.cross_entropy or F.log_softmax", atol=1e-3, rtol=1e-4)
    ck.done("Your perplexity matches exp(F.cross_entropy) on next-token targets.")

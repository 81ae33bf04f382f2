"""The checks of the exercises in notebooks/11_decoding.ipynb."""

import torch
from torch import Tensor

from course_lib.decoding import penalize_repetition

from .core import Checker, check_unchanged, compare, first_matching_bug, isolated_rng, require_function


@isolated_rng
def check_repetition_penalty(learner_impl) -> None:
    """Check `learner_impl(logits, token_ids, penalty)`, the repetition penalty of notebook 11.

    logits: (batch, vocab_size) floats; token_ids: (batch, tokens) the ids so far; penalty > 0. Must return new
    logits where each token that occurs in its row of token_ids has a positive logit divided by penalty and a
    negative one multiplied by it (once, however often it occurs), like course_lib.decoding.penalize_repetition."""
    ck = Checker("check_repetition_penalty")
    require_function(ck, learner_impl, "my_repetition_penalty(logits, token_ids, penalty)")
    cases = [(torch.randn(3, 12) * 3, torch.randint(0, 12, (3, 6)), 1.5, "random logits (3, 12), 6 ids per row"),
             (torch.randn(2, 12) * 3, torch.tensor([[4, 4, 4, 1], [0, 2, 2, 2]]), 2.0, "ids that repeat"),
             (torch.randn(4, 12) * 3, torch.randint(0, 12, (4, 9)), 0.7, "a penalty below 1 (favours used ids)"),
             (torch.tensor([[2.0, -2.0, 0.5, -0.5, 1.0]]), torch.tensor([[0, 1, 2, 3]]), 1.5,
              "the logits [2, -2, 0.5, -0.5, 1] with ids 0-3 used")]
    with torch.no_grad():
        for logits, token_ids, penalty, what in cases:
            situation = f"for {what} and penalty {penalty}"
            before = logits.clone()
            got = ck.call(f"my_repetition_penalty on {what}", learner_impl, logits, token_ids, penalty)
            check_unchanged(ck, before, logits, "repetition penalty")
            used = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, token_ids, True)
            counts = torch.zeros_like(logits).scatter_add(-1, token_ids, torch.ones_like(token_ids, dtype=logits.dtype))
            variants = [
                ("every used logit is divided by the penalty: a negative logit divided by a penalty > 1 moves up "
                 "towards 0, making the token MORE likely; multiply the negative ones",
                 lambda: torch.where(used, logits / penalty, logits)),
                ("every used logit is multiplied by the penalty: a positive logit times a penalty > 1 grows; "
                 "divide the positive ones and multiply the negative ones",
                 lambda: torch.where(used, logits * penalty, logits)),
                ("the two cases are swapped: divide positive logits and multiply negative ones",
                 lambda: torch.where(used, torch.where(logits > 0, logits * penalty, logits / penalty), logits)),
                ("a token is penalised once per occurrence: penalise each used token once, however often it occurs",
                 lambda: torch.where(logits > 0, logits / penalty ** counts, logits * penalty ** counts)),
                ("every logit is penalised, used or not: change only the tokens in each row's token_ids",
                 lambda: torch.where(logits > 0, logits / penalty, logits * penalty)),
                ("each row uses the history of row 0: gather and scatter with each row's own ids",
                 lambda: penalize_repetition(logits, token_ids[:1].expand_as(token_ids), penalty)),
            ]
            compare(ck, got, penalize_repetition(logits, token_ids, penalty), variants, situation,
                    "gather the used logits, apply torch.where(used > 0, used / penalty, used * penalty), and "
                    "scatter them back")
    ck.done("Your repetition penalty matches course_lib's penalize_repetition.")


def reference_beam_step(beam_scores: Tensor, log_probs: Tensor, num_beams: int) -> tuple[Tensor, Tensor, Tensor]:
    vocab_size = log_probs.shape[-1]
    scores, index = (beam_scores[:, None] + log_probs).flatten().topk(num_beams)
    return scores, index // vocab_size, index % vocab_size


@isolated_rng
def check_beam_step(learner_impl) -> None:
    """Check `learner_impl(beam_scores, log_probs, num_beams)`, one step of beam search from notebook 11.

    beam_scores: (beams,) summed log-probabilities; log_probs: (beams, vocab_size). Must return (scores, beam,
    token), three tensors of num_beams entries, best first: the num_beams best candidates over all beams, scored
    beam_scores[beam] + log_probs[beam, token]."""
    ck = Checker("check_beam_step")
    require_function(ck, learner_impl, "my_beam_step(beam_scores, log_probs, num_beams)")
    good, flat, peaked = (-0.01 * torch.arange(10.0) for _ in range(3))  # no ties
    good[0], good[1] = 2.0, 1.9  # the good beam has two likely next tokens
    peaked[3] = 8.0  # a poor beam that is very sure of its next token
    designed = (torch.tensor([-0.1, -5.0, -6.0]),  # one good beam, two poor ones
                torch.log_softmax(torch.stack([good, flat, peaked]), dim=-1))
    cases = [(*designed, 3)] + [(-torch.rand(beams) * 4, torch.log_softmax(torch.randn(beams, vocab) * 2, dim=-1),
                                 num_beams) for beams, vocab, num_beams in ((4, 7, 4), (2, 10, 3), (1, 12, 4))]
    for beam_scores, log_probs, num_beams in cases:
        beams, vocab = log_probs.shape
        situation = f"for {beams} beams of scores {[round(s, 2) for s in beam_scores.tolist()]} and a vocabulary of {vocab}"
        got = ck.call(f"my_beam_step with {beams} beams, vocabulary {vocab}, num_beams={num_beams}", learner_impl,
                      beam_scores.clone(), log_probs.clone(), num_beams)
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            ck.fail(f"{situation}, you returned {type(got).__name__}",
                    "return three tensors: (scores, beam index, token id), each of num_beams entries")
        scores, parent, token = reference_beam_step(beam_scores, log_probs, num_beams)
        as_triples = lambda s, b, t: sorted(zip(b.tolist(), t.tolist()))  # noqa: E731
        if all(isinstance(x, Tensor) for x in got) and as_triples(*got) == as_triples(scores, parent, token):
            compare(ck, got[0], scores, [], situation, "return the candidates best first (topk sorts them)")
            if not (torch.equal(got[1].long(), parent) and torch.equal(got[2].long(), token)):
                ck.fail(f"{situation}, you chose the right candidates in another order",
                        "return them best first, as topk does, with the scores in the same order")
            ck.ok()
            continue
        per_beam = log_probs.topk(1, dim=-1)
        variants = [
            ("the beams' scores are not added: a candidate's score is beam_scores[beam] + log_probs[beam, token], "
             "so a poor beam's tokens cannot win on their own probability",
             lambda: reference_beam_step(torch.zeros_like(beam_scores), log_probs, num_beams)),
            ("the best token of each beam is taken: choose the num_beams best candidates over ALL beams at once "
             "(flatten, then one topk), so a good beam can fill several places",
             lambda: (beam_scores + per_beam.values[:, 0], torch.arange(beams), per_beam.indices[:, 0])),
            ("the flat index is split with num_beams: for index i of the flattened (beams, vocab_size) scores, "
             "the beam is i // vocab_size and the token i % vocab_size",
             lambda: (scores, torch.div(parent * log_probs.shape[-1] + token, num_beams, rounding_mode="floor"),
                      (parent * log_probs.shape[-1] + token) % num_beams)),
            ("probabilities are multiplied with log-probabilities: log-probabilities add",
             lambda: reference_beam_step(torch.ones_like(beam_scores), log_probs * beam_scores[:, None], num_beams)),
        ]
        got_triples = as_triples(*got) if all(isinstance(x, Tensor) for x in got) else None
        bug = first_matching_bug(got_triples, variants, lambda mine, candidate: mine == as_triples(*candidate))
        ck.fail(f"{situation}, you chose the candidates (beam, token) {got_triples}, expected "
                f"{as_triples(scores, parent, token)}",
                bug or "add beam_scores[:, None] to log_probs, flatten, take topk(num_beams), then split each index "
                       "into beam (// vocab_size) and token (% vocab_size)")
    ck.done("Your beam step matches course_lib's beam_search.")

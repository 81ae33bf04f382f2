"""The checks of the exercises in notebooks/11_decoding.ipynb."""

import torch
from torch import Tensor

from course_lib.decoding import beam_search, min_p_filter, penalize_repetition

from .core import (Checker, check_decoded, check_unchanged, compare, decode_deterministically, first_matching_bug,
                   isolated_rng, random_model, require_function)
from .generation import check_logits_output, compare_filter


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


def banned_tokens(token_ids: Tensor, vocab_size: int, n: int, rule: str | None = None) -> Tensor:
    """(batch, vocab_size) True where a no-repeat n-gram ban under `rule` (None: the right one) bans a token."""
    banned = torch.zeros(token_ids.shape[0], vocab_size, dtype=torch.bool)
    for row, ids in enumerate(token_ids.tolist()):
        if rule == "row_zero":
            ids = token_ids[0].tolist()
        size = {"n_minus_one": n - 1, "n_plus_one": n + 1}.get(rule, n)
        if size < 1:
            continue
        if rule == "python_slice":
            prefix = tuple(ids[-(size - 1):])  # ids[-0:] is the whole row when n = 1
        elif rule == "first_tokens":
            prefix = tuple(ids[:size - 1])
        else:
            prefix = tuple(ids[len(ids) - size + 1:]) if size > 1 else ()
        last = len(ids) - size + (0 if rule == "skip_last" else 1)
        for i in range(max(last, 0)):
            gram = tuple(ids[i:i + size])
            if rule == "any_prefix" or gram[:-1] == prefix:
                banned[row, gram[-1]] = True
    return banned


NGRAM_BUGS = {  # rule of banned_tokens: the mistake it stands for
    "any_prefix": "every token that ends an n-gram of the history is banned, whatever precedes it: ban a token only "
                  "where the n-gram's first n - 1 tokens equal the row's last n - 1 tokens",
    "python_slice": "with n = 1 nothing is banned: ids[-(n - 1):] is ids[-0:], the whole row; take the last n - 1 "
                    "tokens as ids[len(ids) - n + 1:] (n = 1 bans every token already used)",
    "skip_last": "the row's last n-gram is never looked at: the n-grams start at 0 .. len(ids) - n, so "
                 "range(len(ids) - n + 1)",
    "first_tokens": "the n-grams are compared with the row's first n - 1 tokens: compare with its last n - 1 tokens, "
                    "the ones the next token would extend",
    "n_minus_one": "off by one: you ban (n - 1)-grams; an n-gram is n tokens, the last n - 1 of the row plus the "
                   "next one",
    "n_plus_one": "off by one: you ban (n + 1)-grams; an n-gram is n tokens, the last n - 1 of the row plus the "
                  "next one",
    "row_zero": "every row uses the history of row 0: ban with each row's own token_ids",
}


@isolated_rng
def check_no_repeat_ngram(learner_impl) -> None:
    """Check `learner_impl(logits, token_ids, n)`, the no-repeat n-gram ban of notebook 11.

    logits: (batch, vocab_size); token_ids: (batch, tokens), the sequences so far; n >= 1. Must return new logits
    with -inf for every token that would complete an n-gram already in its row (the row's last n - 1 tokens plus
    that token), the others unchanged, like course_lib.decoding.ban_repeated_ngrams (transformers'
    no_repeat_ngram_size)."""
    ck = Checker("check_no_repeat_ngram")
    require_function(ck, learner_impl, "my_ban_repeated_ngrams(logits, token_ids, n)")
    vocab = 8
    cases = [(torch.tensor([[1, 2, 3, 1, 2], [5, 2, 3, 1, 2]]), 3, "the rows [1, 2, 3, 1, 2] and [5, 2, 3, 1, 2]"),
             (torch.tensor([[1, 4, 4], [0, 1, 2]]), 2, "the rows [1, 4, 4] and [0, 1, 2]"),
             (torch.tensor([[3, 1, 3, 6]]), 1, "the row [3, 1, 3, 6]"),
             (torch.randint(0, 4, (3, 12)), 2, "random rows of 12 ids out of 4"),
             (torch.randint(0, 3, (2, 14)), 4, "random rows of 14 ids out of 3"),
             (torch.tensor([[2, 5]]), 3, "a row [2, 5] shorter than n")]
    with torch.no_grad():
        for token_ids, n, what in cases:
            logits = torch.randn(token_ids.shape[0], vocab, dtype=torch.float64)
            situation = f"for {what} and n={n}"
            before = logits.clone()
            got = ck.call(f"my_ban_repeated_ngrams on {what}, n={n}", learner_impl, logits, token_ids.clone(), n)
            check_unchanged(ck, before, logits, "n-gram ban")
            kept = check_logits_output(ck, got, logits, situation)
            expected = ~banned_tokens(token_ids, vocab, n)
            if torch.equal(kept, expected):
                ck.ok()
                continue
            bug = first_matching_bug(kept, [(bug, lambda rule=rule: ~banned_tokens(token_ids, vocab, n, rule))
                                            for rule, bug in NGRAM_BUGS.items()], torch.equal)
            ck.fail(f"{situation}, you ban {(~kept).nonzero().tolist()} (row, token), expected "
                    f"{(~expected).nonzero().tolist()}",
                    bug or "for each row, take its last n - 1 tokens; for every n-gram ids[i:i + n] of the row whose "
                    "first n - 1 tokens equal them, set the logit of its last token to -inf")
    ck.done("Your n-gram ban matches course_lib's ban_repeated_ngrams.")


def keep_min_p(logits: Tensor, min_p: float, rule: str | None = None) -> Tensor:
    """Which tokens a min-p filter keeps under one (correct or mistaken) rule."""
    probs = torch.softmax(logits, dim=0 if rule == "wrong_dim" else -1)
    top = probs.amax(dim=-1, keepdim=True)
    if rule == "logits":
        return ~(logits < min_p * logits.amax(dim=-1, keepdim=True))
    if rule == "absolute":
        return ~(probs < min_p)
    if rule == "batch_max":
        return ~(probs < min_p * probs.max())
    if rule == "less_equal":
        return ~(probs <= min_p * top)
    if rule == "reversed":
        return probs < min_p * top
    return ~(probs < min_p * top)


MIN_P_BUGS = {
    "less_equal": "<= drops the tokens exactly at the threshold (with min_p = 1 even the favourite itself): drop only "
                  "probs < min_p * top",
    "absolute": "the threshold is min_p itself: scale it by the top probability of the row, min_p * probs.amax(dim=-1, "
                "keepdim=True), so that it rises when the model is sure",
    "logits": "the logits are compared with min_p times the top logit: compare probabilities (softmax first), or "
              "in log space logits < log(min_p) + the top logit",
    "batch_max": "the top probability of the whole batch is used: take each row's own, amax(dim=-1, keepdim=True)",
    "reversed": "the comparison is reversed: you keep the unlikely tokens and drop the likely ones",
    "wrong_dim": "the softmax runs over the wrong dimension: softmax(logits, dim=-1), over the vocabulary",
}


@isolated_rng
def check_min_p(learner_impl) -> None:
    """Check `learner_impl(logits, min_p)`, min-p filtering from notebook 11.

    logits: a float tensor (..., vocab_size); 0 <= min_p <= 1. Must return the logits with -inf for every token
    whose probability is below min_p times the probability of the row's most likely token, the others unchanged,
    like course_lib.decoding.min_p_filter (transformers' min_p)."""
    ck = Checker("check_min_p")
    require_function(ck, learner_impl, "my_min_p(logits, min_p)")
    designed = torch.tensor([[4.0, 2.0, 1.0, 1.0, 0.5, 0.25], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]],
                            dtype=torch.float64).log()  # probabilities 1/2, 1/4, 1/8, 1/8, 1/16, 1/32 (scaled)
    cases = [(designed, 0.3, "the probabilities proportional to [4, 2, 1, 1, 0.5, 0.25] and a uniform row"),
             (2 * torch.randn(4, 20, dtype=torch.float64), 0.1, "random logits (4, 20)"),
             (torch.cat([6 * torch.randn(1, 20), 0.5 * torch.randn(1, 20)]).double(), 0.2,
              "a sure row and an unsure row (2, 20)"),
             (2 * torch.randn(2, 3, 20, dtype=torch.float64), 0.05, "random logits (2, 3, 20)"),
             (2 * torch.randn(3, 20, dtype=torch.float64), 1.0, "random logits (3, 20)"),
             (2 * torch.randn(3, 20, dtype=torch.float64), 0.0, "random logits (3, 20)")]
    compare_filter(ck, learner_impl, "my_min_p", "min_p", cases, min_p_filter,
                   lambda logits, min_p: [(bug, lambda rule=rule: keep_min_p(logits, min_p, rule))
                                          for rule, bug in MIN_P_BUGS.items()],
                   "min-p filter", "probs = softmax(logits, dim=-1); drop probs < min_p * probs.amax(dim=-1, keepdim=True)")
    ck.done("Your min-p filter matches course_lib's min_p_filter.")


def simple_beam_search(model, token_ids: Tensor, num_beams: int, max_new_tokens: int, rule: str | None = None):
    """Beam search written plainly (no cache, no end token), under one (correct or mistaken) rule: (1, prompt + new)."""
    prompt = token_ids[0].tolist()
    beams = [(0.0, [])]  # (summed log-probability, new ids)
    with torch.no_grad():
        for step in range(max_new_tokens):
            candidates = []
            for score, new in beams:
                logits = model(torch.tensor([prompt + new]))[0, -1].double()
                scores = {"logits": logits, "probs": torch.softmax(logits, -1)}.get(rule, torch.log_softmax(logits, -1))
                if rule == "per_beam" and step > 0:
                    candidates.append((score + scores.max().item(), new + [int(scores.argmax())]))
                    continue
                candidates += [((0.0 if rule == "no_sum" else score) + s, new + [t])
                               for t, s in enumerate(scores.tolist())]
            beams = sorted(candidates, key=lambda c: -c[0])[:num_beams]
    best = beams[-1] if rule == "worst" else beams[0]
    return torch.tensor([prompt + best[1]])


BEAM_SEARCH_BUGS = {
    "greedy": "only one beam runs: num_beams is ignored; keep the num_beams best candidates at every step",
    "no_sum": "the candidates are ranked by their last token's log-probability alone: add it to the beam's summed "
              "log-probability",
    "probs": "probabilities are added: sum log-probabilities (log_softmax), which multiplies the probabilities",
    "logits": "raw logits are summed: take log_softmax(logits) first, so that every step's scores are "
              "log-probabilities",
    "per_beam": "each beam is extended by its own best token only: at every step choose the num_beams best "
                "candidates over ALL beams and tokens, so a good beam can fill several places",
    "worst": "the worst of the final beams is returned: return the one with the highest summed log-probability",
}


def beam_tokens(ck: Checker, got, situation: str):
    if hasattr(got, "tokens") and not isinstance(got, Tensor):
        got = got.tokens
    if not isinstance(got, Tensor):
        ck.fail(f"{situation}, you returned a {type(got).__name__}",
                "return the best hypothesis as token ids (1, prompt + new): a tensor, or an object with .tokens")
    return got


@isolated_rng
def check_beam_search(learner_impl) -> None:
    """Check `learner_impl(model, token_ids, num_beams, max_new_tokens)`, a whole beam search from notebook 11.

    token_ids: one prompt (1, tokens). Must return the best hypothesis by summed log-probability, the prompt
    followed by max_new_tokens new ids (a tensor (1, prompt + new), or an object with .tokens such as
    BeamSearchResult), like course_lib.decoding.beam_search(model, token_ids, num_beams, max_new_tokens) with no
    end token. The model comes in training mode, as a freshly built one does."""
    ck = Checker("check_beam_search")
    require_function(ck, learner_impl, "my_beam_search(model, token_ids, num_beams, max_new_tokens)")
    model = random_model(drop_rate=0.3, context_length=8, vocab_size=20)
    cases = [((1, 3), 3, 5), ((1, 2), 2, 6), ((1, 4), 4, 3), ((1, 1), 1, 4)]
    runs = []  # (situation, prompt, max_new_tokens, the learner's ids, the reference's, each rule's)
    for shape, num_beams, max_new_tokens in cases:
        token_ids = torch.randint(0, 20, shape)
        situation = f"for a prompt of {shape[1]} tokens, num_beams={num_beams}, max_new_tokens={max_new_tokens}"
        got = decode_deterministically(
            ck, model, lambda: beam_tokens(ck, ck.call(f"my_beam_search {situation}", learner_impl, model,
                                                       token_ids.clone(), num_beams, max_new_tokens), situation),
            f"my_beam_search {situation}")
        expected = beam_search(model, token_ids, num_beams, max_new_tokens).tokens
        model.eval()
        ruled = {rule: simple_beam_search(model, token_ids, 1 if rule == "greedy" else num_beams, max_new_tokens, rule)
                 for rule in BEAM_SEARCH_BUGS}
        model.train()
        runs.append((situation, token_ids, max_new_tokens, got, expected, ruled))
    # Several mistakes can pick the same beam on one prompt: name the first one that explains every prompt.
    explains = {rule for rule in BEAM_SEARCH_BUGS
                if all(isinstance(got, Tensor) and got.shape == ruled[rule].shape and torch.equal(got.long(), ruled[rule])
                       for _, _, _, got, _, ruled in runs)}
    for situation, token_ids, max_new_tokens, got, expected, ruled in runs:
        variants = [(bug, lambda rule=rule: ruled[rule]) for rule, bug in BEAM_SEARCH_BUGS.items() if rule in explains]
        check_decoded(ck, got, expected, token_ids, max_new_tokens, variants, situation,
                      "at every step add each beam's summed log-probability to log_softmax of its next-token logits, "
                      "keep the num_beams best (beam, token) pairs over all beams, and return the best at the end")
    ck.done("Your beam search matches course_lib's beam_search.")

"""The checks of the exercises in notebooks/08_generation.ipynb."""

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from course_lib.generation import generate_text_simple, scale_logits, top_k_filter, top_p_filter

from .core import (Checker, check_decoded, check_unchanged, compare, decode_deterministically, first_matching_bug,
                   isolated_rng, random_model, require_function, table_variants)


def check_logits_output(ck: Checker, got, logits: Tensor, situation: str) -> Tensor:
    """Fail unless got is a tensor of logits' shape that keeps some logits and sets the others to -inf."""
    if not isinstance(got, Tensor) or tuple(got.shape) != tuple(logits.shape):
        ck.fail(f"{situation}, you returned "
                f"{'shape ' + str(tuple(got.shape)) if isinstance(got, Tensor) else type(got).__name__}, expected a "
                f"tensor of the logits' shape {tuple(logits.shape)}",
                "return the filtered logits themselves (same shape), not indices, values or probabilities")
    kept = got == logits
    removed = got == float("-inf")
    if not bool((kept | removed).all()):
        other = got[~(kept | removed)]
        if bool((other == 0).all()):
            ck.fail(f"{situation}, the filtered-out logits are 0",
                    "filtered logits set to 0 instead of -inf: exp(0) still gives them probability; use "
                    "masked_fill(..., float('-inf'))")
        if bool(((got >= 0) & (got <= 1)).all()):
            ck.fail(f"{situation}, your output looks like probabilities",
                    "return logits with the removed tokens set to -inf; the softmax comes afterwards")
        ck.fail(f"{situation}, some kept logits were changed (e.g. {other[0].item():.4g})",
                "keep the surviving logits exactly as they were and set the others to -inf")
    return ~removed  # True where kept


def fail_empty_rows(ck: Checker, kept: Tensor, situation: str) -> None:
    if not bool(kept.any(dim=-1).all()):
        ck.fail(f"{situation}, a row has no token left (every logit is -inf, so the softmax gives NaN)",
                "the most likely token must always survive")


def keep_top_p(logits: Tensor, p: float, rule: str) -> Tensor:
    """Which tokens a top-p filter keeps under one (correct or mistaken) rule."""
    probs = torch.softmax(logits, dim=-1)
    if rule == "unsorted":
        sorted_probs, order = probs, torch.arange(probs.shape[-1]).expand_as(probs)
    else:
        sorted_probs, order = probs.sort(dim=-1, descending=rule != "ascending", stable=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep_sorted = {"exclude_crossing": sorted_probs.cumsum(dim=-1) <= p,
                   "one_extra": mass_before - F.pad(sorted_probs, (1, 0))[..., :-1] < p}.get(rule, mass_before < p)
    if rule == "not_scattered":
        return keep_sorted
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


TOP_P_BUGS = {  # rule of keep_top_p: the mistake it stands for
    "exclude_crossing": "the token that crosses p is excluded: keep the smallest set whose probabilities reach p, "
                        "so keep a token while the mass before it is < p",
    "unsorted": "the probabilities are not sorted: sort them in descending order before the cumulative sum",
    "ascending": "the probabilities are sorted in ascending order: sort them descending (most likely first)",
    "not_scattered": "the mask is not mapped back to vocabulary order: the cumulative sum lives in sorted order, so "
                     "scatter the mask back with the sort's indices before applying it",
    "one_extra": "one token too many: the token that crosses p is the last one kept",
}


@isolated_rng
def check_temperature(learner_impl) -> None:
    """Check `learner_impl(logits, temperature)`, temperature scaling from notebook 08.

    logits: a float tensor (..., vocab_size) of raw scores; temperature > 0. Must return the scaled logits
    (not probabilities) of the same shape, like course_lib.generation.scale_logits: softmax of the result is
    the distribution to sample from. Logits that differ from the reference by a constant per row are accepted."""
    ck = Checker("check_temperature")
    require_function(ck, learner_impl, "my_scale_logits(logits, temperature)")
    with torch.no_grad():
        for logits, temperature in ((torch.randn(3, 10, dtype=torch.float64) * 2, 2.0),
                                    (torch.randn(3, 10, dtype=torch.float64) * 2, 0.5),
                                    (torch.randn(10, dtype=torch.float64) * 2, 1.0),
                                    (torch.randn(2, 4, 10, dtype=torch.float64) * 2, 0.7),
                                    (torch.randn(3, 10, dtype=torch.float64) * 2, 0.05)):  # near greedy
            situation = f"for logits of shape {tuple(logits.shape)} and temperature {temperature}"
            before = logits.clone()
            got = ck.call(f"my_scale_logits on logits {tuple(logits.shape)}, temperature={temperature}",
                          learner_impl, logits, temperature)
            check_unchanged(ck, before, logits, "temperature function")
            if not isinstance(got, Tensor):
                ck.fail(f"{situation}, you returned a {type(got).__name__}", "return a tensor of scaled logits")
            probs = F.softmax(logits / temperature, dim=-1)
            as_distribution = functools.partial(torch.softmax, dim=-1)
            variants = [
                ("the logits are multiplied by the temperature: divide them, logits / temperature (T > 1 must "
                 "flatten the distribution)", lambda: as_distribution(logits * temperature)),
                ("you return probabilities: return the scaled logits, logits / temperature; the softmax comes "
                 "later", lambda: as_distribution(probs)),
                ("temperature applied after softmax: you divided the probabilities by the temperature; divide the "
                 "logits before the softmax", lambda: as_distribution(F.softmax(logits, dim=-1) / temperature)),
                ("the temperature is ignored: return logits / temperature", lambda: as_distribution(logits)),
                ("the logits are divided by temperature squared: divide them once",
                 lambda: as_distribution(logits / temperature**2)),
                *[(f"the temperature is clamped to at least {floor}: divide by the temperature you are given, "
                   "however small (0 is refused earlier, by the caller)",
                   lambda floor=floor: as_distribution(logits / max(temperature, floor))) for floor in (0.1, 0.5)],
            ]
            compare(ck, as_distribution(got) if isinstance(got, Tensor) and got.is_floating_point() else got,
                    as_distribution(scale_logits(logits, temperature)), variants, situation + " (compared after "
                    "softmax)", "return logits / temperature")
    ck.done("Your temperature scaling matches course_lib's scale_logits.")


@isolated_rng
def check_top_k(learner_impl) -> None:
    """Check `learner_impl(logits, k)`, the top-k filter of notebook 08.

    logits: a float tensor (..., vocab_size); k: an int >= 1 (larger than the vocabulary keeps everything). Must
    return a tensor of the same shape that keeps the k largest logits of each row unchanged and sets the others
    to -inf, like course_lib.generation.top_k_filter: exactly k survive, also when logits tie at the border."""
    ck = Checker("check_top_k")
    require_function(ck, learner_impl, "my_top_k(logits, k)")
    cases = [(torch.randn(4, 12), 3), (torch.randn(4, 12), 1), (torch.randn(12), 5), (torch.randn(2, 3, 12), 4),
             (torch.randn(3, 12), 12), (torch.randn(3, 12), 20)]
    with torch.no_grad():
        for logits, k in cases:
            situation = f"for logits of shape {tuple(logits.shape)} and k={k}"
            before = logits.clone()
            crash = ("k larger than the vocabulary: keep every token, e.g. k = min(k, logits.shape[-1])"
                     if k > logits.shape[-1] else None)
            got = ck.call(f"my_top_k on logits {tuple(logits.shape)}, k={k}", learner_impl, logits, k, bug=crash)
            check_unchanged(ck, before, logits, "top-k filter")
            kept = check_logits_output(ck, got, logits, situation)
            expected = torch.isfinite(top_k_filter(logits, k))
            count = int(kept.sum(dim=-1).flatten()[0])
            if torch.equal(kept, expected):
                ck.ok()
                continue
            rows = logits.reshape(-1, logits.shape[-1])
            known = [
                ("keeps k - 1 tokens: the k-th largest logit must survive; drop only logits < the k-th largest "
                 "(not <=)", lambda: torch.isfinite(top_k_filter(logits, k - 1))),
                ("keeps k + 1 tokens: the threshold is the k-th largest logit, topk(...).values[..., -1] (index "
                 "k - 1, not k)", lambda: torch.isfinite(top_k_filter(logits, k + 1))),
                ("keeps the k smallest logits: use the largest, torch.topk(logits, k) (largest=True)",
                 lambda: torch.isfinite(-top_k_filter(-logits, k))),
                ("top-k over the whole batch: take the k largest of each row, along dim=-1",
                 lambda: torch.isfinite(top_k_filter(rows.flatten(), k)).reshape(logits.shape)),
                ("top-k along the wrong dimension (the batch): take the k largest along dim=-1",
                 lambda: torch.isfinite(top_k_filter(logits.transpose(0, -1), k)).transpose(0, -1)),
            ]
            bug = first_matching_bug(kept, known, torch.equal)
            if bug is not None:
                ck.fail(f"{situation}, you keep {count} token(s) per row where the reference keeps "
                        f"{int(expected.sum(dim=-1).flatten()[0])}, or not the same ones", bug)
            fail_empty_rows(ck, kept, situation)
            ck.fail(f"{situation}, you keep other tokens than the k largest of each row",
                    "torch.topk(logits, k).values[..., -1:] is each row's k-th largest logit; keep the logits >= it")
        # ties at the border: exactly k survive (which of the tied logits is free), as in top_k_filter
        tied, k = torch.tensor([[3.0, 1.0, 2.0, 2.0, 2.0, 0.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]]), 3
        situation = "for the rows [3, 1, 2, 2, 2, 0] and [2, 2, 2, 2, 2, 2] (ties at the border) and k=3"
        got = ck.call("my_top_k on tied logits, k=3", learner_impl, tied.clone(), k)
        kept = check_logits_output(ck, got, tied, situation)
        counts = kept.sum(dim=-1).tolist()
        if counts != [k, k]:
            ck.fail(f"{situation}, you keep {counts[0]} and {counts[1]} tokens",
                    "keeps more than k tokens when logits tie at the border: `logits < kth_largest` keeps every "
                    "tied logit; keep exactly k, e.g. scatter the values of torch.topk(logits, k) into a row of "
                    "-inf" if max(counts) > k else "keep exactly k tokens per row, ties included")
        if not bool(kept[0, 0]) or bool(kept[0, 1]) or bool(kept[0, 5]):
            ck.fail(f"{situation}, you keep other tokens than 3 and two of the 2s in the first row",
                    "keep the k largest logits; among equal logits at the border, any of them")
        ck.ok()
    ck.done("Your top-k filter matches course_lib's top_k_filter.")


def compare_filter(ck: Checker, learner_impl, name: str, setting: str, cases, reference, bug_variants,
                   what_filter: str, fix: str) -> None:
    """The comparison every logits filter (top-p, min-p) shares: for each case (logits, value, description) the
    learner's filter must leave its input alone, return logits, and keep exactly the tokens `reference(logits, value)`
    keeps; a mismatch is named by the first of `bug_variants(logits, value)` that explains it, else by `fix`."""
    with torch.no_grad():
        for logits, value, what in cases:
            situation = f"for {what} and {setting}={value}"
            before = logits.clone()
            got = ck.call(f"{name} on {what}, {setting}={value}", learner_impl, logits, value)
            check_unchanged(ck, before, logits, what_filter)
            kept = check_logits_output(ck, got, logits, situation)
            expected = torch.isfinite(reference(logits, value))
            if torch.equal(kept, expected):
                ck.ok()
                continue
            bug = first_matching_bug(kept, bug_variants(logits, value), torch.equal)
            if bug is None:
                fail_empty_rows(ck, kept, situation)
            ck.fail(f"{situation}, you keep {kept.sum(-1).flatten().tolist()} token(s) per row where the reference "
                    f"keeps {expected.sum(-1).flatten().tolist()}, or not the same ones", bug or fix)


@isolated_rng
def check_top_p(learner_impl) -> None:
    """Check `learner_impl(logits, p)`, the top-p (nucleus) filter of notebook 08.

    logits: a float tensor (..., vocab_size); 0 < p <= 1. Must return a tensor of the same shape that keeps the
    smallest set of most likely tokens whose probabilities add up to at least p (so the token that crosses p is
    kept, and the most likely token always is) and sets the other logits to -inf, like
    course_lib.generation.top_p_filter."""
    ck = Checker("check_top_p")
    require_function(ck, learner_impl, "my_top_p(logits, p)")
    designed = torch.tensor([0.07, 0.38, 0.11, 0.26, 0.18], dtype=torch.float64).log()  # sorted: .38 .26 .18 .11 .07
    cases = [(designed, 0.6, "the probabilities [0.07, 0.38, 0.11, 0.26, 0.18]"),
             (designed, 0.3, "the probabilities [0.07, 0.38, 0.11, 0.26, 0.18]"),
             (designed, 1.0, "the probabilities [0.07, 0.38, 0.11, 0.26, 0.18]"),
             (2 * torch.randn(4, 20, dtype=torch.float64), 0.9, "random logits (4, 20)"),
             (2 * torch.randn(2, 3, 20, dtype=torch.float64), 0.5, "random logits (2, 3, 20)")]
    compare_filter(ck, learner_impl, "my_top_p", "p", cases, top_p_filter,
                   lambda logits, p: table_variants(TOP_P_BUGS, functools.partial(keep_top_p, logits, p)),
                   "top-p filter", "sort the probabilities descending, take the cumulative sum, keep a token while the "
                   "mass before it is < p, and map the mask back to vocabulary order")
    ck.done("Your top-p filter matches course_lib's top_p_filter.")


def simple_greedy(model, token_ids: Tensor, max_new_tokens: int, context_length: int, rule: str | None = None):
    """Greedy decoding under one (correct or mistaken) rule, the model in eval mode: (batch, tokens + new)."""
    with torch.no_grad():
        for _ in range(max_new_tokens):
            window = token_ids[:, :context_length] if rule == "crop_first" else token_ids[:, -context_length:]
            logits = model(token_ids if rule == "no_crop" else window)
            next_id = logits[:, 0 if rule == "first_position" else -1].argmax(dim=-1, keepdim=True)
            token_ids = torch.cat([token_ids, next_id], dim=1)
    return token_ids


GREEDY_BUGS = {
    "first_position": "the next token is read from the first position's logits: the prediction for the next token "
                      "is at the last position, logits[:, -1, :]",
    "crop_first": "the window keeps the first context_length tokens: keep the last ones, token_ids[:, -context_length:]",
    "no_crop": "context_length is ignored: run the model on the last context_length tokens only, "
               "token_ids[:, -context_length:]",
}


@isolated_rng
def check_greedy_decoding(learner_impl, past_context: bool = True) -> None:
    """Check `learner_impl(model, token_ids, max_new_tokens, context_length)`, greedy decoding from notebook 08.

    token_ids: (batch, tokens). Must append, max_new_tokens times, the most likely next token (argmax of the last
    position's logits) to every row, running the model on at most the last context_length tokens, and return
    (batch, tokens + max_new_tokens), like course_lib.generation.generate_text_simple. The model comes in training
    mode, as a freshly built one does. past_context=False skips the cases where the sequence outgrows the window
    (for a variant such as notebook 08's generate_half_window, exact only inside it)."""
    ck = Checker("check_greedy_decoding")
    require_function(ck, learner_impl, "my_generate_greedy(model, token_ids, max_new_tokens, context_length)")
    model = random_model(drop_rate=0.3, context_length=8, vocab_size=20)
    cases = [((2, 3), 4, 8, "within the context"), ((1, 1), 5, 8, "from a one-token prompt")]
    if past_context:
        cases += [((2, 5), 6, 8, "past the model's context of 8"),
                  ((2, 4), 4, 3, "with context_length=3, shorter than the model's 8")]
    for shape, max_new_tokens, context_length, what in cases:
        token_ids = torch.randint(0, 20, shape)
        situation = f"for prompts {shape}, max_new_tokens={max_new_tokens}, context_length={context_length} ({what})"
        crash = ("the input outgrows the model's context: crop it to its last context_length tokens, "
                 "model(token_ids[:, -context_length:])") if shape[1] + max_new_tokens > 8 else None

        def run():
            got = ck.call(f"my_generate_greedy {situation}", learner_impl, model, token_ids.clone(), max_new_tokens,
                          context_length, bug=crash)
            if not isinstance(got, Tensor):
                ck.fail(f"{situation}, you returned a {type(got).__name__}",
                        "return the token ids as one tensor (batch, tokens + max_new_tokens)")
            return got

        got = decode_deterministically(ck, model, run, f"my_generate_greedy {situation}")
        expected = generate_text_simple(model, token_ids, max_new_tokens, context_length)
        model.eval()
        variants = [(bug, lambda rule=rule: simple_greedy(model, token_ids, max_new_tokens, context_length, rule))
                    for rule, bug in GREEDY_BUGS.items()]
        check_decoded(ck, got, expected, token_ids, max_new_tokens, variants, situation,
                      "at every step run the model on token_ids[:, -context_length:], take logits[:, -1, :]"
                      ".argmax(dim=-1, keepdim=True) and append it with torch.cat(..., dim=1)")
        model.train()
    ck.done("Your greedy decoding matches course_lib's generate_text_simple.")

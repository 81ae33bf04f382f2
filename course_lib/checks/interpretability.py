"""The checks of the exercises in notebooks/12_interpretability.ipynb."""

import torch

from course_lib.config import GPTConfig
from course_lib.interpretability import induction_score, logit_lens, run_with_cache
from course_lib.model import GPTModel

from .core import Checker, compare, isolated_rng, require_function


@isolated_rng
def check_induction_score(learner_impl) -> None:
    """Check `learner_impl(pattern, period)`, the induction score of notebook 12.

    pattern: (batch, heads, tokens, tokens) attention weights of sequences made of a block of `period` tokens
    repeated; must return (heads,): the mean, over the batch and the queries q = period .. tokens - 1, of the
    weight on key q - period + 1, like course_lib.interpretability.induction_score."""
    ck = Checker("check_induction_score")
    require_function(ck, learner_impl, "my_induction_score(pattern, period)")
    for batch, heads, period, tokens in ((2, 3, 5, 10), (4, 2, 4, 11), (1, 4, 6, 12)):
        pattern = torch.rand(batch, heads, tokens, tokens).tril().softmax(-1).tril()
        pattern = pattern / pattern.sum(-1, keepdim=True)  # causal rows that sum to 1
        situation = f"for patterns of shape {tuple(pattern.shape)} and period {period}"
        got = ck.call(f"my_induction_score on {situation}", learner_impl, pattern, period)
        queries = torch.arange(period, tokens)
        variants = [
            ("the weight on the earlier occurrence itself (key q - period): an induction head looks one token "
             "further, at the token that followed it, key q - period + 1",
             lambda: pattern[:, :, queries, queries - period].mean(dim=(0, 2))),
            ("the queries of the first copy are counted too: only q >= period can find an earlier occurrence",
             lambda: pattern.diagonal(offset=1 - period, dim1=-2, dim2=-1).mean(dim=(0, -1))),
            ("the heads are averaged together: return one score per head, shape (heads,)",
             lambda: induction_score(pattern, period).mean().expand(heads)),
            ("the batch is not averaged: average over the batch and the queries, keep the heads",
             lambda: pattern[0, :, queries, queries - period + 1].mean(dim=-1)),
        ]
        compare(ck, got, induction_score(pattern, period), variants, situation,
                "for queries q = period .. tokens - 1 take pattern[:, :, q, q - period + 1], then average over "
                "the batch and the queries")
    ck.done("Your induction score matches course_lib's induction_score.")


@isolated_rng
def check_logit_lens(learner_impl) -> None:
    """Check `learner_impl(model, cache, target_ids)`, the logit lens of notebook 12.

    Must return (1 + n_layers, batch, tokens): the probability of target_ids read from cache['embed'] and from
    each cache['blocks.i.resid_post'] through model.final_norm and model.out_head, like the first output of
    course_lib.interpretability.logit_lens."""
    ck = Checker("check_logit_lens")
    require_function(ck, learner_impl, "my_logit_lens(model, cache, target_ids)")
    model = GPTModel(GPTConfig(vocab_size=23, context_length=12, emb_dim=16, n_heads=2, n_layers=3,
                               drop_rate=0.0)).eval()
    with torch.no_grad():  # a trained-looking final norm, so forgetting it shows
        model.final_norm.scale.uniform_(0.5, 2.0)
        model.final_norm.shift.normal_(0.0, 0.5)
    ids = torch.randint(0, 23, (2, 9))
    targets = torch.randint(0, 23, (2, 9))
    _, cache = run_with_cache(model, ids)
    situation = "for a random 3-block model, 2 sequences of 9 tokens"
    got = ck.call(f"my_logit_lens {situation}", learner_impl, model, cache, targets)
    stages = ["embed"] + [f"blocks.{i}.resid_post" for i in range(3)]

    def read(names, through_norm=True, pick=lambda p: p.gather(-1, targets[..., None])[..., 0]):
        with torch.no_grad():
            return torch.stack([pick(model.out_head(model.final_norm(cache[n]) if through_norm else cache[n])
                                     .softmax(-1)) for n in names])
    variants = [
        ("final_norm is skipped: the model reads its stream through final_norm and then out_head, and so must the "
         "lens", lambda: read(stages, through_norm=False)),
        ("the stages are the inputs of the blocks (resid_pre): the first stage is 'embed', then each block's "
         "resid_post, so the last stage is the model's own prediction",
         lambda: read(["embed"] + [f"blocks.{i}.resid_pre" for i in range(3)])),
        ("the embeddings are left out: the first stage is cache['embed'], before any block",
         lambda: read(stages[1:])),
        ("the probability of the most likely token is returned: pick the probability of target_ids",
         lambda: read(stages, pick=lambda p: p.max(-1).values)),
    ]
    compare(ck, got, logit_lens(model, cache, targets)[0], variants, situation,
            "for each stage, softmax(out_head(final_norm(cache[name]))) and gather target_ids")
    ck.done("Your logit lens matches course_lib's logit_lens.")

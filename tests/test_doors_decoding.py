"""Issue 30, notebook 11: every public door of course_lib.decoding called the way a user who has not read the code
might call it. Each case is the call and what must come out: ("error", type, a fragment of our message naming the
argument) or ("result", check) for an input that legitimately works, the check proving the result right ("meta"
stands in for a GPU: the processors run in the decoding loop, where they must read no value).
`outcome` sorts a run into clear / correct (passes) and unclear / silent (a deep error, or a wrong answer)."""

import pytest
import torch

from course_lib.config import GPTConfig
from course_lib.decoding import (BeamSearchResult, accept_drafts, ban_repeated_ngrams, beam_search, best_extensions,
                                 choose_token, distinct_n, draft_logits, draw, generate_tokens, left_pad, min_p_filter,
                                 next_token_probs, ngrams, penalize, penalize_frequency,
                                 penalize_repetition, repeated_ngram_share, search_is_over,
                                 speculative_generate, stream_text, stream_tokens)
from course_lib.doors import decoding as door
from course_lib.generation import warp_logits
from course_lib.model import GPTModel, padding_may_attend, positions_after_padding
from course_lib.tokenization import CharTokenizer

from doors import door_tests, error, report, result

V = 11  # vocabulary of the tiny models
torch.manual_seed(0)
MODEL = GPTModel(GPTConfig(vocab_size=V, context_length=16, emb_dim=8, n_heads=2, n_layers=1, drop_rate=0.0)).eval()
DRAFT = GPTModel(GPTConfig(vocab_size=V, context_length=8, emb_dim=8, n_heads=1, n_layers=1, drop_rate=0.0)).eval()
OTHER_VOCAB = GPTModel(GPTConfig(vocab_size=7, context_length=8, emb_dim=8, n_heads=1, n_layers=1)).eval()
ON_META = GPTModel(GPTConfig(vocab_size=V, context_length=8, emb_dim=8, n_heads=1, n_layers=1)).to("meta")
TOKENIZER = CharTokenizer("abcdefghijk")  # 11 characters, ids 0..10
IDS = torch.tensor([[1, 2, 3, 1, 2]])
LOGITS = torch.tensor([[1.0, -1.0, 2.0, 0.0, 3.0]])  # (1, 5)
HISTORY = torch.tensor([[0, 1]])


def same(a, b):
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b)


CASES = {
    # the n-gram measures
    "ngrams list": (lambda: ngrams([1, 2, 3, 2], 2), result(lambda r: r == [(1, 2), (2, 3), (3, 2)])),
    "ngrams 1-D tensor": (lambda: ngrams(torch.tensor([1, 2, 3]), 2), result(lambda r: r == [(1, 2), (2, 3)])),
    "ngrams n=0": (lambda: ngrams([1, 2], 0), error(ValueError, "n must be >= 1")),
    "ngrams n float": (lambda: ngrams([1, 2], 2.0), error(TypeError, "n must be an int")),
    "ngrams None": (lambda: ngrams(None, 2), error(TypeError, "ids")),
    "ngrams 2-D tensor": (lambda: ngrams(torch.tensor([[1, 2, 3]]), 2), error(TypeError, "ids")),
    "distinct_n list": (lambda: distinct_n([1, 2, 3, 1, 2, 3], 2), result(lambda r: r == 0.6)),
    "distinct_n tensor": (lambda: distinct_n(torch.tensor([1, 2, 3, 1, 2, 3]), 2), result(lambda r: r == 0.6)),
    "distinct_n empty": (lambda: distinct_n([], 2), result(lambda r: r == 1.0)),
    "distinct_n list of lists": (lambda: distinct_n([[1, 2], [1, 2]], 1), error(TypeError, "ids")),
    "distinct_n float tensor": (lambda: distinct_n(torch.tensor([1.0, 2.0]), 1), error(TypeError, "ids")),
    "repeated share tensor": (lambda: repeated_ngram_share(torch.tensor([1, 2, 1, 2, 1, 2]), 2),
                              result(lambda r: r == 0.6)),
    "repeated share n=-1": (lambda: repeated_ngram_share([1, 2], -1), error(ValueError, "n must be >= 1")),
    # the processors and their history
    "door.history list": (lambda: door.history([[0, 1]], LOGITS), error(TypeError, "token_ids")),
    "door.history 1-D": (lambda: door.history(torch.tensor([0, 1]), LOGITS), error(ValueError, "token_ids must be")),
    "repetition by hand": (lambda: penalize_repetition(LOGITS, HISTORY, 2.0),
                           result(lambda r: same(r, torch.tensor([[0.5, -2.0, 2.0, 0.0, 3.0]])))),
    "repetition empty history": (lambda: penalize_repetition(LOGITS, torch.zeros(1, 0, dtype=torch.long), 2.0),
                                 result(lambda r: same(r, LOGITS))),
    "repetition id = vocab": (lambda: penalize_repetition(LOGITS, torch.tensor([[5]]), 2.0),
                              error(ValueError, "token_ids")),
    "repetition id -1": (lambda: penalize_repetition(LOGITS, torch.tensor([[-1]]), 2.0), error(ValueError, "token_ids")),
    "repetition float ids": (lambda: penalize_repetition(LOGITS, torch.tensor([[1.0]]), 2.0),
                             error(TypeError, "token_ids")),
    "repetition penalty NaN": (lambda: penalize_repetition(LOGITS, HISTORY, float("nan")), error(ValueError, "penalty")),
    "repetition penalty bool": (lambda: penalize_repetition(LOGITS, HISTORY, True), error(TypeError, "penalty")),
    "repetition int logits": (lambda: penalize_repetition(torch.tensor([[1, 2, 3]]), HISTORY, 2.0),
                              error(TypeError, "logits")),
    "repetition 1-D logits": (lambda: penalize_repetition(LOGITS[0], HISTORY, 2.0), error(ValueError, "logits")),
    "ban by hand": (lambda: torch.isinf(ban_repeated_ngrams(torch.zeros(1, 5), torch.tensor([[1, 2, 3, 1, 2]]), 3)),
                    result(lambda r: r[0].nonzero()[:, 0].tolist() == [3])),
    "ban -1 pad": (lambda: ban_repeated_ngrams(torch.zeros(1, 5), torch.tensor([[-1, -1, 2, -1]]), 2),
                   error(ValueError, "token_ids")),
    "ban id = vocab": (lambda: ban_repeated_ngrams(torch.zeros(1, 5), torch.tensor([[7, 7]]), 1),
                       error(ValueError, "token_ids")),
    "ban float ids": (lambda: ban_repeated_ngrams(torch.zeros(1, 5), torch.tensor([[1.0, 1.0]]), 1),
                      error(TypeError, "token_ids")),
    "ban n=0": (lambda: ban_repeated_ngrams(torch.zeros(1, 5), HISTORY, 0), error(ValueError, "n must be >= 1")),
    "frequency by hand": (lambda: penalize_frequency(torch.zeros(1, 5), torch.tensor([[1, 1, 3]]), 0.5, 1.0),
                          result(lambda r: same(r, torch.tensor([[0.0, -2.0, 0.0, -1.5, 0.0]])))),
    "frequency id = vocab": (lambda: penalize_frequency(torch.zeros(1, 5), torch.tensor([[5]]), 0.5),
                             error(ValueError, "token_ids")),
    "frequency id -1": (lambda: penalize_frequency(torch.zeros(1, 5), torch.tensor([[-1]]), 0.5),
                        error(ValueError, "token_ids")),
    "frequency 3": (lambda: penalize_frequency(torch.zeros(1, 5), HISTORY, 3.0), error(ValueError, "frequency")),
    "frequency list ids": (lambda: penalize_frequency(torch.zeros(1, 5), [[1]], 0.5), error(TypeError, "token_ids")),
    "min_p by hand": (lambda: torch.isinf(min_p_filter(torch.tensor([[0.0, -10.0, 0.0]]), 0.5)),
                      result(lambda r: r.tolist() == [[False, True, False]])),
    "min_p int logits": (lambda: min_p_filter(torch.tensor([[1, 2]]), 0.1), error(TypeError, "logits")),
    "min_p list logits": (lambda: min_p_filter([[1.0, 2.0]], 0.1), error(TypeError, "logits")),
    "min_p 1.5": (lambda: min_p_filter(LOGITS, 1.5), error(ValueError, "min_p")),
    "door.decoding_args NaN": (lambda: door.decoding_args(float("nan"), 1.0, 0, 0.0, 0.0), error(ValueError, "min_p")),
    "door.decoding_args size bool": (lambda: door.decoding_args(None, 1.0, True, 0.0, 0.0),
                                      error(TypeError, "no_repeat_ngram_size")),
    "penalize off": (lambda: penalize(LOGITS, HISTORY, 1, 1.0, 0, 0.0, 0.0), result(lambda r: same(r, LOGITS))),
    "penalize prompt_len -1": (lambda: penalize(torch.zeros(1, 5), torch.tensor([[1, 2, 2]]), -1, 1.0, 0, 1.0, 0.0),
                               error(ValueError, "prompt_len")),
    "penalize prompt_len float": (lambda: penalize(torch.zeros(1, 5), HISTORY, 1.0, 1.0, 0, 1.0, 0.0),
                                  error(TypeError, "prompt_len")),
    "penalize prompt_len too long": (lambda: penalize(torch.zeros(1, 5), HISTORY, 3, 1.0, 0, 1.0, 0.0),
                                     error(ValueError, "prompt_len")),
    "penalize on meta reads no value": (lambda: penalize(torch.zeros(2, 5, device="meta"), torch.zeros(
        2, 3, dtype=torch.long, device="meta"), 1, 1.2, 0, 0.5, 0.5), result(lambda r: r.device.type == "meta")),
    "warp on meta reads no value": (lambda: min_p_filter(warp_logits(torch.zeros(2, 5, device="meta"), 0.8, 3, 0.9), 0.05),
                                    result(lambda r: r.shape == (2, 5) and r.device.type == "meta")),
    "warp top_k": (lambda: torch.isinf(warp_logits(LOGITS, 1.0, top_k=2)),
                   result(lambda r: r.tolist() == [[True, True, False, True, False]])),
    "warp temperature 0": (lambda: warp_logits(LOGITS, 0.0), error(ValueError, "temperature")),
    "warp 1e-45": (lambda: warp_logits(LOGITS, 1e-45), error(ValueError, "temperature must be at least")),
    "warp float16 1e-5": (lambda: warp_logits(LOGITS.half(), 1e-5, top_k=2),
                          result(lambda r: r.dtype == torch.float32 and r[0, 4] == 3e5 and r[0, 2] == 2e5)),
    "warp top_k 0": (lambda: warp_logits(LOGITS, 1.0, top_k=0), error(ValueError, "top_k must be >= 1")),
    "warp list logits": (lambda: warp_logits([[1.0, 2.0]], 1.0), error(TypeError, "logits")),
    "choose greedy": (lambda: choose_token(LOGITS, 0.0, None, None, None, None), result(lambda r: r.tolist() == [[4]])),
    "choose 1-D logits": (lambda: choose_token(LOGITS[0], 1.0, None, None, None, None), error(ValueError, "logits")),
    "choose min_p 2": (lambda: choose_token(LOGITS, 1.0, None, None, 2.0, None), error(ValueError, "min_p")),
    "choose list logits": (lambda: choose_token([[1.0, 2.0]], 0.0, None, None, None, None), error(TypeError, "logits")),
    "next_token_probs greedy": (lambda: next_token_probs(LOGITS, 0.0, None, None),
                                result(lambda r: r.tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0]])),
    "next_token_probs list": (lambda: next_token_probs([[1.0]], 1.0, None, None), error(TypeError, "logits")),
    # generation
    "generate zero new": (lambda: generate_tokens(MODEL, IDS, 0), result(lambda r: torch.equal(r, IDS))),
    "generate with all knobs": (lambda: generate_tokens(MODEL, IDS, 4, temperature=1.0, top_k=5, min_p=0.05,
                                                        repetition_penalty=1.2, no_repeat_ngram_size=2,
                                                        frequency_penalty=0.5, generator=torch.Generator()),
                                result(lambda r: r.shape == (1, 9) and torch.equal(r[:, :5], IDS))),
    "generate list prompt": (lambda: generate_tokens(MODEL, [[1, 2]], 3), error(TypeError, "token_ids")),
    "generate 1-D prompt": (lambda: generate_tokens(MODEL, IDS[0], 3), error(ValueError, "token_ids")),
    "generate id = vocab": (lambda: generate_tokens(MODEL, torch.tensor([[V]]), 3), error(ValueError, "token_ids")),
    "generate min_p inf": (lambda: generate_tokens(MODEL, IDS, 3, min_p=float("inf")), error(ValueError, "min_p")),
    "generate generator str": (lambda: generate_tokens(MODEL, IDS, 3, temperature=1.0, generator="seed"),
                               error(TypeError, "generator")),
    "generate unknown keyword": (lambda: generate_tokens(MODEL, IDS, 3, top_n=3), error(TypeError, "top_n")),
    "generate two unknown keywords": (lambda: generate_tokens(MODEL, IDS, 3, temprature=0.7, top_n=3),
                                      error(TypeError, "generate_tokens got an unknown setting 'temprature'")),
    "generate temperature 1e-45": (lambda: generate_tokens(MODEL, IDS, 3, temperature=1e-45),
                                   error(ValueError, "temperature must be at least")),
    "generate mask list": (lambda: generate_tokens(MODEL, IDS, 3, attention_mask=[[1] * 5]),
                           error(TypeError, "attention_mask")),
    "stream not a model": (lambda: next(stream_tokens("model", IDS, 3)), error(TypeError, "model")),
    "stream mask float": (lambda: next(stream_tokens(MODEL, IDS, 3, attention_mask=torch.ones(1, 5))),
                          error(TypeError, "attention_mask")),
    "stream_text by hand": (lambda: "".join(stream_text(MODEL, TOKENIZER, "abc", 3)),
                            result(lambda r: isinstance(r, str) and len(r) == 3)),
    "stream_text empty prompt": (lambda: next(stream_text(MODEL, TOKENIZER, "", 3)), error(ValueError, "prompt")),
    "stream_text unknown keyword": (lambda: next(stream_text(MODEL, TOKENIZER, "abc", 3, top_n=3)),
                                    error(TypeError, "stream_text got an unknown setting 'top_n'")),
    "stream_text no tokenizer": (lambda: next(stream_text(MODEL, None, "abc", 3)), error(TypeError, "tokenizer")),
    # beam search
    "beam one beam is greedy": (lambda: beam_search(MODEL, IDS, 1, 3).tokens,
                                result(lambda r: torch.equal(r, generate_tokens(MODEL, IDS, 3)))),
    "beam more beams than tokens": (lambda: beam_search(MODEL, IDS, 20, 3).tokens, result(lambda r: r.shape == (1, 8))),
    "beam length_penalty NaN": (lambda: beam_search(MODEL, IDS, 2, 3, length_penalty=float("nan")),
                                error(ValueError, "length_penalty")),
    # issue 41: length_penalty=inf divided every score to -0.0, and the choice among them was arbitrary
    "beam length_penalty inf": (lambda: beam_search(MODEL, IDS, 2, 3, length_penalty=float("inf")),
                                error(ValueError, "length_penalty must be in (-inf, inf), got inf")),
    "beam length_penalty -inf": (lambda: beam_search(MODEL, IDS, 2, 3, length_penalty=-float("inf")),
                                 error(ValueError, "length_penalty must be in (-inf, inf), got -inf")),
    "beam length_penalty 100": (lambda: beam_search(MODEL, IDS, 2, 3, length_penalty=100),
                                error(ValueError, "length_penalty 100 is too large for max_new_tokens 3")),
    "beam length_penalty -100": (lambda: beam_search(MODEL, IDS, 2, 3, length_penalty=-100.0),
                                 error(ValueError, "length_penalty -100 is too large for max_new_tokens 3")),
    "beam length_penalty 60 for one token": (lambda: beam_search(MODEL, IDS, 2, 1, length_penalty=60).tokens,
                                             result(lambda r: r.shape == (1, 6))),
    "beam length_penalty 2.5 scores distinct": (lambda: beam_search(MODEL, IDS, 3, 4, length_penalty=2.5).finished,
                                                result(lambda r: len({score for score, _ in r}) == len(r) == 3)),
    "search_is_over length_penalty inf": (lambda: search_is_over(torch.tensor(-1.0), -5.0, 1, 5, float("inf"), False),
                                          error(ValueError, "length_penalty")),
    "beam early_stopping str": (lambda: beam_search(MODEL, IDS, 2, 3, early_stopping="yes"),
                                error(ValueError, "early_stopping")),
    "beam 1-D prompt": (lambda: beam_search(MODEL, IDS[0], 2, 3), error(ValueError, "token_ids")),
    "best_extensions by hand": (lambda: best_extensions(torch.zeros(1), torch.tensor([[0.0, 1.0, 2.0]]), 2)[2],
                                result(lambda r: r == [2, 1])),
    "best_extensions scores of other beams": (lambda: best_extensions(torch.zeros(3), LOGITS, 2),
                                              error(ValueError, "scores")),
    "best_extensions k=-1": (lambda: best_extensions(torch.zeros(1), LOGITS, -1), error(ValueError, "k must be")),
    "search_is_over early_stopping str": (lambda: search_is_over(torch.tensor(-1.0), -5.0, 1, 5, 1.0, "yes"),
                                          error(ValueError, "early_stopping")),
    "search_is_over by hand": (lambda: search_is_over(torch.tensor(-10.0), -1.0, 1, 5, 1.0, False),
                               result(lambda r: r is True)),
    "BeamSearchResult": (lambda: BeamSearchResult(IDS, -1.0, [], []).score, result(lambda r: r == -1.0)),
    # padded batches
    "left_pad by hand": (lambda: left_pad([[5, 6], [7]], 0), result(lambda r: r[0].tolist() == [[5, 6], [0, 7]]
                                                                     and r[1].tolist() == [[1, 1], [0, 1]])),
    "left_pad device gpu": (lambda: left_pad([[1]], 0, device="gpu"), error(ValueError, "device")),
    "left_pad pad_id float": (lambda: left_pad([[1]], 0.0), error(TypeError, "pad_id")),
    "positions by hand": (lambda: positions_after_padding(torch.tensor([[0, 1, 1]]), 2),
                          result(lambda r: r.tolist() == [[0, 1]])),
    "positions tokens too many": (lambda: positions_after_padding(torch.tensor([[1, 1, 1]]), 5),
                                  error(ValueError, "tokens")),
    "positions tokens float": (lambda: positions_after_padding(torch.tensor([[1, 1, 1]]), 2.0),
                               error(TypeError, "tokens")),
    "positions list mask": (lambda: positions_after_padding([[1, 1]], 1), error(TypeError, "attention_mask")),
    "may_attend by hand": (lambda: padding_may_attend(torch.tensor([[0, 1]]), 2),
                           result(lambda r: r.tolist() == [[[[True, False], [False, True]]]])),
    "may_attend tokens too many": (lambda: padding_may_attend(torch.tensor([[1, 1]]), 3), error(ValueError, "tokens")),
    "forward mask of 2s": (lambda: MODEL(IDS, attention_mask=torch.full((1, 5), 2)), error(ValueError, "attention_mask")),
    # speculative decoding
    "draw by hand": (lambda: draw(torch.tensor([0.0, 1.0, 0.0]), None), result(lambda r: r == 1)),
    "draw list": (lambda: draw([0.0, 1.0], None), error(TypeError, "probs")),
    "draft_logits by hand": (lambda: draft_logits(DRAFT, DRAFT.new_kv_caches(), [1, 2, 3]),
                             result(lambda r: same(r, DRAFT(torch.tensor([[1, 2, 3]]))[:, -1].detach()))),
    "accept_drafts by hand": (lambda: accept_drafts([1], [torch.tensor([0.0, 1.0])], torch.tensor([[0.0, 1.0],
                                                                                                    [1.0, 0.0]]), None),
                              result(lambda r: r == (1, 0))),
    "accept_drafts q too short": (lambda: accept_drafts([1, 1], [torch.tensor([0.0, 1.0])], torch.ones(3, 2) / 2, None),
                                  error(ValueError, "q")),
    "speculative greedy": (lambda: speculative_generate(MODEL, DRAFT, IDS, 4).tokens,
                           result(lambda r: torch.equal(r, generate_tokens(MODEL, IDS, 4)))),
    "speculative draft of another vocabulary": (lambda: speculative_generate(MODEL, OTHER_VOCAB, IDS, 4),
                                                error(ValueError, "draft")),
    "speculative draft on meta": (lambda: speculative_generate(MODEL, ON_META, IDS, 4), error(ValueError, "draft")),
    "speculative draft str": (lambda: speculative_generate(MODEL, "draft", IDS, 4), error(TypeError, "draft")),
    "speculative num_draft 0": (lambda: speculative_generate(MODEL, DRAFT, IDS, 4, num_draft=0),
                                error(ValueError, "num_draft")),
    "speculative temperature 1e-45": (lambda: speculative_generate(MODEL, DRAFT, IDS, 4, temperature=1e-45),
                                      error(ValueError, "temperature must be at least")),
    "speculative generator str": (lambda: speculative_generate(MODEL, DRAFT, IDS, 4, temperature=1.0, generator="x"),
                                  error(TypeError, "generator")),
}


def test_processors_leave_logits_and_history_alone_when_they_refuse():
    logits, history = LOGITS.clone(), torch.tensor([[0, 7]])
    for process in (lambda: penalize_repetition(logits, history, 2.0), lambda: ban_repeated_ngrams(logits, history, 1),
                    lambda: penalize_frequency(logits, history, 0.5)):
        with pytest.raises(ValueError):
            process()
    assert torch.equal(logits, LOGITS) and history.tolist() == [[0, 7]]


test_door = door_tests(CASES)


if __name__ == "__main__":  # the counts of issue 30's closing note
    report(CASES)

"""Issue 41: every public function of course_lib.alignment (notebook 15), called the way a user who has not read the
code might. One table of cases: ("error", type, fragment of our message naming the argument) or ("result", check).
A refusal of a training function (train_dpo, grpo_step) must leave the policy as it was: its parameters and its
mode. `python tests/test_doors_alignment.py` prints how many cases are clear errors, correct results, unclear errors
(an error that does not name the argument) and silent wrong answers.

A tiny chat model (one block, a character vocabulary with the chat tokens, LoRA on the attention's query and value)
stands in for notebook 14's, so that every case runs in a moment; load_aligned loads the shipped one."""

import math
import warnings

import torch

from course_lib.alignment import (
    GRPO_LOSS_TYPES, dpo_loss, frozen_copy, group_advantages, grpo_loss, grpo_step, k3_kl, kl_to_reference,
    load_aligned, pair_logprobs, policy_copy, preference_pairs, reply_finished, response_batch, rollout,
    sample_group, score_policy, sequence_logprobs, stack_rows, token_logprobs, train_dpo,
)
from course_lib.config import GPTConfig
from course_lib.finetuning import ChatTokenizer, apply_lora
from course_lib.model import GPTModel
from course_lib.tokenization import CharTokenizer

from doors import door_tests, report

CHARS = CharTokenizer(sorted(set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ:.,!?' \n")))
TOK = ChatTokenizer(CHARS)
CFG = GPTConfig(vocab_size=TOK.vocab_size, context_length=48, emb_dim=16, n_heads=2, n_layers=1, drop_rate=0.0,
                qkv_bias=False)
EXAMPLES = [
    {"task": "last_word", "instruction": "Last word, in capitals:\nHo, Cd!", "response": "CD"},
    {"task": "continue", "instruction": "Speak as AB.", "response": "AB:\nHo!"},
]
PAIRS = [{**EXAMPLES[0], "chosen": "CD", "rejected": "AB"}, {**EXAMPLES[1], "chosen": "AB:\nHo!", "rejected": "Ho"}]
EXCHANGES = [("Last word, in capitals:\nIs it day?", "DAY"), ("Upper case:\nhi", "HI")]


def model(lora: bool = True) -> GPTModel:
    torch.manual_seed(0)
    m = GPTModel(CFG).eval()
    if lora:
        apply_lora(m, ["W_query", "W_value"], 2, 4.0)
        with torch.no_grad():  # lora_B starts at 0: give it values, so that the policy differs from a bare model
            for name, p in m.named_parameters():
                if name.endswith("lora_B"):
                    p.normal_(0, 0.1)
    return m


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def group(size: int = 3, new: int = 6):
    return sample_group(model(), TOK, EXAMPLES[1]["instruction"], size, gen(), new)


def batch():
    return response_batch(TOK, EXCHANGES, CFG.context_length)


def sampled_ok(result, size=3, new=6) -> bool:
    ids, mask, replies = result
    n = len(TOK.encode("<|user|>Speak as AB.<|assistant|>"))
    return (ids.shape[0] == mask.shape[0] == len(replies) == size and n < ids.shape[1] <= n + new
            and not mask[:, :n].any() and mask[:, n].all() and all(isinstance(r, str) for r in replies))


def state(m: torch.nn.Module) -> tuple:
    return m.training, {k: v.clone() for k, v in m.state_dict().items()}


def unchanged(m: torch.nn.Module, before: tuple) -> bool:
    return m.training == before[0] and all(torch.equal(before[1][k], v) for k, v in m.state_dict().items())


def train_dpo_refused(**overrides):
    "train_dpo with a bad argument: the error, and the policy as it was (parameters and mode)."
    policy, reference = policy_copy(model()).train(), frozen_copy(model())
    before = state(policy)
    args = dict(policy=policy, reference=reference, tokenizer=TOK, pairs=PAIRS, beta=0.1, lr=1e-2, epochs=1)
    args.update(overrides)
    try:
        return train_dpo(**args)
    except Exception:
        assert unchanged(policy, before), "a refused train_dpo changed the policy"
        raise


def grpo_step_refused(**overrides):
    "grpo_step with a bad argument: the error, and the policy as it was (parameters and mode), nothing sampled."
    policy, reference = policy_copy(model()).train(), frozen_copy(model())
    before, generator = state(policy), gen()
    generator_before = generator.get_state()
    args = dict(policy=policy, reference=reference, tokenizer=TOK, examples=EXAMPLES,
                optimizer=torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2),
                group_size=2, generator=generator, max_new_tokens=4)
    args.update(overrides)
    try:
        return grpo_step(**args)
    except Exception:
        assert unchanged(policy, before), "a refused grpo_step changed the policy"
        assert torch.equal(generator.get_state(), generator_before), "a refused grpo_step sampled"
        raise


def dpo_ok(beta=0.1):
    pc, pr, rc, rr = torch.tensor([-3.0, -5.0]), torch.tensor([-4.0, -2.0]), torch.tensor([-3.5, -4.0]), \
        torch.tensor([-3.0, -3.0])
    loss, chosen, rejected = dpo_loss(pc, pr, rc, rr, beta)
    want = -torch.nn.functional.logsigmoid(beta * ((pc - rc) - (pr - rr))).mean()
    return torch.allclose(loss, want) and torch.allclose(chosen, beta * (pc - rc)) and \
        torch.allclose(rejected, beta * (pr - rr))


X = torch.full((3,), -2.0)
LOGPS = -torch.rand(4, 6, generator=gen(1))
OLD = LOGPS + 0.1 * torch.randn(4, 6, generator=gen(2))
REF = LOGPS + 0.1 * torch.randn(4, 6, generator=gen(3))
ADV = torch.tensor([1.0, -1.0, 0.5, -0.5])
MASK = torch.ones(4, 6, dtype=torch.long)
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])


def grpo(*args, **kwargs):
    return grpo_loss(*(args or (LOGPS, OLD, REF, ADV, MASK, 0.04)), **kwargs)


def moved(name: str):
    "The old name imported from course_lib.alignment: a DeprecationWarning naming the new place, and the door."
    import course_lib.alignment as lesson
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = getattr(lesson, name)
    return found, [str(w.message) for w in caught if w.category is DeprecationWarning]


def advantages_ok(r):
    groups = REWARDS.view(-1, 4)
    return torch.allclose(r, ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).flatten())


def on_meta():
    return model().to("meta")


CASES = [
    # sample_group
    ("sample ok", group, "result", sampled_ok),
    ("sample reproducible", lambda: torch.equal(group()[0], group()[0]), "result", bool),
    ("sample model tuple", lambda: sample_group((model(), TOK), TOK, "Hi", 2), "error", TypeError, "model"),
    ("sample tokenizer chars", lambda: sample_group(model(), CHARS, "Hi", 2), "error", TypeError, "tokenizer"),
    ("sample instruction list", lambda: sample_group(model(), TOK, ["Hi"], 2), "error", TypeError, "instruction"),
    ("sample instruction dict", lambda: sample_group(model(), TOK, EXAMPLES[0], 2), "error", TypeError,
     "instruction"),
    ("sample instruction chat token", lambda: sample_group(model(), TOK, "Hi<|end|>", 2), "error", ValueError,
     "instruction"),
    ("sample instruction too long", lambda: sample_group(model(), TOK, "a" * 46, 2), "error", ValueError,
     "instruction takes 48 tokens"),
    ("sample unknown char", lambda: sample_group(model(), TOK, "Hi 3", 2), "error", ValueError, "not in the vocabulary"),
    ("sample group 0", lambda: sample_group(model(), TOK, "Hi", 0), "error", ValueError, "group_size"),
    ("sample group 2.0", lambda: sample_group(model(), TOK, "Hi", 2.0), "error", TypeError, "group_size"),
    ("sample new 0", lambda: sample_group(model(), TOK, "Hi", 2, None, 0), "error", ValueError, "max_new_tokens"),
    ("sample generator seed", lambda: sample_group(model(), TOK, "Hi", 2, 0), "error", TypeError, "generator"),
    ("sample generator elsewhere", lambda: sample_group(on_meta(), TOK, "Hi", 2, gen()), "error", ValueError,
     "generator is on cpu and the model on meta"),
    ("sample room for one", lambda: sample_group(model(), TOK, "a" * 45, 2, gen(), 8)[0].shape, "result",
     lambda s: s == (2, 48)),
    # reply_finished
    ("finished ok", lambda: reply_finished(*group(3, 6)[:2], TOK.end_id), "result",
     lambda r: r.dtype == torch.bool and r.shape == (3,)),
    ("finished by hand", lambda: reply_finished(torch.tensor([[1, 2, 67], [1, 67, 3]]),
                                                torch.tensor([[0, 1, 1], [0, 0, 1]]), 67).tolist(), "result",
     lambda r: r == [True, False]),
    ("finished swapped", lambda: reply_finished(*group(3, 6)[:2][::-1], TOK.end_id), "error", ValueError,
     "response_mask must hold only 1"),
    ("finished end_id tokenizer", lambda: reply_finished(*group(3, 6)[:2], TOK), "error", TypeError, "end_id"),
    ("finished replies as mask", lambda: reply_finished(group()[0], group()[2], TOK.end_id), "error", TypeError,
     "response_mask"),
    ("finished mask shape", lambda: reply_finished(group()[0], group()[1][:, :-1], TOK.end_id), "error",
     ValueError, "response_mask must be"),
    # stack_rows
    ("stack ok", lambda: stack_rows([group(2, 3)[:2], group(3, 6)[:2]], TOK.end_id), "result",
     lambda r: r[0].shape[0] == r[1].shape[0] == 5 and r[0].shape == r[1].shape),
    ("stack empty", lambda: stack_rows([], 0), "error", ValueError, "rows is empty"),
    ("stack triples", lambda: stack_rows([group()], 0), "error", TypeError, "rows[0]"),
    ("stack one pair", lambda: stack_rows(group()[:2], 0), "error", TypeError, "rows[0]"),
    ("stack pad None", lambda: stack_rows([group()[:2]], None), "error", TypeError, "pad_id"),
    ("stack dtypes", lambda: stack_rows([group()[:2], (group()[0].int(), group()[1])], 0), "error", ValueError,
     "rows[1]"),
    # response_batch (notebook 14's chat_batch guards it)
    ("batch ok", batch, "result", lambda r: r[0].shape == r[1].shape and not r[1][:, 0].any()),
    ("batch dicts", lambda: response_batch(TOK, EXAMPLES, 48), "error", TypeError, "examples[0]"),
    ("batch too long", lambda: response_batch(TOK, [("a" * 60, "b")], 48), "error", ValueError, "examples[0]"),
    ("batch tokenizer chars", lambda: response_batch(CHARS, EXCHANGES, 48), "error", TypeError, "tokenizer"),
    ("batch context 0", lambda: response_batch(TOK, EXCHANGES, 0), "error", ValueError, "context_length"),
    # token_logprobs, sequence_logprobs
    ("logprobs ok", lambda: token_logprobs(model(), *batch()), "result",
     lambda r: r.shape == (2, batch()[0].shape[1] - 1) and bool((r <= 0).all())
     and bool((r[batch()[1][:, 1:] == 0] == 0).all())),
    ("logprobs bool mask", lambda: torch.equal(token_logprobs(model(), batch()[0], batch()[1].bool()),
                                               token_logprobs(model(), *batch())), "result", bool),
    ("logprobs float mask", lambda: token_logprobs(model(), batch()[0], batch()[1].float()), "error", ValueError,
     "response_mask must be a 0/1 or bool"),
    ("logprobs mask all ones", lambda: token_logprobs(model(), batch()[0], torch.ones_like(batch()[1])), "error",
     ValueError, "response_mask[:, 0] is 1"),
    ("logprobs empty row", lambda: token_logprobs(model(), batch()[0], batch()[1] * torch.tensor([[1], [0]])),
     "error", ValueError, "row 1 of response_mask"),
    ("logprobs mask 2s", lambda: token_logprobs(model(), batch()[0], batch()[1] * 2), "error", ValueError,
     "response_mask must hold only 1"),
    ("logprobs ids int32", lambda: token_logprobs(model(), batch()[0].int(), batch()[1]), "error", ValueError,
     "input_ids must be int64"),
    ("logprobs ids 1-D", lambda: token_logprobs(model(), batch()[0][0], batch()[1][0]), "error", ValueError,
     "input_ids must be int64"),
    ("logprobs ids list", lambda: token_logprobs(model(), batch()[0].tolist(), batch()[1]), "error", TypeError,
     "input_ids"),
    ("logprobs model tuple", lambda: token_logprobs((model(), TOK), *batch()), "error", TypeError, "model"),
    ("logprobs id past vocab", lambda: token_logprobs(model(), torch.cat([batch()[0][:, :-1], torch.full((2, 1), 99)],
                                                                         1), batch()[1]), "error", ValueError,
     "input_ids holds token id 99"),
    ("logprobs mask elsewhere", lambda: token_logprobs(model(), batch()[0], batch()[1].to("meta")), "error",
     ValueError, "response_mask is on meta"),
    ("seq ok", lambda: torch.allclose(sequence_logprobs(model(), *batch()), token_logprobs(model(), *batch()).sum(-1)),
     "result", bool),
    ("seq swapped", lambda: sequence_logprobs(model(), batch()[1], batch()[0]), "error", ValueError, "response_mask"),
    # preference_pairs
    ("pairs ok", lambda: preference_pairs(model(), TOK, EXAMPLES, 3, gen(), 6), "result",
     lambda r: isinstance(r, list) and all({"chosen", "rejected"} <= set(p) for p in r)),
    ("pairs samples 1", lambda: preference_pairs(model(), TOK, EXAMPLES, 1), "error", ValueError, "samples"),
    ("pairs examples dict", lambda: preference_pairs(model(), TOK, EXAMPLES[0], 2), "error", TypeError, "examples"),
    ("pairs examples empty", lambda: preference_pairs(model(), TOK, [], 2), "error", TypeError, "examples"),
    ("pairs examples tuples", lambda: preference_pairs(model(), TOK, EXCHANGES, 2), "error", TypeError,
     "examples[0]"),
    ("pairs no task", lambda: preference_pairs(model(), TOK, [{"instruction": "Hi", "response": "Ho"}], 2), "error",
     TypeError, "examples[0]"),
    # pair_logprobs
    ("pair logprobs ok", lambda: pair_logprobs(model(), TOK, PAIRS, 48), "result",
     lambda r: r[0].shape == r[1].shape == (2,) and bool((r[0] < 0).all())),
    ("pair logprobs tuples", lambda: pair_logprobs(model(), TOK, [("a", "b", "c")], 48), "error", TypeError,
     "pairs[0]"),
    ("pair logprobs empty", lambda: pair_logprobs(model(), TOK, [], 48), "error", TypeError, "pairs"),
    ("pair logprobs no rejected", lambda: pair_logprobs(model(), TOK, [EXAMPLES[0]], 48), "error", TypeError,
     "pairs[0]"),
    ("pair logprobs chat token", lambda: pair_logprobs(model(), TOK, [{**PAIRS[0], "rejected": "AB<|end|>"}], 48),
     "error", ValueError, "pairs[0]['rejected'] holds the chat token"),
    ("pair logprobs too long", lambda: pair_logprobs(model(), TOK, [PAIRS[0], {**PAIRS[1], "chosen": "a" * 40}], 48),
     "error", ValueError, "pairs[1] with its chosen reply"),
    ("pair logprobs tokenizer", lambda: pair_logprobs(model(), CHARS, PAIRS, 48), "error", TypeError, "tokenizer"),
    # dpo_loss
    ("dpo ok", dpo_ok, "result", bool),
    ("dpo ok beta 0.5", lambda: dpo_ok(0.5), "result", bool),
    ("dpo negated (issue)", lambda: dpo_loss(-torch.tensor([-3.0, -5.0]), -torch.tensor([-4.0, -2.0]),
                                             -torch.tensor([-3.5, -4.0]), -torch.tensor([-3.0, -3.0]), 0.1),
     "error", ValueError, "policy_chosen[0] is 3, but a log-probability is never positive"),
    ("dpo one positive", lambda: dpo_loss(X, X, X, torch.tensor([-1.0, 0.5, -1.0]), 0.1), "error", ValueError,
     "ref_rejected[1] is 0.5"),
    ("dpo nan", lambda: dpo_loss(X, torch.tensor([-1.0, math.nan, -1.0]), X, X, 0.1), "error", ValueError,
     "policy_rejected[1] is nan"),
    ("dpo zero ok", lambda: dpo_loss(torch.zeros(3), X, X, X, 0.1)[0], "result", lambda r: math.isfinite(r.item())),
    ("dpo with grad", lambda: dpo_loss(X.clone().requires_grad_(), X, X, X, 0.1)[0].requires_grad, "result", bool),
    ("dpo shapes", lambda: dpo_loss(X, X[:2], X, X, 0.1), "error", ValueError, "policy_rejected has shape (2,)"),
    ("dpo int", lambda: dpo_loss(X, X, X.long(), X, 0.1), "error", TypeError, "ref_chosen must hold log-probabilities"),
    ("dpo list", lambda: dpo_loss([-2.0] * 3, X, X, X, 0.1), "error", TypeError, "policy_chosen"),
    ("dpo 2-D", lambda: dpo_loss(*[torch.full((2, 3), -1.0)] * 4, 0.1), "error", ValueError, "1-D (pairs,)"),
    ("dpo empty", lambda: dpo_loss(*[X[:0]] * 4, 0.1), "error", ValueError, "non-empty"),
    ("dpo beta 0", lambda: dpo_loss(X, X, X, X, 0), "error", ValueError, "beta"),
    ("dpo beta nan", lambda: dpo_loss(X, X, X, X, math.nan), "error", ValueError, "beta"),
    ("dpo beta str", lambda: dpo_loss(X, X, X, X, "0.1"), "error", TypeError, "beta"),
    ("dpo beta tensor", lambda: dpo_loss(X, X, X, X, torch.tensor(0.1)), "error", TypeError, "beta"),
    # frozen_copy, policy_copy
    ("frozen ok", lambda: frozen_copy(model().train()), "result",
     lambda r: not r.training and not any(p.requires_grad for p in r.parameters())),
    ("frozen separate", lambda: (lambda m: frozen_copy(m).out_head.weight.data_ptr() != m.out_head.weight.data_ptr())(
        model()), "result", bool),
    ("frozen tuple", lambda: frozen_copy((model(), TOK)), "error", TypeError, "model"),
    ("policy ok", lambda: policy_copy(model()), "result",
     lambda r: {n for n, p in r.named_parameters() if p.requires_grad} == {n for n, _ in r.named_parameters()
                                                                            if ".lora_" in n} != set()),
    ("policy no lora", lambda: policy_copy(model(lora=False)), "error", ValueError, "model has no LoRA matrices"),
    ("policy linear", lambda: policy_copy(torch.nn.Linear(2, 2)), "error", ValueError, "model has no LoRA"),
    ("policy tuple", lambda: policy_copy((model(), TOK)), "error", TypeError, "model"),
    # k3_kl
    ("k3 ok", lambda: k3_kl(LOGPS, REF), "result",
     lambda r: r.shape == LOGPS.shape and bool((r >= 0).all()) and torch.allclose(r, (REF - LOGPS).exp() - (REF - LOGPS) - 1)),
    ("k3 zero", lambda: k3_kl(LOGPS, LOGPS.clone()), "result", lambda r: bool((r == 0).all())),
    ("k3 broadcast", lambda: k3_kl(LOGPS, REF[0]), "error", ValueError, "ref_logps has shape (6,)"),
    ("k3 shapes", lambda: k3_kl(LOGPS, REF[:, :5]), "error", ValueError, "ref_logps has shape"),
    ("k3 list", lambda: k3_kl(LOGPS.tolist(), REF), "error", TypeError, "logps"),
    ("k3 int", lambda: k3_kl(LOGPS, REF.long()), "error", TypeError, "ref_logps"),
    # kl_to_reference
    ("kl self", lambda: kl_to_reference(model(), model(), TOK, EXAMPLES, 2, gen(), 6), "result",
     lambda r: isinstance(r, float) and abs(r) < 1e-5),
    ("kl other", lambda: kl_to_reference(model(), model(lora=False), TOK, EXAMPLES, 2, gen(), 6), "result",
     lambda r: r > 0),
    ("kl examples empty", lambda: kl_to_reference(model(), model(), TOK, [], 2), "error", TypeError, "examples"),
    ("kl examples str", lambda: kl_to_reference(model(), model(), TOK, "Speak as AB.", 2), "error", TypeError,
     "examples"),
    ("kl plain instructions", lambda: kl_to_reference(model(), model(), TOK, [{"instruction": "Hi"}], 2, gen(), 4),
     "result", lambda r: abs(r) < 1e-5),
    ("kl samples 0", lambda: kl_to_reference(model(), model(), TOK, EXAMPLES, 0), "error", ValueError, "samples"),
    ("kl reference tuple", lambda: kl_to_reference(model(), (model(), TOK), TOK, EXAMPLES, 2), "error", TypeError,
     "reference"),
    ("kl policy tuple", lambda: kl_to_reference((model(), TOK), model(), TOK, EXAMPLES, 2), "error", TypeError,
     "policy must be"),
    # train_dpo: every refusal leaves the policy as it was
    ("dpo train ok", lambda: train_dpo_refused(epochs=2), "result",
     lambda h: len(h) == 2 and abs(h[0]["loss"] - math.log(2)) < 1e-5 and h[1]["margin"] > 0),
    ("dpo train beta 0", lambda: train_dpo_refused(beta=0.0), "error", ValueError, "beta"),
    ("dpo train lr 0", lambda: train_dpo_refused(lr=0), "error", ValueError, "lr"),
    ("dpo train epochs 0", lambda: train_dpo_refused(epochs=0), "error", ValueError, "epochs"),
    ("dpo train epochs 1.5", lambda: train_dpo_refused(epochs=1.5), "error", TypeError, "epochs"),
    ("dpo train batch 0", lambda: train_dpo_refused(batch_size=0), "error", ValueError, "batch_size"),
    ("dpo train seed str", lambda: train_dpo_refused(seed="0"), "error", TypeError, "seed"),
    ("dpo train watch str", lambda: train_dpo_refused(watch="kl", watch_every=1), "error", TypeError, "watch"),
    ("dpo train watch every 0", lambda: train_dpo_refused(watch=dict, watch_every=0), "error", TypeError,
     "watch_every"),
    ("dpo train pairs empty", lambda: train_dpo_refused(pairs=[]), "error", TypeError, "pairs"),
    ("dpo train pairs tuples", lambda: train_dpo_refused(pairs=[("a", "b", "c")]), "error", TypeError, "pairs[0]"),
    ("dpo train pair too long", lambda: train_dpo_refused(pairs=[PAIRS[0], {**PAIRS[1], "rejected": "a" * 40}]),
     "error", ValueError, "pairs[1] with its rejected reply"),
    ("dpo train frozen policy", lambda: train_dpo_refused(policy=frozen_copy(model())), "error", ValueError,
     "the policy has no trainable parameter"),
    ("dpo train policy tuple", lambda: train_dpo_refused(policy=(model(), TOK)), "error", TypeError, "policy"),
    ("dpo train reference None", lambda: train_dpo_refused(reference=None), "error", TypeError, "reference"),
    ("dpo train tokenizer chars", lambda: train_dpo_refused(tokenizer=CHARS), "error", TypeError, "tokenizer"),
    # load_aligned
    ("aligned ok", lambda: load_aligned("dpo", "cpu")[0], "result",
     lambda m: isinstance(m, GPTModel) and not m.training),
    ("aligned stage upper", lambda: load_aligned("DPO"), "error", ValueError, "stage must be one of"),
    ("aligned stage list", lambda: load_aligned(["dpo"]), "error", ValueError, "stage must be one of"),
    ("aligned device", lambda: load_aligned("grpo", "gpu"), "error", ValueError, "device"),
    # group_advantages
    ("advantages ok", lambda: group_advantages(REWARDS, 4), "result", advantages_ok),
    ("advantages equal group", lambda: group_advantages(torch.ones(4), 4), "result", lambda r: bool((r == 0).all())),
    ("advantages nan (issue)", lambda: group_advantages(torch.tensor([1.0, math.nan, 0.0, 1.0]), 2), "error",
     ValueError, "rewards[1] is nan"),
    ("advantages inf", lambda: group_advantages(torch.tensor([1.0, 0.0, math.inf, 1.0]), 2), "error", ValueError,
     "rewards[2] is inf"),
    ("advantages int", lambda: group_advantages(torch.tensor([1, 0, 1, 0]), 2), "error", ValueError,
     "rewards must be a 1-D float"),
    ("advantages list", lambda: group_advantages([1.0, 0.0], 2), "error", TypeError, "rewards"),
    ("advantages 2-D", lambda: group_advantages(REWARDS.view(2, 4), 4), "error", ValueError, "rewards must be"),
    ("advantages group 1", lambda: group_advantages(REWARDS, 1), "error", ValueError, "group_size"),
    ("advantages not whole", lambda: group_advantages(REWARDS[:7], 4), "error", ValueError, "rewards holds 7"),
    ("advantages empty", lambda: group_advantages(REWARDS[:0], 4), "error", ValueError, "rewards holds 0"),
    ("advantages eps 0", lambda: group_advantages(REWARDS, 4, 0.0), "error", ValueError, "eps"),
    # grpo_loss
    ("grpo ok", lambda: [grpo(loss_type=t, max_completion_length=6).item() for t in GRPO_LOSS_TYPES], "result",
     lambda r: all(math.isfinite(v) for v in r) and r[1] == r[3]),
    ("grpo no kl", lambda: grpo(LOGPS, OLD, None, ADV, MASK, 0.0), "result", lambda r: math.isfinite(r.item())),
    ("grpo loss type", lambda: grpo(loss_type="ppo"), "error", ValueError, "loss_type must be one of"),
    ("grpo dr no max", lambda: grpo(loss_type="dr_grpo"), "error", ValueError, "pass max_completion_length"),
    ("grpo dr max short", lambda: grpo(loss_type="dr_grpo", max_completion_length=4), "error", ValueError,
     "max_completion_length"),
    ("grpo beta no ref", lambda: grpo(LOGPS, OLD, None, ADV, MASK, 0.04), "error", ValueError,
     "beta is 0.04 but ref_logps is None"),
    ("grpo beta -1", lambda: grpo(LOGPS, OLD, REF, ADV, MASK, -1.0), "error", ValueError, "beta"),
    ("grpo epsilon 1.5", lambda: grpo(epsilon=1.5), "error", ValueError, "epsilon"),
    ("grpo kl_correction str", lambda: grpo(kl_correction="no"), "error", TypeError, "kl_correction"),
    ("grpo advantages shape", lambda: grpo(LOGPS, OLD, REF, ADV[:3], MASK, 0.04), "error", ValueError,
     "advantages must be (batch,)"),
    ("grpo advantages int", lambda: grpo(LOGPS, OLD, REF, ADV.long(), MASK, 0.04), "error", TypeError,
     "advantages must be a float"),
    ("grpo advantages list", lambda: grpo(LOGPS, OLD, REF, ADV.tolist(), MASK, 0.04), "error", TypeError,
     "advantages"),
    ("grpo mask shape", lambda: grpo(LOGPS, OLD, REF, ADV, MASK[:, 1:], 0.04), "error", ValueError,
     "completion_mask must have logps' shape"),
    ("grpo mask list", lambda: grpo(LOGPS, OLD, REF, ADV, MASK.tolist(), 0.04), "error", TypeError,
     "completion_mask"),
    ("grpo logps 1-D", lambda: grpo(LOGPS[0], OLD[0], REF[0], ADV, MASK[0], 0.04), "error", ValueError,
     "logps must be (batch, tokens)"),
    ("grpo old shape", lambda: grpo(LOGPS, OLD[:, 1:], REF, ADV, MASK, 0.04), "error", ValueError,
     "old_logps has shape"),
    ("grpo ref broadcast", lambda: grpo(LOGPS, OLD, REF[0], ADV, MASK, 0.04), "error", ValueError,
     "ref_logps has shape (6,)"),
    # rollout
    ("rollout ok", lambda: rollout(model(), TOK, EXAMPLES, 3, gen(), 6), "result",
     lambda r: r[0].shape == r[1].shape and r[0].shape[0] == 6 and r[2].shape == (6,)
     and set(r[2].tolist()) <= {0.0, 1.0} and len(r[3]) == 2),
    ("rollout examples empty", lambda: rollout(model(), TOK, [], 3), "error", TypeError, "examples"),
    ("rollout examples dict", lambda: rollout(model(), TOK, EXAMPLES[0], 3), "error", TypeError, "examples"),
    ("rollout no response", lambda: rollout(model(), TOK, [{"task": "upper", "instruction": "Hi"}], 3), "error",
     TypeError, "examples[0]"),
    ("rollout task unknown", lambda: rollout(model(), TOK, [{**EXAMPLES[0], "task": "poem"}], 3), "error",
     TypeError, "examples[0]"),
    ("rollout policy tuple", lambda: rollout((model(), TOK), TOK, EXAMPLES, 2), "error", TypeError, "policy must be"),
    ("rollout group 0", lambda: rollout(model(), TOK, EXAMPLES, 0), "error", ValueError, "group_size"),
    # grpo_step: every refusal leaves the policy as it was and samples nothing
    ("grpo step ok", lambda: grpo_step_refused(), "result",
     lambda r: set(r) == {"reward", "no_signal", "distinct", "loss"} and 0 <= r["reward"] <= 1),
    ("grpo step no reference", lambda: grpo_step_refused(reference=None), "error", TypeError,
     "beta is 0.04, so the KL penalty needs the reference model"),
    ("grpo step beta 0 no reference", lambda: grpo_step_refused(reference=None, beta=0.0), "result",
     lambda r: math.isfinite(r["loss"])),
    ("grpo step epsilon", lambda: grpo_step_refused(epsilon=1.5), "error", ValueError, "epsilon"),
    ("grpo step loss type", lambda: grpo_step_refused(loss_type="ppo"), "error", ValueError, "loss_type"),
    ("grpo step kl_correction", lambda: grpo_step_refused(kl_correction=1), "error", TypeError, "kl_correction"),
    ("grpo step iterations 0", lambda: grpo_step_refused(iterations=0), "error", ValueError, "iterations"),
    ("grpo step group 1", lambda: grpo_step_refused(group_size=1), "error", ValueError, "group_size must be >= 2"),
    ("grpo step examples empty", lambda: grpo_step_refused(examples=[]), "error", TypeError, "examples"),
    ("grpo step examples dict", lambda: grpo_step_refused(examples=EXAMPLES[0]), "error", TypeError, "examples"),
    ("grpo step long second", lambda: grpo_step_refused(examples=[EXAMPLES[0], {**EXAMPLES[1], "instruction":
                                                                              "a" * 46}]),
     "error", ValueError, "instruction takes 48 tokens"),
    ("grpo step optimizer None", lambda: grpo_step_refused(optimizer=None), "error", TypeError, "optimizer"),
    ("grpo step optimizer other", lambda: grpo_step_refused(optimizer=torch.optim.AdamW(model().parameters())),
     "error", ValueError, "optimizer holds none of the policy's trainable parameters"),
    ("grpo step generator seed", lambda: grpo_step_refused(generator=3), "error", TypeError, "generator"),
    ("grpo step new 0", lambda: grpo_step_refused(max_new_tokens=0), "error", ValueError, "max_new_tokens"),
    ("grpo step tokenizer", lambda: grpo_step_refused(tokenizer=CHARS), "error", TypeError, "tokenizer"),
    ("grpo step policy tuple", lambda: grpo_step_refused(policy=(model(), TOK)), "error", TypeError, "policy"),
    # score_policy
    ("score ok", lambda: score_policy(model(), TOK, EXAMPLES, 2, gen(), 6), "result",
     lambda r: set(r) == {"last_word", "continue", "all"}
     and all(set(v) == {"greedy", "reward", "pass_at_n", "distinct"} for v in r.values())),
    ("score samples 0", lambda: score_policy(model(), TOK, EXAMPLES, 0), "error", ValueError, "samples"),
    ("score examples empty", lambda: score_policy(model(), TOK, []), "error", TypeError, "examples"),
    ("score examples dict", lambda: score_policy(model(), TOK, EXAMPLES[0]), "error", TypeError, "examples"),
    # the old names of the doors, importable for one version
    ("moved check_response_batch", lambda: moved("check_response_batch"), "result",
     lambda r: r[0].__module__ == "course_lib.doors.alignment" and "course_lib.doors.alignment" in r[1][0]),
    ("moved check_grpo_args", lambda: moved("check_grpo_args")[0](LOGPS, OLD, None, ADV, MASK, 0.04, 0.2, "grpo",
                                                                   None), "error", ValueError,
     "beta is 0.04 but ref_logps is None"),
    ("moved check_grpo_settings", lambda: moved("check_grpo_settings")[0](0.04, 0.2, "sapo"), "error", ValueError,
     "loss_type"),
    ("moved check_logprob_tensors", lambda: moved("check_logprob_tensors")[0]({"a": X, "b": X[:2]}, "(n,)"), "error",
     ValueError, "b has shape (2,)"),
]


test_door = door_tests(CASES)


if __name__ == "__main__":  # the counts of issue 41's door tables
    report(CASES)

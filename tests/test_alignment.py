"""Notebook 15, alignment (course_lib/alignment.py), on its own terms: sampled groups and their masks, sequence
log-probs that agree with the sampler, preference pairs a program judges, the DPO loss and its training loop, the
k3 KL estimate, group advantages, the GRPO loss and one GRPO step, held-out scoring, and the doors. The equalities
with TRL live in test_alignment_trl.py, the shipped adapters and load_aligned in test_alignment_shipped.py: neither is
repeated here. The shipped chat model of notebook 14 is the policy wherever a real one is needed, with few and short
samples; where a step is checked against the recipe done by hand, the same seeds give the same samples."""

import math

import pytest
import torch

import course_lib.alignment as alignment
import course_lib.generation as generation
from course_lib.alignment import (GRPO_LOSS_TYPES, dpo_loss, frozen_copy, group_advantages, grpo_loss, grpo_step,
                                  k3_kl, kl_to_reference, pair_logprobs, policy_copy, preference_pairs, response_batch,
                                  sample_group, score_policy, sequence_logprobs, stack_rows, token_logprobs, train_dpo)
from course_lib.doors.alignment import response_tensors
from course_lib.finetuning import (chat_reply, format_chat, generate_replies, judge_reply, load_shakespeare_chat,
                                   make_instructions)
from course_lib.training import load_shakespeare

SPEAK = "Speak as CORIOLANUS."  # the continue task: replies of many lengths, most of them closed by <|end|>
PAIRS = [  # (instruction, response) exchanges of different lengths
    ("Upper case:\nGood morrow, father.", "GOOD MORROW, FATHER."),
    ("Last word, in capitals:\nIs it near day?", "DAY"),
    ("How many words?\nGood morrow, cousin.", "three"),
    ("Speak as HAMLET.", "HAMLET:\nTo be, or not to be."),
]
DPO_PAIRS = [  # hand-made preference pairs: the exact answer beats a wrong one
    {"task": "upper", "instruction": "Upper case:\nGood morrow, father.", "chosen": "GOOD MORROW, FATHER.",
     "rejected": "Good morrow, father."},
    {"task": "last_word", "instruction": "Last word, in capitals:\nIs it near day?", "chosen": "DAY",
     "rejected": "day"},
    {"task": "count", "instruction": "How many words?\nGood morrow, cousin.",
     "chosen": "three", "rejected": "four"},
    {"task": "continue", "instruction": "Speak as HAMLET.", "chosen": "HAMLET:\nTo be, or not to be.",
     "rejected": "To be, or not to be."},
]


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def chat():
    torch.set_num_threads(1)
    return load_shakespeare_chat("cpu")


@pytest.fixture(scope="module")
def heldout():
    """Two held-out instructions per task (notebook 14's recipe: validation text, no line seen in training)."""
    text = load_shakespeare()
    cut = int(len(text) * 0.9)
    return make_instructions(text[cut:], 2, 5, exclude=text[:cut])


def trainable_copy(model):
    """A private copy of the chat model whose LoRA matrices train and nothing else (as make_shakespeare_align)."""
    policy = frozen_copy(model)
    for name, p in policy.named_parameters():
        p.requires_grad_(".lora_" in name)
    return policy


def moved_copy(model, factor: float = 1.5):
    """A frozen copy whose LoRA updates are scaled by `factor`: a model that differs from the chat model."""
    moved = frozen_copy(model)
    with torch.no_grad():
        for name, p in moved.named_parameters():
            if name.endswith("lora_B"):
                p.mul_(factor)
    return moved


def snapshot(model) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def changed(model, before: dict) -> set:
    return {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------------ sample_group
def test_sample_group_masks_each_reply_up_to_and_including_its_first_end(chat):
    model, tokenizer = chat
    prompt = tokenizer.encode(format_chat(SPEAK))
    n = len(prompt)
    ids, mask, replies = sample_group(model, tokenizer, SPEAK, 6, seeded(0), 48)
    assert ids.dtype == torch.int64 and not mask.dtype.is_floating_point
    assert ids.shape == mask.shape and ids.shape[0] == 6 and n < ids.shape[1] <= n + 48
    assert isinstance(replies, list) and len(replies) == 6 and all(isinstance(r, str) for r in replies)
    assert (ids[:, :n] == torch.tensor(prompt)).all(), "every row starts with the prompt"
    assert (mask[:, :n] == 0).all(), "a prompt token is marked as a reply token"
    padded = 0
    for row in range(6):
        new = ids[row, n:].tolist()
        k = new.index(tokenizer.end_id) if tokenizer.end_id in new else None  # the first <|end|>, if any
        want = [1] * len(new) if k is None else [1] * (k + 1) + [0] * (len(new) - k - 1)
        assert mask[row, n:].tolist() == want, f"row {row}: 1 up to and including the first <|end|>, 0 after"
        assert replies[row] == tokenizer.decode(new if k is None else new[:k]), f"row {row}: the reply's text"
        assert "<|end|>" not in replies[row]
        padded += k is not None and k < len(new) - 1
    assert padded >= 1, "no row ended before the longest one: the 0s after <|end|> were not exercised"


def test_sample_group_samples_what_one_generate_call_samples(chat):
    """sample_group writes its group with notebook 14's generate_replies: the very tokens of one generate call at
    temperature 1 from the same generator, bit for bit (the shipped adapters were trained on such groups)."""
    model, tokenizer = chat
    prompt = torch.tensor([tokenizer.encode(format_chat(SPEAK))] * 4)  # (4, prompt tokens)
    want = generation.generate(model, prompt, 32, temperature=1.0, eos_id=tokenizer.end_id, generator=seeded(3))
    ids, _, replies = sample_group(model, tokenizer, SPEAK, 4, seeded(3), 32)
    assert torch.equal(ids, want)
    assert replies == generate_replies(model, tokenizer, SPEAK, 4, 32, 1.0, seeded(3))[2]


def test_sample_group_is_reproducible_from_the_generators_seed(chat):
    model, tokenizer = chat
    ids_a, mask_a, replies_a = sample_group(model, tokenizer, SPEAK, 4, seeded(7), 32)
    ids_b, mask_b, replies_b = sample_group(model, tokenizer, SPEAK, 4, seeded(7), 32)
    assert torch.equal(ids_a, ids_b) and torch.equal(mask_a, mask_b) and replies_a == replies_b
    assert sample_group(model, tokenizer, SPEAK, 4, seeded(8), 32)[2] != replies_a, "another seed, other replies"


def test_a_reply_cut_at_max_new_tokens_has_no_end_and_is_masked_throughout(chat):
    model, tokenizer = chat
    n = len(tokenizer.encode(format_chat(SPEAK)))
    ids, mask, replies = sample_group(model, tokenizer, SPEAK, 4, seeded(0), 3)  # "COR...": a heading is longer
    assert ids.shape == (4, n + 3)
    assert not (ids[:, n:] == tokenizer.end_id).any(), "no reply of 3 characters is expected to end here"
    assert (mask[:, n:] == 1).all() and all(len(r) == 3 for r in replies)
    long = "a" * 125  # 127 prompt tokens with <|user|> and <|assistant|>: room for one token in a context of 128
    ids, mask, _ = sample_group(model, tokenizer, long, 2, seeded(0), 48)
    assert ids.shape == (2, 128) and mask[:, -1].tolist() == [1, 1] and (mask[:, :-1] == 0).all()


def test_sample_group_doors(chat):
    model, tokenizer = chat
    with pytest.raises(ValueError, match="instruction takes 128 tokens with the chat tokens"):
        sample_group(model, tokenizer, "a" * 126, 2)
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        sample_group(model, tokenizer, SPEAK, 0)
    with pytest.raises(TypeError, match="group_size must be an int"):
        sample_group(model, tokenizer, SPEAK, 2.0)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        sample_group(model, tokenizer, SPEAK, 2, max_new_tokens=0)
    with pytest.raises(TypeError, match="model must be a GPTModel"):
        sample_group(torch.nn.Linear(2, 2), tokenizer, SPEAK, 2)
    with pytest.raises(TypeError, match="tokenizer must be a ChatTokenizer"):
        sample_group(model, tokenizer.char_tokenizer, SPEAK, 2)


# ------------------------------------------------------------------------------------------------ log-probs
def test_prompt_and_padding_score_exactly_zero_and_padding_changes_no_row(chat):
    model, tokenizer = chat
    with torch.no_grad():
        ids, mask = response_batch(tokenizer, PAIRS, 128)
        per_token = token_logprobs(model, ids, mask)  # (4, tokens - 1)
        together = sequence_logprobs(model, ids, mask)  # (4,)
        alone = torch.cat([sequence_logprobs(model, *response_batch(tokenizer, [pair], 128)) for pair in PAIRS])
    lengths = mask.sum(dim=1)
    assert lengths.unique().numel() == len(PAIRS), "rows of different lengths, so that padding is exercised"
    assert (per_token[mask[:, 1:] == 0] == 0).all(), "a prompt or padding position is not exactly 0"
    assert (per_token[mask[:, 1:] == 1] < 0).all(), "a response token is not scored"
    assert torch.allclose(together, alone, atol=1e-5), "right padding changed a row's sequence log-prob"
    with torch.no_grad():
        as_bool = sequence_logprobs(model, ids, mask.bool())
    assert torch.equal(as_bool, together), "a bool mask must mean what the 0/1 mask means"


def test_sequence_logprobs_of_sampled_replies_equal_the_samplers_own_logprobs(chat, monkeypatch):
    """The logits generate sampled each token from, recorded step by step: the sum of log-softmax over the tokens that
    sample_group's mask marks is the sequence log-prob of the same ids. So the mask and token_logprobs agree: every
    sampled reply token (with its <|end|>) is scored once, at the right position, and nothing after it."""
    model, tokenizer = chat
    seen = []
    original = generation.sample_next_token

    def recording(logits, *args, **kwargs):
        seen.append(logits.detach().float().clone())  # (group, vocab_size)
        return original(logits, *args, **kwargs)

    monkeypatch.setattr(generation, "sample_next_token", recording)
    rows = []
    for instruction in (SPEAK, PAIRS[1][0]):  # two prompts of different lengths, stacked like grpo_step does
        seen.clear()
        ids, mask, _ = sample_group(model, tokenizer, instruction, 3, seeded(3), 40)
        n = len(tokenizer.encode(format_chat(instruction)))
        by_sampler = torch.zeros(3)
        for step, logits in enumerate(seen):
            logps = logits.log_softmax(dim=-1)
            for row in range(3):
                if mask[row, n + step]:
                    by_sampler[row] += logps[row, ids[row, n + step]]
        with torch.no_grad():
            ours = sequence_logprobs(model, ids, mask)
        assert torch.allclose(ours, by_sampler, atol=1e-4), f"{instruction!r}: {ours} vs the sampler's {by_sampler}"
        rows.append((ids, mask, ours))
    ids, mask = stack_rows([(i, m) for i, m, _ in rows], tokenizer.end_id)
    assert ids.shape[1] == max(i.shape[1] for i, _, _ in rows) > min(i.shape[1] for i, _, _ in rows)
    for k, (group, _, _) in enumerate(rows):  # each group right-padded with <|end|>, masked 0
        assert (ids[3 * k:3 * k + 3, group.shape[1]:] == tokenizer.end_id).all()
        assert (mask[3 * k:3 * k + 3, group.shape[1]:] == 0).all()
    with torch.no_grad():
        stacked = sequence_logprobs(model, ids, mask)
    assert torch.allclose(stacked, torch.cat([s for _, _, s in rows]), atol=1e-5), "stack_rows' padding is scored"


def test_the_response_batch_door_names_the_argument(chat):
    model, tokenizer = chat
    ids, mask = response_batch(tokenizer, PAIRS[:2], 128)
    response_tensors(ids, mask)  # the door lets a good batch through
    with pytest.raises(ValueError, match="response_mask must be a 0/1 or bool tensor .* got torch.float32"):
        response_tensors(ids, mask.float())
    with pytest.raises(ValueError, match=r"response_mask\[:, 0\] is 1"):
        response_tensors(ids, torch.cat([torch.ones_like(mask[:, :1]), mask[:, 1:]], dim=1))
    with pytest.raises(ValueError, match="row 1 of response_mask has no response token"):
        response_tensors(ids, mask * torch.tensor([[1], [0]]))
    with pytest.raises(ValueError, match=r"response_mask must be a 0/1 or bool tensor of input_ids' shape \(2, "):
        response_tensors(ids, mask[:, :-1])
    with pytest.raises(ValueError, match="response_mask must hold only 1"):
        response_tensors(ids, mask * 2)
    with pytest.raises(ValueError, match="input_ids must be int64 .* got torch.float32"):
        response_tensors(ids.float(), mask)
    with pytest.raises(ValueError, match="input_ids must be int64 .* got torch.int32"):
        response_tensors(ids.int(), mask)
    with pytest.raises(ValueError, match="input_ids must be int64 .* at least 2 tokens"):
        response_tensors(ids[:, :1], mask[:, :1])
    with pytest.raises(TypeError, match="input_ids must be a Tensor"):
        response_tensors(ids.tolist(), mask)
    with pytest.raises(TypeError, match="response_mask must be a Tensor"):
        response_tensors(ids, mask.tolist())
    with pytest.raises(ValueError, match=r"response_mask\[:, 0\] is 1"):  # token_logprobs runs the same door
        token_logprobs(model, ids, torch.ones_like(mask))


# ------------------------------------------------------------------------------------------------ preference pairs
def test_preference_pairs_from_the_chat_model_are_judged_right_and_wrong(chat, heldout):
    model, tokenizer = chat
    examples = [e for e in heldout if e["task"] in ("upper", "count", "continue")]
    pairs = preference_pairs(model, tokenizer, examples, 4, seeded(0), 48)
    assert 1 <= len(pairs) <= len(examples), "these instructions are sometimes answered right, sometimes not"
    by_instruction = {e["instruction"]: e for e in examples}
    for pair in pairs:
        example = by_instruction[pair["instruction"]]
        assert pair == {**example, "chosen": pair["chosen"], "rejected": pair["rejected"]}, "the example, two replies"
        assert judge_reply(example, pair["chosen"]), f"chosen {pair['chosen']!r} is not a right answer"
        assert not judge_reply(example, pair["rejected"]), f"rejected {pair['rejected']!r} is a right answer"
        assert judge_reply(pair, pair["chosen"]), "a pair can be judged again by judge_reply"
    with torch.no_grad():
        chosen, rejected = pair_logprobs(model, tokenizer, pairs, 128)  # every pair can be written as turns
    assert chosen.shape == rejected.shape == (len(pairs),) and bool(torch.isfinite(chosen).all())


def test_preference_pairs_pick_the_first_right_and_first_wrong_reply(chat, monkeypatch):
    model, tokenizer = chat

    def ask(task, name):
        if task == "last_word":
            return {"task": "last_word", "instruction": f"Last word, in capitals:\nHo, {name.title()}!",
                    "response": name}
        return {"task": "continue", "instruction": f"Speak as {name}.", "response": f"{name}:\nHa!"}

    cases = [  # (example, the replies sampled for it, the pair wanted or None)
        (ask("last_word", "JULIET"), ["JULIET", "JULIET", "JULIET"], None),  # always right: no pair
        (ask("last_word", "NURSE"), ["ROMEO", "nurse", "NURSE!"], None),  # never right: no pair
        (ask("last_word", "TYBALT"), ["ROMEO", "TYBALT", "NURSE", "TYBALT "], ("TYBALT", "ROMEO")),
        (ask("continue", "HAMLET"), ["x", "HAMLET:\nA.", "y", "HAMLET:\nB."], ("HAMLET:\nA.", "x")),
        # a reply holding a chat token cannot be a turn: left out, even where judge_reply would call it right
        (ask("continue", "LEAR"), ["<|assistant|>LEAR", "LEAR:\nNo<|user|>thing", "LEAR:\nNothing.", "no"],
         ("LEAR:\nNothing.", "no")),
        (ask("last_word", "KENT"), ["KENT", "ROMEO<|end|>", "<|user|>"], None),  # the only wrong ones are left out
        # a reply cut off before its <|end|> (marked "CUT:") is no answer: left out, right or wrong
        (ask("last_word", "OSRIC"), ["CUT:OSRIC", "ROMEO", "OSRIC"], ("OSRIC", "ROMEO")),
        (ask("last_word", "EDGAR"), ["EDGAR", "CUT:ROMEO"], None),
    ]
    replies = {example["instruction"]: sampled for example, sampled, _ in cases}
    calls = []

    def scripted(model_, tokenizer_, instruction, group_size, generator, max_new_tokens):
        calls.append((instruction, group_size, generator, max_new_tokens))
        sampled = replies[instruction]
        finished = torch.tensor([[0, int(not r.startswith("CUT:"))] for r in sampled])  # (replies, 2)
        ids = torch.where(finished.bool(), tokenizer.end_id, 0)  # <|end|> in the reply where it finished
        return ids, torch.tensor([[0, 1]] * len(sampled)), [r.removeprefix("CUT:") for r in sampled]

    monkeypatch.setattr(alignment, "sample_group", scripted)
    generator = seeded(0)
    pairs = preference_pairs(model, tokenizer, [example for example, _, _ in cases], 4, generator, 20)
    want = [{**e, "chosen": p[0], "rejected": p[1]} for e, _, p in cases if p is not None]
    assert pairs == want
    assert calls == [(e["instruction"], 4, generator, 20) for e, _, _ in cases], "samples, generator, max_new_tokens"
    with pytest.raises(ValueError, match="samples must be >= 2"):
        preference_pairs(model, tokenizer, [cases[0][0]], 1)


# ------------------------------------------------------------------------------------------------ DPO
@pytest.mark.parametrize("beta", [0.01, 0.1, 1.0, 25.0])
def test_dpo_loss_is_log_2_when_the_policy_is_the_reference(beta):
    chosen, rejected = -1 - torch.rand(5, generator=seeded(1)) * 30, -torch.rand(5, generator=seeded(2)) * 30
    loss, chosen_reward, rejected_reward = dpo_loss(chosen, rejected, chosen.clone(), rejected.clone(), beta)
    assert abs(loss.item() - math.log(2)) < 1e-6, "no preference yet: -log sigmoid(0)"
    assert torch.equal(chosen_reward, torch.zeros(5)) and torch.equal(rejected_reward, torch.zeros(5))
    up, _, _ = dpo_loss(chosen + 1, rejected, chosen, rejected, beta)  # the policy prefers the chosen a little more
    assert up.item() < math.log(2), "raising the chosen reply's log-prob must lower the loss"


def test_dpo_loss_doors():
    x = torch.full((3,), -2.0)
    with pytest.raises(ValueError, match=r"policy_rejected has shape \(2,\) but policy_chosen has \(3,\)"):
        dpo_loss(x, x[:2], x, x, 0.1)
    with pytest.raises(TypeError, match="ref_chosen must hold log-probabilities .* got dtype torch.int64"):
        dpo_loss(x, x, x.long(), x, 0.1)
    with pytest.raises(TypeError, match="policy_chosen must be a Tensor"):
        dpo_loss([-2.0] * 3, x, x, x, 0.1)
    for beta in (0, 0.0, -0.1):
        with pytest.raises(ValueError, match=r"beta must be in \(0, inf\)"):
            dpo_loss(x, x, x, x, beta)
    y = torch.full((2, 3), -2.0)
    with pytest.raises(ValueError, match=r"the log-probs must be 1-D \(pairs,\) and non-empty, got shape \(2, 3\)"):
        dpo_loss(y, y, y, y, 0.1)
    with pytest.raises(ValueError, match="the log-probs must be 1-D"):
        dpo_loss(x[:0], x[:0], x[:0], x[:0], 0.1)


def test_train_dpo_raises_the_preference_moves_only_the_trainable_parameters_and_follows_its_recipe(chat):
    model, tokenizer = chat
    policy, reference = trainable_copy(model), frozen_copy(model)
    policy_before, reference_before = snapshot(policy), snapshot(reference)
    history = train_dpo(policy, reference, tokenizer, DPO_PAIRS, beta=0.5, lr=3e-4, epochs=4, batch_size=4)
    assert [h["step"] for h in history] == [1, 2, 3, 4]
    first, last = history[0], history[-1]
    assert abs(first["loss"] - math.log(2)) < 1e-4 and abs(first["margin"]) < 1e-4, "step 1: policy == reference"
    assert first["accuracy"] == 0.0, "equal implicit rewards are a tie, not a preference for the chosen reply"
    losses, accuracies = [h["loss"] for h in history], [h["accuracy"] for h in history]
    assert all(b < a for a, b in zip(losses, losses[1:])), f"the loss must fall at every full-batch step: {losses}"
    assert accuracies == sorted(accuracies) and last["accuracy"] == 1.0, f"accuracy must rise: {accuracies}"
    assert last["margin"] > 1 and last["loss"] < 0.5 * math.log(2)
    assert last["chosen_logratio"] > last["rejected_logratio"]
    assert not changed(reference, reference_before), "the reference moved"
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    assert changed(policy, policy_before) == trainable, "exactly the trainable parameters must move, all of them"
    assert not policy.training and not reference.training, "both stay in eval mode (dropout off)"

    # the recipe by hand: AdamW without weight decay on the trainable parameters, the batches of the seeded shuffle,
    # the reference's log-probs computed once; each step from freshly zeroed gradients
    by_hand = trainable_copy(model)
    optimizer = torch.optim.AdamW([p for p in by_hand.parameters() if p.requires_grad], lr=3e-4, weight_decay=0.0)
    with torch.no_grad():
        ref_chosen, ref_rejected = pair_logprobs(reference, tokenizer, DPO_PAIRS, 128)
    generator = seeded(0)
    for step in range(4):
        picks = torch.randperm(len(DPO_PAIRS), generator=generator)
        chosen, rejected = pair_logprobs(by_hand, tokenizer, [DPO_PAIRS[i] for i in picks], 128)
        loss = dpo_loss(chosen, rejected, ref_chosen[picks], ref_rejected[picks], 0.5)[0]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert abs(loss.item() - losses[step]) < 1e-6, f"step {step + 1}: {loss.item()} by hand, {losses[step]}"
    for (name, p), q in zip(by_hand.named_parameters(), policy.parameters()):
        assert torch.allclose(p, q, atol=1e-6), f"{name} differs from the recipe done by hand"


def test_train_dpo_is_seeded_and_calls_watch_every_watch_every_steps(chat):
    model, tokenizer = chat

    def run(seed):
        calls = []

        def watch():
            calls.append(len(calls) + 1)
            return {"watched": len(calls)}

        history = train_dpo(trainable_copy(model), frozen_copy(model), tokenizer, DPO_PAIRS, beta=0.5, lr=1e-3,
                            epochs=2, batch_size=2, seed=seed, watch=watch, watch_every=2)
        return history, calls

    history, calls = run(0)
    assert len(history) == 4 and calls == [1, 2]
    assert [h.get("watched") for h in history] == [None, 1, None, 2], "watch's dict merged into every 2nd record"
    assert all({"loss", "accuracy", "margin", "chosen_logratio", "rejected_logratio"} <= set(h) for h in history)
    assert run(0)[0] == history, "the same seed must give the same history"
    assert run(1)[0] != history, "another seed shuffles the pairs otherwise"
    unwatched = train_dpo(trainable_copy(model), frozen_copy(model), tokenizer, DPO_PAIRS[:2], 0.5, 1e-3, 1)
    assert len(unwatched) == 1 and "watched" not in unwatched[0]


def test_train_dpo_refuses_a_policy_with_nothing_to_train(chat):
    model, tokenizer = chat
    with pytest.raises(ValueError, match="the policy has no trainable parameter"):
        train_dpo(frozen_copy(model), frozen_copy(model), tokenizer, DPO_PAIRS, 0.5, 1e-3, 1)
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        train_dpo(trainable_copy(model), frozen_copy(model), tokenizer, DPO_PAIRS, 0.5, 1e-3, 0)
    with pytest.raises(ValueError, match=r"lr must be in \(0, inf\)"):
        train_dpo(trainable_copy(model), frozen_copy(model), tokenizer, DPO_PAIRS, 0.5, 0.0, 1)


def test_frozen_copy_is_a_separate_frozen_model_in_eval_mode(chat):
    model, _ = chat
    source = trainable_copy(model).train()
    reference = frozen_copy(source)
    assert not any(m.training for m in reference.modules()), "the reference must be in eval mode (dropout off)"
    assert not any(p.requires_grad for p in reference.parameters()), "no optimizer may change the reference"
    assert source.training and any(p.requires_grad for p in source.parameters()), "the original must stay as it was"
    for (name, p), (other, q) in zip(source.named_parameters(), reference.named_parameters()):
        assert name == other and torch.equal(p, q) and p.data_ptr() != q.data_ptr(), f"{name}: a copy, not a view"


# ------------------------------------------------------------------------------------------------ KL
def test_k3_is_never_negative_and_exactly_zero_at_equality():
    generator = seeded(0)
    logps = -5 * torch.rand(1000, generator=generator)
    ref = -5 * torch.rand(1000, generator=generator)
    assert (k3_kl(logps, ref) >= 0).all()
    assert torch.equal(k3_kl(logps, logps.clone()), torch.zeros(1000))
    assert k3_kl(logps.view(10, 100), ref.view(10, 100)).shape == (10, 100)
    with pytest.raises(ValueError, match=r"ref_logps has shape \(999,\)"):
        k3_kl(logps, ref[:-1])


def test_k3_mean_over_samples_from_the_policy_tends_to_the_exact_kl():
    """Tokens drawn from a categorical policy p; the mean of k3 tends to KL(p || q), not to KL(q || p)."""
    generator = seeded(0)
    p = (1.5 * torch.randn(8, generator=generator, dtype=torch.float64)).softmax(-1)
    q = (1.5 * torch.randn(8, generator=generator, dtype=torch.float64)).softmax(-1)
    exact, reverse = (p * (p / q).log()).sum().item(), (q * (q / p).log()).sum().item()
    tokens = torch.multinomial(p, 200_000, replacement=True, generator=generator)
    k3 = k3_kl(p.log()[tokens], q.log()[tokens])
    error = k3.std().item() / math.sqrt(len(k3))  # the standard error of the mean
    assert abs(exact - reverse) > 20 * error, "the two directions must be told apart by this many samples"
    assert abs(k3.mean().item() - exact) < 4 * error, f"{k3.mean().item():.4f} vs KL(p || q) = {exact:.4f}"


def test_kl_to_a_frozen_copy_is_exactly_zero_and_grows_when_the_policy_moves(chat, heldout):
    model, tokenizer = chat
    examples = heldout[::3]
    assert kl_to_reference(model, frozen_copy(model), tokenizer, examples, 2, seeded(0), 16) == 0.0
    assert kl_to_reference(moved_copy(model), model, tokenizer, examples, 2, seeded(0), 16) > 0.01


# ------------------------------------------------------------------------------------------------ group advantages
def test_group_advantages_centre_each_group_and_zero_a_group_of_equal_rewards():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.3, 0.9, 0.1, 0.0])
    advantages = group_advantages(rewards, 4).view(4, 4)
    assert torch.allclose(advantages.mean(dim=1), torch.zeros(4), atol=1e-6), "each group's advantages: mean 0"
    assert torch.equal(advantages[1], torch.zeros(4)) and torch.equal(advantages[2], torch.zeros(4)), "no signal"
    assert torch.allclose(advantages[[0, 3]].std(dim=1), torch.ones(2), atol=1e-3), "divided by the group's std"
    assert (advantages[0] > 0).tolist() == [True, False, False, True], "a right reply gets a positive advantage"
    assert torch.equal(group_advantages(torch.ones(6), 3), torch.zeros(6))


def test_group_advantages_doors():
    with pytest.raises(ValueError, match="rewards holds 6 completions, not a whole number of groups of group_size=4"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="rewards holds 0 completions"):
        group_advantages(torch.zeros(0), 4)
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        group_advantages(torch.zeros(4), 1)
    with pytest.raises(ValueError, match="rewards must be a 1-D float tensor .* got torch.int64"):
        group_advantages(torch.tensor([1, 0, 1, 0]), 2)
    with pytest.raises(ValueError, match=r"rewards must be a 1-D float tensor .* shape \(2, 4\)"):
        group_advantages(torch.zeros(2, 4), 4)
    with pytest.raises(TypeError, match="rewards must be a Tensor"):
        group_advantages([1.0, 0.0], 2)


# ------------------------------------------------------------------------------------------------ the GRPO loss
@pytest.fixture
def grpo_batch():
    generator = seeded(5)
    logps = -2 * torch.rand(4, 6, generator=generator)
    return {"logps": logps, "ref_logps": logps + 0.3 * torch.randn(4, 6, generator=generator),
            "advantages": torch.tensor([1.2, -0.7, 0.4, -0.9]),
            "mask": torch.tensor([[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 0, 0]])}


@pytest.mark.parametrize("loss_type", GRPO_LOSS_TYPES)
def test_at_ratio_one_the_clip_changes_neither_the_loss_nor_its_gradient(grpo_batch, loss_type):
    b = grpo_batch
    results = []
    for epsilon in (0.1, 0.5):
        logps = b["logps"].clone().requires_grad_()
        loss = grpo_loss(logps, b["logps"].clone(), b["ref_logps"], b["advantages"], b["mask"], 0.0, epsilon,
                         loss_type, max_completion_length=6)
        loss.backward()
        results.append((loss.detach(), logps.grad))
    (loss_a, grad_a), (loss_b, grad_b) = results
    assert torch.equal(loss_a, loss_b) and torch.equal(grad_a, grad_b)
    if loss_type == "grpo":  # at ratio 1 the loss is -mean(A), each token's gradient -A / (its reply's tokens * batch)
        assert abs(loss_a.item() + b["advantages"].mean().item()) < 1e-6
        lengths = b["mask"].sum(dim=1, keepdim=True)
        assert torch.allclose(grad_a, -b["advantages"][:, None] * b["mask"] / (lengths * 4), atol=1e-7)
    # away from ratio 1 (ratio e^0.3 = 1.35) epsilon matters: the clip cuts the gain of the positive advantages
    off = [grpo_loss(b["logps"], b["logps"] - 0.3, None, b["advantages"], b["mask"], 0.0, epsilon, loss_type,
                     max_completion_length=6).item() for epsilon in (0.1, 0.5)]
    assert off[0] > off[1] + 1e-3


def test_the_clipped_tokens_get_no_gradient(grpo_batch):
    """A positive advantage with the ratio above 1 + epsilon, a negative one below 1 - epsilon: the pessimistic term
    is the clipped constant, so those tokens get no gradient; the others do."""
    b = grpo_batch
    logps = b["logps"].clone().requires_grad_()
    old = b["logps"] - torch.tensor([[0.5], [-0.5], [0.0], [0.0]])  # ratio 1.65 (A > 0), 0.61 (A < 0), 1, 1
    grpo_loss(logps, old, None, b["advantages"], b["mask"], 0.0, 0.2).backward()
    assert (logps.grad[:2] == 0).all(), "a clipped token must not be pushed further"
    assert (logps.grad[2:][b["mask"][2:] == 1] != 0).all()


@pytest.mark.parametrize("kl_correction", [True, False])
@pytest.mark.parametrize("loss_type", GRPO_LOSS_TYPES)
def test_grpo_gradient_flows_into_logps_only_and_only_on_the_completion(grpo_batch, loss_type, kl_correction):
    b = grpo_batch
    logps = b["logps"].clone().requires_grad_()
    old = (b["logps"] - 0.1).requires_grad_()
    ref = b["ref_logps"].clone().requires_grad_()
    loss = grpo_loss(logps, old, ref, b["advantages"], b["mask"], 0.04, 0.2, loss_type, kl_correction=kl_correction,
                     max_completion_length=6)
    loss.backward()
    assert old.grad is None and ref.grad is None, "the sampler's and the reference's log-probs are constants"
    assert (logps.grad[b["mask"] == 0] == 0).all(), "a prompt or padding token has a gradient"
    assert (logps.grad[b["mask"] == 1] != 0).all()


def test_grpo_loss_doors(grpo_batch):
    b = grpo_batch
    args = (b["logps"], b["logps"], b["ref_logps"], b["advantages"], b["mask"])
    free = grpo_loss(b["logps"], b["logps"] - 0.1, None, b["advantages"], b["mask"], 0.0)  # beta 0: no reference
    assert torch.isfinite(free)
    assert free == grpo_loss(b["logps"], b["logps"] - 0.1, b["ref_logps"], b["advantages"], b["mask"], 0.0)
    with pytest.raises(ValueError, match="beta is 0.04 but ref_logps is None"):
        grpo_loss(b["logps"], b["logps"], None, b["advantages"], b["mask"], 0.04)
    with pytest.raises(ValueError, match=r"loss_type must be one of \('grpo', 'bnpo', 'dr_grpo', 'dapo'\), got 'ppo'"):
        grpo_loss(*args, 0.04, 0.2, "ppo")
    with pytest.raises(ValueError, match="loss_type='dr_grpo' divides by batch \\* max_completion_length"):
        grpo_loss(*args, 0.04, 0.2, "dr_grpo")
    with pytest.raises(ValueError, match="max_completion_length must be >= 6, got 5"):
        grpo_loss(*args, 0.04, 0.2, "dr_grpo", max_completion_length=5)
    assert torch.isfinite(grpo_loss(*args, 0.04, 0.2, "dr_grpo", max_completion_length=6))
    with pytest.raises(ValueError, match=r"beta must be in \[0, inf\)"):
        grpo_loss(*args, -0.1)
    for epsilon in (0.0, 1.0):
        with pytest.raises(ValueError, match=r"epsilon must be in \(0, 1\)"):
            grpo_loss(*args, 0.04, epsilon)
    with pytest.raises(ValueError, match=r"completion_mask must have logps' shape \(4, 6\)"):
        grpo_loss(*args[:4], b["mask"][:, 1:], 0.04)
    with pytest.raises(TypeError, match="kl_correction must be True or False"):
        grpo_loss(*args, 0.04, kl_correction=1)


# ------------------------------------------------------------------------------------------------ one GRPO step
def test_a_grpo_step_without_signal_leaves_the_policy_exactly_as_it_was(chat, heldout, monkeypatch):
    """Every reply judged wrong: every advantage is 0, so is every gradient, and AdamW without weight decay does not
    move (beta 0: no KL term that could pull either)."""
    model, tokenizer = chat
    monkeypatch.setattr(alignment, "judge_reply", lambda example, reply: False)
    policy = trainable_copy(model)
    before = snapshot(policy)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0)
    result = grpo_step(policy, None, tokenizer, heldout[:2], optimizer, group_size=3, beta=0.0, iterations=2,
                       generator=seeded(0), max_new_tokens=12)
    assert not changed(policy, before), "a batch without signal moved the policy"
    assert set(result) == {"reward", "no_signal", "distinct", "loss"}
    assert result["reward"] == 0.0 and result["no_signal"] == 1.0 and result["loss"] == 0.0
    generator = seeded(0)  # the same samples again: the policy has not moved
    distinct = [len(set(sample_group(model, tokenizer, e["instruction"], 3, generator, 12)[2])) for e in heldout[:2]]
    assert min(distinct) < 3, "upper instructions: some replies repeat, so distinct is not just group_size"
    assert result["distinct"] == sum(distinct) / 2, "distinct: different replies per group, averaged over groups"


def test_a_grpo_step_with_signal_moves_the_policy_and_not_the_reference(chat, heldout, monkeypatch):
    model, tokenizer = chat
    verdicts = iter([True, False] * 100)  # every group gets both rewards
    monkeypatch.setattr(alignment, "judge_reply", lambda example, reply: next(verdicts))
    monkeypatch.setattr(alignment, "reply_finished", lambda ids, mask, end_id: torch.ones(len(ids), dtype=torch.bool))
    policy, reference = trainable_copy(model), moved_copy(model)  # a reference that differs: the KL term counts
    policy_before, reference_before = snapshot(policy), snapshot(reference)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.0)
    result = grpo_step(policy, reference, tokenizer, heldout[:2], optimizer, group_size=4, beta=0.04, iterations=2,
                       generator=seeded(0), max_new_tokens=12)
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    assert changed(policy, policy_before) == trainable, "the adapters, and only they, must move"
    assert not changed(reference, reference_before), "the reference moved"
    assert result["reward"] == 0.5 and result["no_signal"] == 0.0
    assert 1 <= result["distinct"] <= 4 and math.isfinite(result["loss"])

    # the step by hand: the same samples, the sampler's and the reference's log-probs recorded once, then two AdamW
    # steps on grpo_loss (in the second the ratio is no longer 1)
    by_hand = trainable_copy(model)
    optimizer = torch.optim.AdamW([p for p in by_hand.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.0)
    generator = seeded(0)
    ids, mask = stack_rows([sample_group(by_hand, tokenizer, e["instruction"], 4, generator, 12)[:2]
                            for e in heldout[:2]], tokenizer.end_id)
    with torch.no_grad():
        old, ref = token_logprobs(by_hand, ids, mask), token_logprobs(reference, ids, mask)
    advantages = group_advantages(torch.tensor([1.0, 0.0] * 4), 4)
    for _ in range(2):
        loss = grpo_loss(token_logprobs(by_hand, ids, mask), old, ref, advantages, mask[:, 1:], 0.04, 0.2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert abs(loss.item() - result["loss"]) < 1e-6, "the last loss differs from the step done by hand"
    for (name, p), q in zip(by_hand.named_parameters(), policy.parameters()):
        assert torch.allclose(p, q, atol=1e-6), f"{name} differs from the step done by hand"


# ------------------------------------------------------------------------------------------------ scoring
def test_score_policy_is_judge_reply_of_the_greedy_and_the_sampled_replies(chat, heldout):
    model, tokenizer = chat
    scores = score_policy(model, tokenizer, heldout, 3, seeded(4), 48)
    assert set(scores) == {"upper", "last_word", "count", "continue", "all"}
    assert all(set(row) == {"greedy", "reward", "pass_at_n", "distinct"} for row in scores.values())
    assert 0 < scores["all"]["greedy"] < 1, "a set with right and wrong greedy replies"
    generator, want = seeded(4), {}  # the same calls in the same order: the same samples
    for example in heldout:
        replies = sample_group(model, tokenizer, example["instruction"], 3, generator, 48)[2]
        greedy = float(judge_reply(example, chat_reply(model, tokenizer, example["instruction"], 48)))
        for task in (example["task"], "all"):
            right = [judge_reply(example, reply) for reply in replies]
            want.setdefault(task, []).append((greedy, sum(right) / 3, float(any(right)), len(set(replies))))
    for task, rows in want.items():
        for k, name in enumerate(("greedy", "reward", "pass_at_n", "distinct")):
            assert scores[task][name] == pytest.approx(sum(r[k] for r in rows) / len(rows), abs=1e-4), (task, name)


def test_the_training_functions_refuse_what_they_cannot_use_before_any_work(chat):
    """Doors found in review: each names the argument, and grpo_step refuses before it samples anything."""
    model, tokenizer = chat
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    example = {"task": "count", "instruction": "How many words?\nHo, Romeo!", "response": "two"}
    with pytest.raises(TypeError, match="beta is 0.04, so the KL penalty needs the reference model"):
        grpo_step(model, None, tokenizer, [example], optimizer, beta=0.04)
    with pytest.raises(TypeError, match="examples must be a non-empty list"):
        grpo_step(model, model, tokenizer, [], optimizer)
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        grpo_step(model, model, tokenizer, [example], optimizer, group_size=1)
    with pytest.raises(TypeError, match="examples must be a non-empty list"):
        kl_to_reference(model, model, tokenizer, [], 2)
    one = torch.zeros(1)
    with pytest.raises(ValueError, match=r"beta must be in \(0, inf\)"):
        dpo_loss(one, one, one, one, math.inf)
    pairs = [{**example, "chosen": "two", "rejected": "three"}]
    with pytest.raises(TypeError, match="with watch_every >= 1"):
        train_dpo(model, model, tokenizer, pairs, 0.1, 1e-3, 1, watch=dict, watch_every=0)
    with pytest.raises(ValueError, match="beta must be in"):
        train_dpo(model, model, tokenizer, pairs, 0.0, 1e-3, 1)  # refused before the reference's forward pass
    with pytest.raises(ValueError, match="epsilon must be in"):
        grpo_step(model, model, tokenizer, [example], optimizer, epsilon=1.5)  # refused before any sampling
    on_meta = frozen_copy(model).to("meta")  # a model elsewhere than the generator, as on a laptop with a GPU
    with pytest.raises(ValueError, match="generator is on cpu and the model on meta"):
        sample_group(on_meta, tokenizer, "Hi", 2, seeded(0))
    with pytest.raises(TypeError, match="examples must be a non-empty list"):
        score_policy(model, tokenizer, [])
    with pytest.raises(ValueError, match="samples must be >= 1"):
        score_policy(model, tokenizer, [example], samples=0)
    with pytest.raises(ValueError, match="rows is empty"):
        stack_rows([], 0)
    with pytest.raises(ValueError, match="model has no LoRA matrices"):
        policy_copy(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="watch must be a function"):
        train_dpo(model, model, tokenizer, pairs, 0.1, 1e-3, 1, watch="kl", watch_every=1)


def test_a_reply_cut_off_before_its_end_earns_nothing(chat, monkeypatch):
    """judge_reply would accept a "continue" reply cut off mid-line; the rollout gives it reward 0, because a reply
    that never reached <|end|> is not an answer (the same rule keeps it out of preference pairs)."""
    model, tokenizer = chat
    monkeypatch.setattr(alignment, "judge_reply", lambda example, reply: True)  # the checker would accept anything
    example = {"task": "continue", "instruction": "Speak as HAMLET.", "response": "HAMLET:\nTo be."}
    input_ids, mask, rewards, _ = alignment.rollout(model, tokenizer, [example], 6, seeded(0), max_new_tokens=3)
    finished = alignment.reply_finished(input_ids, mask, tokenizer.end_id)
    assert not bool(finished.all()), "3 tokens: most replies are cut off"
    assert rewards.tolist() == finished.float().tolist(), "reward 1 only where the reply reached <|end|>"

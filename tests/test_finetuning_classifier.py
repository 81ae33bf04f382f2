"""Issue 32, a classifier from a language model: the play task's split keeps every speech in one split, the
classifier's head reads each passage's last real position, the doors give clear errors, and a short training run
beats the majority class on a small synthetic task. Issue 44: the word-order task (same bags, another order; test
lines unseen), the probe's cached states, the logistic regression at its optimum, and the shipped results' gate."""

import json
import random

import pytest
import torch
import torch.nn.functional as F

from course_lib.config import GPTConfig
from course_lib.finetuning import (MOVABLE, BagOfChars, ClassifierGPT, Passages, accuracy, encode_passages,
                                   fit_logistic, last_states, order_lines, order_passages, play_passages, play_speeches,
                                   shuffle_words, stratified_split, train_classifier, word_frequencies)
from course_lib.model import GPTModel
from course_lib.pretrained import load_shakespeare_gpt
from course_lib.tokenization import DATA_DIR, CharTokenizer
from course_lib.training import load_shakespeare

CFG = GPTConfig(vocab_size=8, context_length=12, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0)


def small_classifier(seed: int = 0, num_classes: int = 3) -> ClassifierGPT:
    torch.manual_seed(seed)
    return ClassifierGPT(GPTModel(CFG), num_classes).eval()


@pytest.fixture(scope="module")
def play_task():
    tokenizer = load_shakespeare_gpt()[1]
    return *play_passages(tokenizer), tokenizer


def test_play_speeches_cover_the_corpus():
    speeches, labels, plays = play_speeches()
    assert len(speeches) == 6777 and len(plays) == 7 and labels == sorted(labels)  # the plays follow each other
    assert speeches[0].startswith("Who's there?")  # Hamlet's first speech, without "BARNARDO:"
    assert not any(line.endswith(":") and line.isupper() for s in speeches for line in s.split("\n"))
    assert sum(len(s) for s in speeches) < len(load_shakespeare())  # the SPEAKER: lines are gone


def test_no_speech_in_two_splits(play_task):
    splits, plays, tokenizer = play_task
    sources = {name: set(part.source.tolist()) for name, part in splits.items()}
    assert not (sources["train"] & sources["val"] or sources["train"] & sources["test"]
                or sources["val"] & sources["test"])
    firsts = sorted(set().union(*sources.values()))
    assert firsts[0] == 0 and len(firsts) == sum(len(p) for p in splits.values())
    # each passage is the run of speeches from its first speech to the next passage's first: no speech twice
    speeches, labels, _ = play_speeches()
    ends = firsts[1:] + [len(speeches)]
    for part in splits.values():
        for i in range(0, len(part), 97):
            start = int(part.source[i])
            end = ends[firsts.index(start)]
            text = "\n".join(speeches[start:end])
            passage = tokenizer.decode(part.token_ids[i, :part.lengths[i]].tolist())
            assert passage == text[-128:] and set(labels[start:end]) == {int(part.labels[i])}
    shares = {name: torch.bincount(p.labels, minlength=7).float() / len(p) for name, p in splits.items()}
    assert (shares["test"] - shares["train"]).abs().max() < 0.02  # stratified by play


def test_split_is_seeded():
    labels = [k % 3 for k in range(30)]
    a, b = stratified_split(labels, (0.6, 0.2, 0.2), seed=1), stratified_split(labels, (0.6, 0.2, 0.2), seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert sorted(torch.cat(a).tolist()) == list(range(30))
    assert not all(torch.equal(x, y) for x, y in zip(a, stratified_split(labels, (0.6, 0.2, 0.2), seed=2)))


def test_head_reads_the_last_real_position():
    clf = small_classifier()
    ids = torch.randint(8, (4, 10))  # (batch, tokens)
    lengths = torch.tensor([10, 7, 3, 1])
    with torch.no_grad():
        x = clf.model.embedding(ids)
        for block in clf.model.trf_blocks:
            x = block(x)
        states = clf.model.final_norm(x)  # (4, 10, 32)
        expected = clf.out_head(states[torch.arange(4), lengths - 1])  # (4, 3)
        logits = clf(ids, lengths)
        first = clf.out_head(states[:, 0])
        mean = clf.out_head(states.mean(1))
    assert torch.allclose(logits, expected, atol=1e-6), "the head must read position lengths - 1 of each row"
    assert not torch.allclose(logits[:3], first[:3], atol=1e-3), "the head reads the first position, which has " \
        "read one token only"
    assert not torch.allclose(logits, mean, atol=1e-3), "the head reads the mean of the states, not the last one"
    assert torch.allclose(clf(ids), clf.out_head(states[:, -1]), atol=1e-6)  # no lengths: every token is real


def test_earlier_tokens_reach_the_head_only_through_attention():
    clf = small_classifier()
    ids = torch.randint(8, (1, 10))
    changed = ids.clone()
    changed[0, 2] = (ids[0, 2] + 1) % 8
    with torch.no_grad():
        assert not torch.allclose(clf(ids), clf(changed), atol=1e-5)  # position 2 is read by the last one
        for block in clf.model.trf_blocks:  # cut attention out: the last state no longer sees position 2
            block.att.forward = lambda x, *rest: torch.zeros_like(x)
        assert torch.equal(clf(ids), clf(changed))


def test_the_head_is_the_models_own_out_head():
    model = GPTModel(CFG)
    clf = ClassifierGPT(model, 3)
    assert clf.model is model and clf.out_head is model.out_head and model.out_head.out_features == 3
    assert not any(p is model.embedding.tok_emb.weight for p in clf.out_head.parameters())  # the tie is gone
    ids = torch.randint(8, (2, 6))
    with torch.no_grad():  # the model's own forward gives the class logits at every position
        assert torch.equal(clf(ids, torch.tensor([6, 3])), model(ids)[torch.arange(2), torch.tensor([5, 2])])
    tied = sum(p.numel() for p in GPTModel(CFG).parameters())  # CFG ties the head to the embedding, which stays
    assert sum(p.numel() for p in clf.parameters()) == tied + CFG.emb_dim * 3 + 3


def test_right_padding_does_not_change_the_logits():
    clf = small_classifier()
    ids = torch.randint(8, (1, 5))
    padded = torch.cat([ids, torch.randint(8, (1, 7))], 1)  # (1, 12): 7 tokens of anything after the passage
    with torch.no_grad():
        assert (clf(ids) - clf(padded, torch.tensor([5]))).abs().max() < 1e-5


def test_a_short_run_beats_the_majority_class():
    # label: does token 7 occur in the passage? Only attention over the whole passage can tell.
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(7, (384, 8), generator=generator)
    has = torch.rand(384, generator=generator) < 0.5
    ids[has, torch.randint(8, (int(has.sum()),), generator=generator)] = 7
    data = Passages(ids, torch.full((384,), 8), has.long(), torch.arange(384))
    train, test = data[torch.arange(256)], data[torch.arange(256, 384)]
    clf = small_classifier(num_classes=2)
    majority = max(test.labels.float().mean().item(), 1 - test.labels.float().mean().item())
    before = accuracy(clf, test)
    losses = train_classifier(clf, train, epochs=8, lr=3e-3, batch_size=32, seed=0)
    after = accuracy(clf, test)
    assert losses[-1] < losses[0] and after > max(majority, before) + 0.2, (before, after, majority)
    assert after == accuracy(clf, test) and not clf.training  # eval mode after training, so accuracy repeats


def test_training_is_reproducible():
    data = encode_passages(["abcab", "bca", "cccaab", "ab"], [0, 1, 2, 1], CharTokenizer("abc"), max_chars=4)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        bag = BagOfChars(3, 3)
        runs.append((train_classifier(bag, data, epochs=3, lr=0.1, batch_size=2, seed=5), bag.out_head.weight))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])
    assert data.token_ids.tolist() == [[1, 2, 0, 1], [1, 2, 0, 0], [2, 0, 0, 1], [0, 1, 0, 0]]
    assert data.lengths.tolist() == [4, 3, 4, 2]  # the last max_chars characters, padded on the right


@pytest.mark.parametrize("call, error, match", [
    (lambda: ClassifierGPT(torch.nn.Linear(2, 2), 3), TypeError, "model must be a GPTModel"),
    (lambda: ClassifierGPT(GPTModel(CFG), 1), ValueError, "num_classes must be >= 2"),
    (lambda: small_classifier()(torch.zeros(2, 4, dtype=torch.long), torch.tensor([4])), ValueError,
     r"lengths has shape \(1,\)"),
    (lambda: small_classifier()(torch.zeros(2, 4, dtype=torch.long), torch.tensor([4, 5])), ValueError,
     r"lengths must be in \[1, 4\]"),
    (lambda: small_classifier()(torch.zeros(2, 4, dtype=torch.long), torch.tensor([4.0, 2.0])), TypeError,
     "lengths must be an integer tensor"),
    (lambda: small_classifier()(torch.zeros(1, 13, dtype=torch.long)), ValueError, "13 tokens"),
    (lambda: encode_passages(["ab"], [0, 1], CharTokenizer("ab"), 4), ValueError, "one label per text"),
    (lambda: encode_passages(["ab", ""], [0, 1], CharTokenizer("ab"), 4), ValueError, r"texts\[1\] is empty"),
    (lambda: encode_passages(["ab"], [0], CharTokenizer("ab"), 0), ValueError, "max_chars must be >= 1"),
    (lambda: stratified_split([0, 1], (0.5, 0.6), 0), ValueError, "sum to 1"),
    (lambda: play_passages(CharTokenizer("ab"), fractions=(0.5, 0.5)), ValueError, "three shares"),
    (lambda: play_speeches("too short"), ValueError, "pass the shipped corpus"),
    (lambda: BagOfChars(3, 1), ValueError, "num_classes must be >= 2"),
])
def test_doors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_train_classifier_doors():
    data = encode_passages(["ab", "ba"], [0, 1], CharTokenizer("ab"), 2)
    frozen = BagOfChars(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no parameter that requires grad"):
        train_classifier(frozen, data, epochs=1, lr=0.1)
    with pytest.raises(TypeError, match="data must be a Passages"):
        train_classifier(BagOfChars(2, 2), (data.token_ids, data.labels), epochs=1, lr=0.1)
    with pytest.raises(ValueError, match="lr must be in"):
        train_classifier(BagOfChars(2, 2), data, epochs=1, lr=0.0)
    with pytest.raises(TypeError, match="data must be a Passages"):
        accuracy(BagOfChars(2, 2), [1, 2])


# ------------------------------------------------------------------------- issue 44: the word-order task and the probe
def pairs(text: str) -> list[str]:
    return sorted(text[i:i + 2] for i in range(len(text) - 1))


def test_shuffle_words_keeps_every_bag_and_changes_the_order():
    rng, lines = random.Random(0), order_lines(load_shakespeare()[:200_000])
    assert len(lines) > 2000
    for line in lines[::7]:
        shuffled = shuffle_words(line, rng)
        assert shuffled != line
        assert sorted(shuffled) == sorted(line) and pairs(shuffled) == pairs(line)  # characters and their pairs
        assert sorted(shuffled.split(" ")) == sorted(line.split(" "))  # words
        old, new = line.split(" "), shuffled.split(" ")
        assert old[0] == new[0] and old[-1] == new[-1]  # the first and last words stay
        assert all(a == b for a, b in zip(old, new) if not MOVABLE.fullmatch(a))  # capitals and punctuation stay


@pytest.fixture(scope="module")
def order_task():
    tokenizer = load_shakespeare_gpt()[1]
    return order_passages(tokenizer), tokenizer


def test_order_passages_test_lines_are_unseen_and_each_split_is_half_shuffled(order_task):
    splits, tokenizer = order_task
    text = load_shakespeare()
    cut = int(len(text) * 0.9)
    assert {name: len(part) for name, part in splits.items()} == {"train": 6000, "val": 600, "test": 1741}
    for part in splits.values():
        assert abs(int(part.labels.sum()) - len(part) / 2) <= 0.5  # half and half
    assert not set(splits["train"].source.tolist()) & set(splits["val"].source.tolist())  # no line in both
    lines = {name: [tokenizer.decode(ids[:n].tolist()) for ids, n in zip(part.token_ids, part.lengths)]
             for name, part in splits.items()}
    pools = {"train": order_lines(text[:cut]), "test": order_lines(text[cut:], exclude=text[:cut])}
    for name, pool in (("train", "train"), ("val", "train"), ("test", "test")):
        for k in range(0, len(lines[name]), 11):
            original = pools[pool][int(splits[name].source[k])]
            if splits[name].labels[k] == 0:
                assert lines[name][k] == original
            else:
                assert lines[name][k] != original and sorted(lines[name][k]) == sorted(original)
            if name == "test":
                assert original not in text[:cut]  # text no course model trained on
            else:
                assert original in text[:cut]
    again = order_passages(tokenizer)
    assert all(torch.equal(again[name].token_ids, splits[name].token_ids) for name in splits)  # seeded


def test_fit_logistic_reaches_the_optimum():
    generator = torch.Generator().manual_seed(0)
    x = 3 + 2 * torch.randn(200, 5, generator=generator)  # not standardised: the fit must handle it
    y = (x[:, 0] + 0.5 * torch.randn(200, generator=generator) > 3).long()  # not separable
    layer, penalty = fit_logistic((x, y), (x, y), 2, penalties=(1e-2,))
    assert penalty == 1e-2
    mean, std = x.mean(0), x.std(0)
    weight = (layer.weight.detach() * std).requires_grad_(True)  # the standardised problem the fit solved
    bias = (layer.bias.detach() + layer.weight.detach() @ mean).requires_grad_(True)
    loss = F.cross_entropy((x - mean) / std @ weight.T + bias, y) + 1e-2 * weight.pow(2).sum()
    loss.backward()
    assert weight.grad.abs().max() < 1e-4 and bias.grad.abs().max() < 1e-4  # a stationary point of a convex loss
    assert (layer(x).argmax(-1) == y).float().mean() > 0.8


def test_last_states_are_what_a_probe_in_classifier_gpt_reads():
    torch.manual_seed(0)
    body = GPTModel(CFG).train()  # dropout is 0 here; the mode must come back all the same
    tokenizer = CharTokenizer("abcdefgh")
    data = encode_passages(["abcabcabca", "hg", "fedcba"], [0, 1, 2], tokenizer, 12)
    states = last_states(body, data, batch_size=2)
    assert states.shape == (3, 32) and body.training
    classifier = ClassifierGPT(body, 3).eval()
    with torch.no_grad():
        assert torch.allclose(classifier.out_head(states), classifier(data.token_ids, data.lengths), atol=1e-5)


def test_word_frequencies_vocabulary_is_the_training_words_seen_twice():
    features, vocabulary = word_frequencies(["O Rome, Rome!", "the Rome of o'er", "o'er and o'er"])
    assert vocabulary == ["o'er", "rome"]
    assert torch.allclose(features, torch.tensor([[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]]))  # shares of the known words
    unseen, same = word_frequencies(["Caesar"], vocabulary)
    assert same == vocabulary and torch.equal(unseen, torch.zeros(1, 2))


def test_the_shipped_results_meet_the_gate_with_their_noise():
    results = json.loads((DATA_DIR / "classifier_results.json").read_text(encoding="utf-8"))
    for task in results["tasks"].values():
        for row in task["methods"]:
            tests = [run["test"] for run in row["runs"]]
            assert row["test_mean"] == pytest.approx(sum(tests) / len(tests))
            assert row["noise"] == max(max(tests) - min(tests), max(run["bootstrap"] for run in row["runs"]))
            assert len(row["runs"]) in (1, 3)
    rows = {row["method"]: row for row in results["tasks"]["order"]["methods"]}
    bags = max(rows[m]["test_mean"] for m in ("bag of characters", "bag of words"))
    tuned = max(rows[m]["test_mean"] for m in ("full fine-tuning", "LoRA r=8 + head"))
    assert abs(bags - 0.5) < 0.05  # a bag sees one input for both answers
    best_bag = max((rows[m] for m in ("bag of characters", "bag of words")), key=lambda row: row["test_mean"])
    best_tuned = max((rows[m] for m in ("full fine-tuning", "LoRA r=8 + head")), key=lambda row: row["test_mean"])
    assert tuned - bags >= 0.15 and tuned - bags > best_bag["noise"] + best_tuned["noise"]  # beyond both noises

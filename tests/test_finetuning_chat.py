"""Notebook 14, instruction following: the vocabulary grows without changing the old model, the masked loss counts
only the response and equals TRL's completion-only loss on the same batch, the chat loop stops at <|end|>, the
instruction set is held out by construction, the shipped adapter matches its card, and the doors."""

import hashlib
import importlib
import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from course_lib.config import GPTConfig
from course_lib.finetuning import (CHAT_TOKENS, IGNORE_INDEX, INSTRUCTION_TASKS, NUMBER_WORDS, SHAKESPEARE_CHAT_DIR,
                                   ChatTokenizer, apply_lora, chat_batch, chat_loop, chat_loss, chat_reply,
                                   chat_state_dict, copyable, format_chat, generate_replies, grow_vocabulary,
                                   judge_reply, line_words, load_shakespeare_chat, make_instructions, prompt_spans,
                                   train_new_rows)
from course_lib.model import GPTModel
from course_lib.pretrained import load_shakespeare_gpt, save_gpt2
from course_lib.training import TrainConfig, load_shakespeare

PAIRS = [("Upper case:\nGood morrow, father.", "GOOD MORROW, FATHER."),
         ("Last word, in capitals:\nIs it near day?", "DAY"), ("How many words?\nGood morrow, cousin.", "three"),
         ("Speak as HAMLET.", "HAMLET:\nTo be, or not to be.")]


def load_script():
    """The chat adapter's script as a module (course_lib/data holds scripts, read as a namespace package)."""
    return importlib.import_module("course_lib.data.make_shakespeare_chat")


@pytest.fixture(scope="module")
def shipped_base():
    torch.set_num_threads(1)
    return load_shakespeare_gpt("cpu")


@pytest.fixture(scope="module")
def grown(shipped_base):
    model, char_tokenizer = shipped_base
    return grow_vocabulary(model, len(CHAT_TOKENS)).eval(), ChatTokenizer(char_tokenizer)


# ------------------------------------------------------------------ the vocabulary grows, the old model stays
def test_growing_keeps_old_rows_bit_for_bit_and_old_logits_to_rounding(shipped_base, grown):
    base, char_tokenizer = shipped_base
    model, tokenizer = grown
    assert model.cfg.vocab_size == 68 and tokenizer.vocab_size == 68 and base.cfg.vocab_size == 65
    for old, new in ((base.embedding.tok_emb.weight, model.embedding.tok_emb.weight),
                     (base.out_head.weight, model.out_head.weight)):
        assert new.shape == (68, 256) and torch.equal(new[:65], old)
        assert torch.equal(new[65:], old.mean(dim=0, keepdim=True).expand(3, -1)), "new rows: the old rows' mean"
    ids = torch.tensor([char_tokenizer.encode(load_shakespeare()[-128:])])  # (1, 128) of validation text
    with torch.no_grad():
        old_logits, new_logits = base(ids), model(ids)
    assert torch.allclose(new_logits[..., :65], old_logits, atol=1e-5), "the old tokens' logits change on old text"
    mean_logit = old_logits.mean(dim=-1)  # a new token's logit is the mean of the old logits
    assert (new_logits[..., 65:] - mean_logit.unsqueeze(-1)).abs().max() < 1e-4


def test_a_tied_model_stays_tied_and_the_original_is_untouched():
    torch.manual_seed(0)
    model = GPTModel(GPTConfig(vocab_size=10, context_length=8, emb_dim=8, n_heads=2, n_layers=1))
    before = model.embedding.tok_emb.weight.detach().clone()
    grown = grow_vocabulary(model, 2)
    assert grown.out_head.weight is grown.embedding.tok_emb.weight and grown.out_head.weight.shape == (12, 8)
    assert model.cfg.vocab_size == 10 and torch.equal(model.embedding.tok_emb.weight, before)
    assert grown(torch.tensor([[11, 3]])).shape == (1, 2, 12)


def test_training_moves_only_the_new_rows(grown):
    model, tokenizer = grown
    model = grow_vocabulary(model, 1)  # a private copy (69 tokens): the fixture stays as it was
    apply_lora(model, ["att.out_proj"], r=2, alpha=4)
    params = train_new_rows(model, 65)
    old = [p[:65].detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0)
    inputs, targets = chat_batch(tokenizer, PAIRS[:2], 128)
    for _ in range(2):
        optimizer.zero_grad()
        chat_loss(model, inputs, targets).backward()
        optimizer.step()
    assert all(torch.equal(p[:65], o) for p, o in zip(params, old)), "an old row moved"
    assert not torch.equal(params[1][65:68], grown[0].out_head.weight[65:68]), "the new head rows did not train"
    assert params[1].grad[:65].abs().max() == 0 and params[1].grad[65:68].abs().max() > 0


# ------------------------------------------------------------------ the chat format and the masked loss
def test_the_chat_tokenizer_reads_each_chat_token_as_one_id(grown):
    _, tokenizer = grown
    text = format_chat("Hi", "Ho")
    assert tokenizer.encode(text) == [65, 18, 47, 66, 18, 53, 67] and tokenizer.decode(tokenizer.encode(text)) == text
    assert (tokenizer.user_id, tokenizer.assistant_id, tokenizer.end_id) == (65, 66, 67)


def test_the_batch_masks_every_prompt_token(grown):
    _, tokenizer = grown
    inputs, targets = chat_batch(tokenizer, PAIRS, 128)
    for row, (instruction, response) in enumerate(PAIRS):
        n_prompt = len(tokenizer.encode(format_chat(instruction)))
        full = tokenizer.encode(format_chat(instruction, response))
        assert inputs[row, :len(full) - 1].tolist() == full[:-1]
        assert (targets[row, :n_prompt - 1] == IGNORE_INDEX).all(), "a prompt token is counted in the loss"
        assert targets[row, n_prompt - 1:len(full) - 1].tolist() == tokenizer.encode(response) + [67]
        assert (targets[row, len(full) - 1:] == IGNORE_INDEX).all(), "the padding is counted in the loss"


def test_the_masked_loss_ignores_the_prompt_and_is_the_mean_over_response_tokens(grown):
    model, tokenizer = grown
    inputs, targets = chat_batch(tokenizer, PAIRS, 128)
    with torch.no_grad():
        loss = chat_loss(model, inputs, targets)
        logits = model(inputs)
        changed = inputs.clone()
        changed[0, 1:8] = tokenizer.encode("XXXXXXX")[0]  # the prompt's text changes, its targets stay ignored
        keep = targets != IGNORE_INDEX
        by_hand = -logits.log_softmax(-1).gather(-1, targets.clamp(min=0).unsqueeze(-1))[..., 0][keep].mean()
        full = F.cross_entropy(logits.flatten(0, 1), inputs.roll(-1, 1).flatten())  # every token counted
    assert (loss - by_hand).abs() < 1e-5 and (loss - full).abs() > 1e-2


def test_the_masked_loss_equals_trls_completion_only_loss_on_the_same_batch(grown, tmp_path):
    """TRL's SFTTrainer tokenizes prompt/completion pairs, masks the prompt itself (completion_only_loss=True),
    collates, and computes its loss on a transformers GPT2LMHeadModel holding the same weights."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    model, tokenizer = grown
    vocab = {ch: i for i, ch in enumerate(tokenizer.char_tokenizer.chars)} | tokenizer.special_ids
    core = Tokenizer(models.WordLevel(vocab, unk_token=None))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one piece per character
    core.decoder = decoders.Fuse()
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|end|>", pad_token="<|end|>",
                                           additional_special_tokens=list(CHAT_TOKENS[:2]))
    hf_model = GPT2LMHeadModel.from_pretrained(save_gpt2(model, tmp_path / "grown")).eval()
    dataset = Dataset.from_list([{"prompt": format_chat(i), "completion": r} for i, r in PAIRS])  # TRL adds <|end|>
    config = SFTConfig(output_dir=str(tmp_path / "sft"), completion_only_loss=True, report_to=[], use_cpu=True,
                       per_device_train_batch_size=len(PAIRS), max_length=None)
    trainer = SFTTrainer(model=hf_model, args=config, train_dataset=dataset, processing_class=hf_tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(PAIRS))])
    inputs, targets = chat_batch(tokenizer, PAIRS, 128)
    assert torch.equal(batch["input_ids"][:, :-1], inputs), "the same token ids, padded alike"
    assert torch.equal(batch["labels"][:, 1:], targets), "TRL's labels, shifted by one, are our targets"
    hf_model.eval()
    with torch.no_grad():
        theirs = trainer.compute_loss(hf_model, dict(batch))
        ours = chat_loss(model, inputs, targets)
    assert (theirs - ours).abs() < 1e-5


# ------------------------------------------------------------------ replies and the chat loop
def test_chat_reply_and_the_loop_stop_at_the_end_token(grown, monkeypatch):
    model, tokenizer = grown
    # a scripted generate: "ab", <|end|>, then "ccc" that must not be shown
    said = tokenizer.encode("ab") + [tokenizer.end_id] + tokenizer.encode("ccc")
    calls = []

    def scripted(model_, token_ids, max_new_tokens, **kwargs):
        assert kwargs["eos_id"] == tokenizer.end_id
        calls.append(max_new_tokens)
        new = said[:max_new_tokens]
        return torch.cat([token_ids, torch.tensor([new])], dim=1)

    import course_lib.finetuning as finetuning
    monkeypatch.setattr(finetuning, "generate", scripted)
    assert chat_reply(model, tokenizer, "Hi") == "ab" and calls[-1] == 128 - 4
    lines = iter(["Hi", "Ho", ""])
    written = []
    assert chat_loop(model, tokenizer, read=lambda _: next(lines), write=written.append) == [("Hi", "ab"), ("Ho", "ab")]
    assert written == ["model: ab", "model: ab"]


def test_chat_reply_is_generate_replies_for_one(grown):
    model, tokenizer = grown
    instruction = "Upper case:\nO Rome!"
    prompt, new, replies = generate_replies(model, tokenizer, instruction, 3, 12)
    assert prompt.shape == (3, len(tokenizer.encode(format_chat(instruction)))) and new.shape[0] == 3
    assert new.shape[1] <= 12 and len(replies) == 3 and all("<|end|>" not in r for r in replies)
    assert replies == [replies[0]] * 3, "greedy: the same reply in every row"
    assert chat_reply(model, tokenizer, instruction, 12) == replies[0]


def test_generate_really_stops_at_the_end_token(grown):
    model, tokenizer = grown
    model = grow_vocabulary(model, 1)  # a copy (69 tokens) whose head always prefers <|end|>, id 67
    model.out_head = torch.nn.Linear(256, 69)
    with torch.no_grad():
        model.out_head.weight.zero_()
        model.out_head.bias.copy_(F.one_hot(torch.tensor(tokenizer.end_id), 69).float())
    from course_lib.generation import generate
    prompt = torch.tensor([tokenizer.encode(format_chat("Hi"))])
    out = generate(model, torch.cat([prompt, prompt]), 20, eos_id=tokenizer.end_id)
    assert out.shape[1] == prompt.shape[1] + 1 and (out[:, -1] == tokenizer.end_id).all()  # stopped at once
    model.cfg = replace(model.cfg, vocab_size=68)  # the tokenizer's size, for chat_reply's door
    with torch.no_grad():
        model.out_head.bias[68] = -1.0
    assert chat_reply(model, tokenizer, "Hi") == ""


# ------------------------------------------------------------------ the instruction set
def test_held_out_instructions_come_from_unseen_text_and_are_checkable():
    text = load_shakespeare()
    split = int(len(text) * 0.9)
    heldout = make_instructions(text[split:], 20, 7, exclude=text[:split])
    assert [e["task"] for e in heldout[::20]] == ["upper", "last_word", "count", "continue"]
    for e in heldout:
        line = e["instruction"].split("\n")[-1] if e["task"] != "continue" else e["response"].split("\n")[1]
        assert line not in text[:split] and line in text[split:]
        assert judge_reply(e, e["response"])
        assert e["task"] == "continue" or not judge_reply(e, e["response"] + "!"), "exact match, not a prefix"
        line_said = line_words(e["instruction"].split("\n")[-1])
        # upper and last_word ask for capitals their line lacks; a count can stand in its line ("two tribunes:")
        assert copyable(e) == (e["task"] == "count" and e["response"] in line_said), e
    assert make_instructions(text[split:], 20, 7, exclude=text[:split]) == heldout, "seeded"
    upper = next(e for e in heldout if e["task"] == "upper")
    assert upper["response"] == upper["instruction"].removeprefix("Upper case:\n").upper()
    for count in [e for e in heldout if e["task"] == "count"]:
        assert NUMBER_WORDS.index(count["response"]) == len(line_words(count["instruction"].split("\n")[1]))
    speak = next(e for e in heldout if e["task"] == "continue")
    who = speak["response"].split(":")[0]
    assert judge_reply(speak, f"{who}:\nAnything at all.") and not judge_reply(speak, "Anything at all.")


def test_the_copy_baseline_finds_an_answer_that_stands_in_the_prompt():
    """copyable must say yes when some span is the answer (a task that copies), and no when none is."""
    asked = {"task": "last_word", "instruction": "Last word, in capitals:\nCry HAVOC", "response": "HAVOC"}
    assert copyable(asked), "the last word already in capitals is a span"
    assert not copyable({**asked, "instruction": "Last word, in capitals:\nCry havoc", "response": "HAVOC"})
    counted = {"task": "count", "instruction": "How many words?\nO, three words!", "response": "three"}
    assert copyable(counted), "a word stripped of its punctuation is a span"
    assert not copyable({**counted, "instruction": "How many words?\nThree words here"}), "a copy keeps the case"
    assert "O Rome" in prompt_spans("Upper case:\nO Rome, farewell!") and "Rome, farewell!" in prompt_spans(
        "Upper case:\nO Rome, farewell!")
    assert "Upper case:\nO Rome" in prompt_spans("Upper case:\nO Rome")  # runs of whole lines


# ------------------------------------------------------------------ the shipped adapter
@pytest.fixture(scope="module")
def card():
    return json.loads((SHAKESPEARE_CHAT_DIR / "card.json").read_text(encoding="utf-8"))


def test_the_shipped_files_match_their_card_and_stay_small(card):
    script = load_script()
    assert set(card["sha256"]) == set(script.SHIPPED_FILES)
    for name, digest in card["sha256"].items():
        assert hashlib.sha256((SHAKESPEARE_CHAT_DIR / name).read_bytes()).hexdigest() == digest, name
    assert (SHAKESPEARE_CHAT_DIR / "README.md").read_text(encoding="utf-8") == script.render_card(card)
    assert sum(f.stat().st_size for f in SHAKESPEARE_CHAT_DIR.iterdir()) < 3_000_000, "an adapter, not a model"
    assert card["config"]["train_config"] == {**vars(script.RECIPE.train_config)}
    train, heldout = script.instruction_sets(script.RECIPE)
    assert card["instructions"] == {"train": len(train), "heldout": len(heldout), "heldout_sha256":
                                    hashlib.sha256(json.dumps(heldout).encode()).hexdigest()}
    base, noise = card["baselines"]["exact_match"], card["noise"]
    for task in INSTRUCTION_TASKS:  # the gate: no copying, at least 60% after fine-tuning
        runs = [run["exact_match"][task] for run in card["seeds"]]
        assert base["copy"][task] <= 0.2 and noise[task]["mean"] == pytest.approx(sum(runs) / len(runs))
        assert noise[task]["mean"] >= 0.6, task
        assert min(runs) > max(base[name][task] for name in base), f"{task}: every seed beats every baseline"
        assert noise[task]["noise"] == max(max(runs) - min(runs), max(r["bootstrap"][task] for r in card["seeds"]))
    assert [run["seed"] for run in card["seeds"]] == [0, 1, 2]
    right = [judge_reply(e, r) for e, r in zip(heldout, card["fine_tuned_replies"], strict=True)]
    assert sum(right) / len(right) == pytest.approx(card["seeds"][0]["exact_match"]["all"])


def test_the_shipped_chat_model_gives_the_replies_on_its_card(card):
    script = load_script()
    model, tokenizer = load_shakespeare_chat("cpu")
    _, heldout = script.instruction_sets(script.RECIPE)
    for entry in card["heldout_replies"]:
        assert chat_reply(model, tokenizer, heldout[entry["index"]]["instruction"]) == entry["fine_tuned"]
    sample = card["samples"][0]
    assert chat_reply(model, tokenizer, sample["instruction"]) == sample["reply"]
    state = chat_state_dict(model, 65)
    assert state["out_head.new_rows"].shape == (3, 256) and len(state) == 2 + 2 * 6 * 4
    assert state["trf_blocks.0.att.W_query.lora_A"].shape[0] == card["config"]["r"]


def test_a_short_run_of_the_script_rebuilds_bit_for_bit(tmp_path, monkeypatch):
    """The script at 2 steps of 2 instructions, 2 held-out per task, twice: the same bytes."""
    digests = []
    for run in ("a", "b"):
        script = load_script()
        tiny = replace(script.RECIPE, train_per_task=4, heldout_per_task=2,
                       train_config=TrainConfig(total_steps=2, batch_size=2, max_lr=1e-3, min_lr=1e-4, warmup_steps=1,
                                                weight_decay=0.0, eval_every=1, eval_batches=1))
        monkeypatch.setattr(script, "SAMPLES", script.SAMPLES[:1])
        monkeypatch.setattr(script, "plain_reply", lambda *args, **kwargs: "")  # the base model's replies are slow
        monkeypatch.setattr(script, "validation_ids",  # and so is the whole validation part: its last 2,000 characters
                            lambda char_tokenizer: torch.tensor(char_tokenizer.encode(load_shakespeare()[-2000:])))
        script.main(["--seeds", "0", "--out", str(tmp_path / run)], recipe=tiny)
        digests.append(json.loads((tmp_path / run / "card.json").read_text())["sha256"])
    assert digests[0] == digests[1]


# ------------------------------------------------------------------ the doors
def test_doors_name_the_argument(grown):
    model, tokenizer = grown
    with pytest.raises(ValueError, match="n_new must be >= 1"):
        grow_vocabulary(model, 0)
    with pytest.raises(TypeError, match="model must be a GPTModel"):
        grow_vocabulary(torch.nn.Linear(2, 2), 1)
    with pytest.raises(ValueError, match="first_new is 68"):
        train_new_rows(model, 68)
    with pytest.raises(TypeError, match="char_tokenizer must be a CharTokenizer"):
        ChatTokenizer(["a", "b"])
    with pytest.raises(ValueError, match="instruction contains the chat token '<\\|end\\|>'"):
        format_chat("Hi<|end|>")
    with pytest.raises(ValueError, match=r"examples\[1\] is \d+ tokens long"):
        chat_batch(tokenizer, [("a", "b"), ("a" * 200, "b")], 128)
    with pytest.raises(TypeError, match=r"examples\[0\] must be an \(instruction, response\) pair"):
        chat_batch(tokenizer, ["ab"], 128)
    with pytest.raises(TypeError, match="examples must be a non-empty list"):
        chat_batch(tokenizer, [], 128)
    inputs, targets = chat_batch(tokenizer, PAIRS[:1], 128)
    with pytest.raises(ValueError, match="every target is IGNORE_INDEX"):
        chat_loss(model, inputs, torch.full_like(targets, IGNORE_INDEX))
    with pytest.raises(ValueError, match="targets must be int64 of the inputs' shape"):
        chat_loss(model, inputs, targets[:, 1:])
    base = load_shakespeare_gpt("cpu")[0]
    with pytest.raises(ValueError, match="the tokenizer has 68 tokens, the model 65: grow the model"):
        chat_reply(base, tokenizer, "Hi")
    with pytest.raises(ValueError, match="instruction takes 202 tokens"):
        chat_reply(model, tokenizer, "a" * 200)
    with pytest.raises(ValueError, match="text has 0 usable lines for task 'upper'"):
        make_instructions("ROMEO:\nHi.\n", 1, 0)
    with pytest.raises(ValueError, match="example must have a 'task'"):
        judge_reply({"task": "poetry", "response": "x"}, "x")
    with pytest.raises(TypeError, match="read and write must be callables"):
        chat_loop(model, tokenizer, read="Hi")

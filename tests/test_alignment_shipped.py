"""Notebook 15's shipped adapters (course_lib/data/shakespeare_dpo/ and shakespeare_grpo/): the files match their
cards, stay the size of an adapter, were made by the script's current recipe, load into notebook 14's chat model
changing only its LoRA matrices, give the sampled (and, for GRPO, greedy) replies their cards record, and the
script runs end to end."""

import hashlib
import importlib
import json
from dataclasses import asdict, replace

import pytest
import torch

from course_lib.alignment import ALIGNED_DIRS, load_aligned
from course_lib.finetuning import SHAKESPEARE_CHAT_DIR, chat_reply, judge_reply, load_shakespeare_chat


def load_script():
    """The alignment script as a module (course_lib/data holds scripts, read as a namespace package)."""
    return importlib.import_module("course_lib.data.make_shakespeare_align")


@pytest.fixture(scope="module")
def cards():
    return {stage: json.loads((folder / "card.json").read_text(encoding="utf-8")) for stage, folder in
            ALIGNED_DIRS.items()}


@pytest.fixture(scope="module")
def heldout():
    script = load_script()
    return script.instruction_sets(script.CHAT_RECIPE)[1]


@pytest.mark.parametrize("stage", sorted(ALIGNED_DIRS))
def test_the_shipped_files_match_their_card_and_stay_small(cards, stage):
    script, card, folder = load_script(), cards[stage], ALIGNED_DIRS[stage]
    for name, digest in card["sha256"].items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
    assert sorted(p.name for p in folder.iterdir()) == sorted([*card["sha256"], "card.json", "README.md"])
    assert (folder / "README.md").read_text(encoding="utf-8") == script.render_card(card, stage)
    assert sum(f.stat().st_size for f in folder.iterdir()) < 3_000_000, "an adapter, not a model"
    assert card["recipe"] == json.loads(json.dumps(asdict(script.RECIPE))), "the card was made by another recipe"
    assert card["command"] == "python course_lib/data/make_shakespeare_align.py --workers 3"
    trained = {*script.RECIPE.dpo_tasks, *script.RECIPE.grpo_tasks}
    assert card["seeds"] == [0, 1, 2] and card["long"] == script.RECIPE.long_per_task * len(trained)


def test_the_cards_start_from_notebook_14s_measured_model(cards):
    """The greedy exact match the alignment script measured for the chat model is the one notebook 14's card
    records: the same model, the same held-out instructions, the same checker."""
    chat_card = json.loads((SHAKESPEARE_CHAT_DIR / "card.json").read_text(encoding="utf-8"))
    for card in cards.values():
        measured = card["scores"]["heldout"]["chat (notebook 14)"]["all seeds"]
        for task, expected in chat_card["seeds"][0]["exact_match"].items():  # the shipped adapter is seed 0's
            assert measured[task]["greedy"] == pytest.approx(expected), task
    for held in ("heldout", "long"):
        assert cards["grpo"]["scores"][held]["after DPO"] == cards["dpo"]["scores"][held]["after DPO"], \
            "the GRPO card repeats DPO's scores"
    for seed in cards["grpo"]["seeds"]:  # GRPO starts from the chat model too: its first watch is DPO's first watch
        dpo_start, grpo_start = cards["dpo"]["history"][str(seed)][0], cards["grpo"]["history"][str(seed)][0]
        assert grpo_start["kl"] == 0 and grpo_start["heldout_reward"] == dpo_start["heldout_reward"], seed


def test_the_gates_on_the_cards_are_the_arithmetic_of_their_numbers(cards):
    """gates() redone from the scores and histories the cards hold gives the gates they record."""
    script, card = load_script(), cards["grpo"]
    chat = {held: card["scores"][held]["chat (notebook 14)"]["all seeds"] for held in ("heldout", "long")}
    runs = [{**{stage: {held: card["scores"][held][stage][str(seed)] for held in ("heldout", "long")}
                for stage in ("after DPO", "after GRPO")}, "grpo_history": card["history"][str(seed)]}
            for seed in card["seeds"]]
    assert script.gates(chat, runs, script.RECIPE) == card["gates"] == cards["dpo"]["gates"]
    task = script.RECIPE.dpo_tasks[0]  # and one gate by hand: the rise over the chat model, against three noises
    gate, after = card["gates"]["dpo"][task], [card["scores"]["long"]["after DPO"][str(s)][task] for s in card["seeds"]]
    before = card["scores"]["long"]["chat (notebook 14)"]["all seeds"][task]
    rise = sum(a["reward"] for a in after) / len(after) - before["reward"]
    spread = max(a["reward"] for a in after) - min(a["reward"] for a in after)
    noise = max(spread, before["reward_bootstrap"], *[a["reward_bootstrap"] for a in after])
    assert gate["rise"] == pytest.approx(rise, abs=1e-4) and gate["noise"] == pytest.approx(noise, abs=1e-4)
    assert gate["passed"] == (rise > 0 and rise >= 3 * noise)


def test_every_shipped_pair_is_judged_as_its_label_says(cards):
    pairs = json.loads((ALIGNED_DIRS["dpo"] / "pairs.json").read_text(encoding="utf-8"))
    recipe = load_script().RECIPE
    assert len(pairs) == cards["dpo"]["pairs"]["0"] and len(pairs) > 100
    assert {p["task"] for p in pairs} == set(recipe.dpo_tasks)
    for pair in pairs:
        line = pair["instruction"].split("\n")[-1]
        assert recipe.min_line <= len(line) <= recipe.max_line, "long lines only"
        assert judge_reply(pair, pair["chosen"]) and not judge_reply(pair, pair["rejected"]), pair


@pytest.mark.parametrize("stage", sorted(ALIGNED_DIRS))
def test_a_shipped_adapter_changes_only_the_lora_matrices_and_gives_its_cards_replies(cards, heldout, stage):
    """The adapter's sampled replies (the card's samples after the stage, same sampler seed) come back; the GRPO
    card also records greedy replies to held-out instructions."""
    torch.set_num_threads(1)
    script = load_script()
    chat, _ = load_shakespeare_chat("cpu")
    model, tokenizer = load_aligned(stage)
    changed = {name for (name, a), (_, b) in zip(chat.state_dict().items(), model.state_dict().items())
               if not torch.equal(a, b)}
    assert changed and all(".lora_" in name for name in changed), sorted(changed)[:5]
    by_instruction = {e["instruction"]: e for e in script.long_set(script.RECIPE)}
    shown = [by_instruction[s["instruction"]] for s in cards[stage]["samples"]["after"]]
    assert script.samples_of(model, tokenizer, shown, script.RECIPE) == cards[stage]["samples"]["after"]
    for entry in cards[stage].get("heldout_replies", []):
        assert chat_reply(model, tokenizer, heldout[entry["index"]]["instruction"], 64) == entry["reply"]


def test_load_aligned_names_the_stages():
    with pytest.raises(ValueError, match=r"stage must be one of \['dpo', 'grpo'\], got 'ppo'"):
        load_aligned("ppo")


def test_a_short_run_of_the_script_writes_both_stages_and_rebuilds_bit_for_bit(tmp_path):
    """The script with a few DPO and 2 GRPO steps on the count task, 4 held-out instructions and 4 on long lines,
    twice: the same files, the same bytes."""
    script = load_script()
    tiny = replace(script.RECIPE, dpo_tasks=("count",), grpo_tasks=("count",), dpo_per_task=8, dpo_epochs=1,
                   dpo_batch_size=4, grpo_per_task=2, grpo_steps=2, grpo_prompts_per_step=2, grpo_group_size=4,
                   watch_every=2, kl_samples=2, score_samples=2, heldout_pair_samples=4, heldout_per_task=1,
                   long_per_task=4)
    digests = []
    for run in ("a", "b"):
        script.main(["--seeds", "0", "--out", str(tmp_path / run)], recipe=tiny)
        digests.append({stage: json.loads((tmp_path / run / folder / "card.json").read_text())["sha256"]
                        for stage, folder in script.FOLDERS.items()})
    assert digests[0] == digests[1]
    assert set(digests[0]["dpo"]) == {"adapter.safetensors", "pairs.json"}
    assert set(digests[0]["grpo"]) == {"adapter.safetensors"}

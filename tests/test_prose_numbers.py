"""Every number in a lesson's prose is one the notebook printed, or says where it comes from
(docs/design.md section 3, "Notebooks that nbval can trust").

A number in a markdown cell passes when
* it appears in the notebook's stored outputs, as a literal in its code (a seed, a loop's range) or among the
  fields of GPT-2's configurations, to the precision the prose gives (prose 1.36 matches a printed 1.3593; prose
  1.34 does not; 56 % matches a printed 0.56; 3.2M matches 3,222,528);
* or its sentence names where it comes from: a paper (an author and a year, "Olsson et al., 2022"), a reference
  implementation, a datasheet or a model card, or a measurement of ours with its date ("`benchmarks/
  decode_limits.py` ... 2026-11-24", docs/performance.md or docs/testing.md and a date). A table is judged by the
  sentence that introduces it;
* or it is part of the lesson's mathematics, a formula in LaTeX (`$30{,}740{,}800 / 7{,}087{,}872 = 4.337$`), or
  code (`eps=1e-5`), or a version (PyTorch 2.13), or sits in a "Predict first" question (the task, not a claim).

A measured value written in LaTeX on its own (`$1.5 \times 10^{-6}$`, `$\approx 0.25$`) is a number like any other.
Worked answers are prose like the rest: their numbers are printed by their own hidden code cells, or, for an
answer that runs small under the tests (course_lib.checks.answer_size), by its full run stored in
docs/answer_figures.json (a sentence citing `tools/answer_figures.py` is checked against it, not excused by its
date); in an answer a time, memory or speed must be printed with its unit. In an exercise's statement only what
reads as a measurement is checked, and with its unit: a time or a throughput, or a number written with "about";
the task's own parameters ("60 steps of 8 windows", "a 1 GiB matrix") and the difficulty and time estimate are
the task.

Which numbers count: decimals, percentages, ratios (`1.6x`, `1.6×`) and counts of something measurable
("39 characters", "3,000 steps", "56.2 tokens/s"). Small integers that name things (notebook 09, block 3,
head 6) do not. `test_the_claims_fixed_by_issue_28_are_caught` puts the numeric claims of issue 28 back and
requires each to be named again; `test_the_claims_fixed_by_issue_43_are_caught` does the same for issue 43's
answers, statements and LaTeX values.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import answer_figures  # noqa: E402  (tools/ is not a package)

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
OLD_CLAIMS = Path(__file__).with_name("prose_claims_before_issue_28.json")

UNITS = (r"characters?|tokens?|steps?|nats|parameters|weights|seconds|minutes|hours|days|words|times|rows|"
         r"passages|MB|GB|KB|ms|µs|s|tokens/s|GB/s|MB/s|FLOP/s|GFLOPs?|FLOPs?")
NUMBER = r"\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"
# A measured quantity in prose: a decimal, a percentage, a ratio, or a count with its unit.
ALONE = r"(?<![\w.$/-])"  # not part of a word, a path, a formula or a longer number
MEASURED = re.compile(rf"{ALONE}(?P<percent>{NUMBER})\s?%"
                      rf"|{ALONE}(?P<value>{NUMBER})(?P<scale>[KMB]?)(?:x\b|×|(?=\s(?:{UNITS})\b))"
                      rf"|{ALONE}(?P<decimal>\d[\d,]*\.\d+(?:e[-+]?\d+)?)(?P<dscale>[KMB]?)(?![\w.]*\d)")
ANY_NUMBER = re.compile(rf"(?<![\w.])({NUMBER})")
PERCENT = re.compile(rf"({NUMBER})\s?%")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
MEASUREMENT_SOURCE = re.compile(r"benchmarks/|tools/|docs/performance\.md|docs/testing\.md", re.IGNORECASE)
# Sources that are not runs of ours: a shipped model's card, a reference implementation's published settings,
# a datasheet. Named in the sentence, they need no date.
REFERENCE = re.compile(r"model card|card\.json|llm\.c|nanoGPT|build-nanogpt|datasheet|Hugging Face's|OpenAI")
VERSION = re.compile(r"(?:PyTorch|Python|CUDA|torch|nbdev|TransformerLens|transformers|version) $")
QUESTION = re.compile(r"^\W*Predict first", re.IGNORECASE)  # a question's options are not claims
YEAR = r"\b(?:19|20)\d\d\b"
PAPER = re.compile(rf"et al\.|\bpaper\b[^.]*{YEAR}|{YEAR}[^.]*\bpaper\b|\b[A-Z][\w-]+ (?:&|and) [A-Z][\w-]+,? \(?{YEAR}"
                   rf"|\({YEAR}\)|, {YEAR}\)")
EXERCISE = "**Difficulty:**"
# What reads as a measurement in an exercise's statement: a time or a throughput, or "about N" (a size in bytes
# without "about" is the task's budget: "a 1 GiB matrix")
STATEMENT_MEASURED = re.compile(
    rf"(?:\babout|\baround|\broughly|~)\s?(?P<about>{NUMBER})"
    rf"|{ALONE}(?P<value>{NUMBER})(?P<scale>[KMB]?)\s?(?=(?:ms|µs|s|seconds?|minutes?|min|hours?|tokens/s|GB/s|MB/s|"
    rf"FLOP/s|it/s)\b)")
# Units of time, memory, disk and throughput: a number written with one is matched only by an output that prints
# it with the same unit ("about 20 s" is not backed by a 20 printed as a step count)
PHYSICAL = {"s": "s", "sec": "s", "second": "s", "seconds": "s", "ms": "ms", "µs": "µs", "us": "µs", "min": "min",
            "minute": "min", "minutes": "min", "hour": "h", "hours": "h", "h": "h", "KB": "KB", "MB": "MB", "GB": "GB",
            "TB": "TB", "KiB": "KB", "MiB": "MB", "GiB": "GB", "bytes": "B", "B": "B", "tokens/s": "tokens/s",
            "GB/s": "GB/s", "MB/s": "MB/s", "FLOP/s": "FLOP/s", "it/s": "it/s"}
WITH_UNIT = re.compile(rf"(?<![\w.])({NUMBER})\s?({'|'.join(sorted(map(re.escape, PHYSICAL), key=len, reverse=True))})"
                       rf"(?![\w/])")
# A measured value on its own in LaTeX: an optional \approx, a number with {,} for thousands, an optional
# \times 10^{k} and an optional \%. Anything else in the math (a letter, an operator, =) makes it a formula.
LATEX_VALUE = re.compile(r"\$\s*(?:\\approx|\\sim|\\simeq)?\s*(?P<number>\d(?:\d|\{,\})*(?:\.\d+)?)"
                         r"(?:\s*\\times\s*10\^\{?(?P<exponent>[-−]?\d+)\}?)?\s*(?P<percent>\\%)?\s*\$")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*(_\[])|\n\s*\n")


def _config_values() -> set[str]:
    """The fields of GPT-2's four configurations: constants of every lesson (1024 tokens, 48 blocks, 50257)."""
    from dataclasses import asdict

    from course_lib.config import GPT2_CONFIGS

    return {str(value) for config in GPT2_CONFIGS.values() for value in asdict(config).values()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


CONFIG_VALUES = _config_values()


@dataclass(frozen=True)
class Unsupported:
    notebook: str
    cell: int
    cell_id: str
    number: str
    sentence: str

    def __str__(self) -> str:
        return (f"{self.notebook}, cell {self.cell} (id {self.cell_id}): {self.number!r} is neither printed by the "
                f"notebook nor given a source in its sentence: {self.sentence!r}")


def _latex_value(match: re.Match) -> str:
    """`$1.5 \\times 10^{-6}$` -> `1.5e-6`, `$12{,}288$` -> `12,288`, `$3.2\\%$` -> `3.2%`."""
    number = match.group("number").replace("{,}", ",")
    if match.group("exponent"):
        number += "e" + match.group("exponent").replace("−", "-")
    return number + ("%" if match.group("percent") else "")


def _strip(markdown: str) -> str:
    """The prose of a markdown cell: without code, LaTeX formulas, link targets, HTML tags and headings."""
    markdown = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    markdown = re.sub(r"\$\$.*?\$\$", " ", markdown, flags=re.S)
    markdown = LATEX_VALUE.sub(_latex_value, markdown)
    markdown = re.sub(r"\$[^$]*\$", " ", markdown)
    markdown = re.sub(r"`[^`]*`", lambda code: re.sub(r"\d", "#", code.group()), markdown)  # names stay, numbers go
    markdown = re.sub(r"\]\([^)]*\)", "]", markdown)
    markdown = re.sub(r"<[^>]+>", " ", markdown)
    return re.sub(r"^#+ .*$", " ", markdown, flags=re.M)


def _code_without_comments(source: str) -> str:
    return "\n".join(line.split("#", 1)[0] for line in source.splitlines())


def _values(text: str) -> set[str]:
    return {match.group(1).replace(",", "") for match in ANY_NUMBER.finditer(text)}


def _decimals(value: str) -> int:
    return len(value.partition(".")[2])


def _printed(value: str, known: set[str], scale: str = "") -> bool:
    """Whether `value` (times `scale`: K, M or B) is among `known`, to the precision it is written with."""
    if scale:  # 3.2M in prose matches 3,222,528 or 3.2 printed
        factor = {"K": 1e3, "M": 1e6, "B": 1e9}[scale]
        return _printed(value, known) or _printed(value, {f"{float(k) / factor:.6f}" for k in known if "e" not in k})
    if value in known:
        return True
    try:
        wanted = float(value)
    except ValueError:
        return False
    if "e" in value:  # 1.2e-6 written in prose matches 1.2e-06, 1.21e-06 printed
        digits = _decimals(value.split("e")[0])
        return any("e" in k and f"{float(k):.{digits}e}" == f"{wanted:.{digits}e}" for k in known)
    decimals = _decimals(value)
    for k in known:
        if "e" in k or _decimals(k) < decimals:
            continue
        if round(float(k), decimals) == wanted:
            return True
    return False


def _sourced(sentence: str, answer: bool = False) -> bool:
    """Whether a sentence names its source. A sentence citing tools/answer_figures.py is checked against the full run
    instead; an answer's sentence is not excused by naming a reference implementation (its code prints the figure)."""
    if "answer_figures" in sentence:
        return False
    reference = REFERENCE.search(sentence) and not answer
    return (bool(PAPER.search(sentence) or reference or QUESTION.search(sentence))
            or bool(MEASUREMENT_SOURCE.search(sentence) and DATE.search(sentence)))


def full_run_outputs(notebook: str) -> dict[str, str]:
    """What each answer cell of `notebook` printed at full size (cell id -> text), from docs/answer_figures.json."""
    return {cell_id: answer["output"] for cell_id, answer in answer_figures.full_run(notebook).get("answers", {}).items()}


def _with_units(text: str) -> dict[str, set[str]]:
    """The numbers `text` prints with a unit of time, memory, disk or throughput, by unit: {"s": {"20.3"}, ...}."""
    found: dict[str, set[str]] = {}
    for match in WITH_UNIT.finditer(text):
        found.setdefault(PHYSICAL[match.group(2)], set()).add(match.group(1).replace(",", ""))
    return found


def _unit_after(sentence: str, end: int) -> str | None:
    """The unit of time, memory, disk or throughput written right after a number that ends at `end`, if any."""
    match = WITH_UNIT.match("0 " + sentence[end:].lstrip())
    return PHYSICAL[match.group(2)] if match else None


def _backed(value: str, unit: str | None, known: set[str], units: dict[str, set[str]], scale: str = "") -> bool:
    """Whether a number of the prose is printed: with its unit when it has one of time, memory, disk or speed."""
    return _printed(value, units.get(unit, set()), scale) if unit else _printed(value, known, scale)


def _statement_problems(path: Path, index: int, cell: dict, plain: tuple, full: tuple) -> list[Unsupported]:
    """The measured-looking numbers of an exercise's statement that are neither printed nor sourced; `plain` and
    `full` are (known numbers, numbers by unit) without and with the sized answers' full runs."""
    text = "\n".join(line for line in "".join(cell["source"]).splitlines() if EXERCISE not in line)
    found = []
    for sentence, voucher in _sentences(_strip(text)):
        if _sourced(voucher) or _sourced(sentence):
            continue
        known, units = full if "answer_figures" in sentence + voucher else plain
        for match in STATEMENT_MEASURED.finditer(sentence):
            value = (match.group("about") or match.group("value")).replace(",", "")
            if not _backed(value, _unit_after(sentence, match.end()), known, units, match.group("scale") or ""):
                found.append(Unsupported(path.name, index, cell.get("id", "?"), match.group(0).strip(),
                                         " ".join(sentence.split())))
    return found


def _sentences(prose: str) -> list[tuple[str, str]]:
    """(sentence, the text that vouches for it): a table row is vouched for by the sentence before the table."""
    pieces, before = [], ""
    for block in re.split(r"\n\s*\n", prose):
        lines = block.splitlines()
        table = [line for line in lines if line.lstrip().startswith("|")]
        text = "\n".join(line for line in lines if not line.lstrip().startswith("|"))
        for sentence in SENTENCE_END.split(text):
            if sentence.strip():
                pieces.append((sentence, sentence))
                before = sentence
        pieces.extend((row, before) for row in table)
    return pieces


def _evidence(code_cells: list[dict], extra_outputs: list[str] = ()) -> tuple[set[str], set[str], dict[str, set[str]]]:
    """What `code_cells` (and `extra_outputs`) can back: (the numbers of their code and outputs with GPT-2's
    configurations, the percentages they print, the numbers they print with a unit of time, memory or speed)."""
    known = set(CONFIG_VALUES)
    printed = list(extra_outputs)
    for cell in code_cells:
        known |= _values(_code_without_comments("".join(cell["source"])))
        printed += ["".join(output.get("text") or output.get("data", {}).get("text/plain", ""))
                    for output in cell.get("outputs", [])]
    percents: set[str] = set()
    units: dict[str, set[str]] = {}
    for text in printed:
        known |= _values(text)
        percents |= {m.group(1).replace(",", "") for m in PERCENT.finditer(text)}
        for unit, values in _with_units(text).items():
            units.setdefault(unit, set()).update(values)
    return known, percents, units


def _answer_cells(cells: list[dict], index: int) -> list[dict]:
    """The code cells tagged `answer` right under the answer text at `index`."""
    found = []
    for cell in cells[index + 1:]:
        if cell["cell_type"] != "code" or "answer" not in cell.get("metadata", {}).get("tags", []):
            break
        found.append(cell)
    return found


def unsupported_numbers(path: Path, cells: list[dict] | None = None) -> list[Unsupported]:
    """Every measured number in the markdown of the notebook at `path` that is neither printed nor sourced."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"] if cells is None else cells
    code = [cell for cell in cells if cell["cell_type"] == "code"]
    notebook = _evidence(code)  # what backs the lessons' prose: every number of the code and the outputs
    full_runs = full_run_outputs(path.name)
    found = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        source = "".join(cell["source"])
        if EXERCISE in source:  # a statement: only what reads as a measurement is a claim
            known, _, units = notebook
            everything = _evidence(code, list(full_runs.values()))
            found += _statement_problems(path, index, cell, (known, units), (everything[0], everything[2]))
            continue
        # A worked answer is backed by its own code cells, their output and, when it cites it, their full run; its
        # time, memory or speed must be printed with its unit. The lessons' prose: the whole notebook, number only.
        answer = "solution" in cell.get("metadata", {}).get("tags", [])
        if answer:
            own = _answer_cells(cells, index)
            runs = [full_runs[c["id"]] for c in own if c.get("id") in full_runs] if "answer_figures" in source else []
            known, percents, units = _evidence(own, runs)
        else:
            known, percents, units = notebook
        for sentence, voucher in _sentences(_strip(source)):
            if _sourced(voucher, answer) or _sourced(sentence, answer):
                continue
            for match in MEASURED.finditer(sentence):
                if VERSION.search(sentence[:match.start()]):
                    continue
                if match.group("percent"):  # 56 % matches a printed 56% or 0.56
                    value = match.group("percent").replace(",", "")
                    if _printed(value, percents) or _printed(f"{float(value) / 100:.{_decimals(value) + 2}f}", known):
                        continue
                else:
                    value = (match.group("value") or match.group("decimal")).replace(",", "")
                    unit = _unit_after(sentence, match.end()) if answer and match.group("value") else None
                    if _backed(value, unit, known, units, match.group("scale") or match.group("dscale") or ""):
                        continue
                found.append(Unsupported(path.name, index, cell.get("id", "?"), match.group(0),
                                         " ".join(sentence.split())))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_number_in_the_prose_is_printed_or_sourced(path):
    problems = unsupported_numbers(path)
    assert not problems, "\n".join(map(str, problems))


def test_the_claims_fixed_by_issue_28_are_caught():
    """Each numeric claim of issue 28 (its items 1-3, 6, 10, 12 and 14), put back into today's notebook in place
    of the cell that replaced it, is named by the checker again, by one of the numbers it used."""
    claims = json.loads(OLD_CLAIMS.read_text(encoding="utf-8"))
    assert len(claims) >= 7
    for claim in claims:
        path = ROOT / "notebooks" / claim["notebook"]
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        cells = [c for c in cells if c.get("id") != claim["replaced_by"]] + [
            {"cell_type": "markdown", "id": "old", "source": claim["source"]}]
        named = {problem.number for problem in unsupported_numbers(path, cells) if problem.cell_id == "old"}
        assert named & set(claim["numbers"]), (f"issue 28 item {claim['item']} ({claim['notebook']}) is not caught: "
                                               f"expected one of {claim['numbers']}, the checker named {named}")


@pytest.mark.parametrize("sentence, caught", [
    ("SDPA took 0.5 to 0.8 of the time (1.6x, 1.6x and 1.9x in the stored run).", True),
    ("The space was penalised like most of the alphabet after 39 characters.", True),
    ("At 1.34 the shipped model writes phrases.", True),
    ("At 1.36 the shipped model writes phrases.", False),  # printed as 1.3593
    ("`benchmarks/decode_limits.py` measured 50.0 tokens/s on 2026-11-24.", False),
    ("`benchmarks/decode_limits.py` measured 50.0 tokens/s.", True),  # a measurement needs its date
    ("Olsson et al. (2022) trained for 3,000 steps.", False),
    ("The model in block 3 of notebook 09 has 4 heads.", False),  # names, not measurements
    ("The ratio is $30{,}740{,}800 / 7{,}087{,}872 = 4.337$.", False),
])
def test_the_checker_itself(tmp_path, sentence, caught):
    cells = [{"cell_type": "code", "source": "print(1.3593)", "outputs": [{"output_type": "stream",
                                                                         "text": "1.3593\n"}]},
             {"cell_type": "markdown", "id": "m", "source": sentence}]
    path = tmp_path / "99_probe.ipynb"
    path.write_text(json.dumps({"cells": cells}), encoding="utf-8")
    assert bool(unsupported_numbers(path)) == caught

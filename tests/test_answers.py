"""Every worked answer runs, and what it says is what it prints (issue 43; docs/design.md, section 3).

A worked answer is a collapsed `<details>` block in a markdown cell tagged `solution` (tests/test_exercises.py), and,
when the answer has code, the code cell(s) right under it, tagged `solution` and `answer`, source and output
collapsed in JupyterLab and left out of the decks. nbval runs those cells where they stand and compares their
output; tests/test_prose_numbers.py checks every number of the answer's text against the notebook's outputs. Here:

* the layout: no code or typed-in output left inside an answer's text, every answer cell hidden, tagged and under
  its answer, and run (its output stored);
* the names: an answer's code uses only names that Python, IPython or an earlier cell of the notebook defines (the
  two answers of notebook 14 that used `chars`, which the notebook never defines, fail here);
* the full-size figures: an answer that runs small under the tests (course_lib.checks.answer_size) quotes its full
  run, stored by `python tools/answer_figures.py` in docs/answer_figures.json for the answer's present code, and
  every number of a sentence that cites that command is one the full run printed;
* pasted at the end: conftest.py runs one answer of every notebook (answer_figures.answer_to_paste) again after
  the last cell; a notebook built here shows that such a run fails when a later cell removes a name the answer uses;
* put back: each answer and sentence that issue 43 found false or typed in, put back as it was, is caught again.
"""
from __future__ import annotations

import builtins
import json
import os
import re
import subprocess
import symtable
import sys
from pathlib import Path

import nbformat
import pytest

from test_exercises import exercises, is_solution
from test_prose_numbers import MEASURED, _printed, _sentences, _strip, _values, full_run_outputs, unsupported_numbers

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
IDS = [p.stem for p in NOTEBOOKS]
sys.path.insert(0, str(ROOT / "tools"))
import answer_figures  # noqa: E402  (tools/ is not a package)

CLAIMS = Path(__file__).with_name("claims_before_issue_43.json")
IPYTHON_NAMES = {"display", "get_ipython", "In", "Out", "_", "__", "___", "exit", "quit"}
HIDDEN = {"source_hidden": True, "outputs_hidden": True}


def notebook(path: Path):
    return nbformat.read(path, as_version=4)


def worked_answers(nb) -> list[tuple[str, object, list]]:
    """(exercise title, the answer's markdown cell, the answer cells right under it) for each worked answer."""
    found = []
    for _, title, cells in exercises(nb):
        for position, cell in enumerate(cells):
            if cell.cell_type == "markdown" and is_solution(cell):
                code = []
                for after in cells[position + 1:]:
                    if not answer_figures.is_answer(after):
                        break
                    code.append(after)
                found.append((title, cell, code))
    return found


def _code(source: str) -> str:
    """A cell's Python, its IPython magics and shell lines blanked out."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def bound_names(source: str) -> set[str]:
    """The names a cell's top level binds: assignments, imports, functions, classes, loop and `with` targets."""
    try:
        table = symtable.symtable(_code(source), "cell", "exec")
    except SyntaxError:
        return set()
    names = {symbol.get_name() for symbol in table.get_symbols() if symbol.is_assigned() or symbol.is_imported()}
    for line in source.splitlines():  # `from module import *`: what that module exports
        star = re.match(r"\s*from\s+([\w.]+)\s+import\s+\*", line)
        if star:
            import importlib

            module = importlib.import_module(star.group(1))
            names |= set(getattr(module, "__all__", [n for n in dir(module) if not n.startswith("_")]))
    return names


def free_names(source: str) -> set[str]:
    """The global names a cell reads without binding them itself, in its top level or in its functions."""
    table = symtable.symtable(_code(source), "answer", "exec")
    bound = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    free, tables = set(), [table]
    while tables:
        current = tables.pop()
        tables.extend(current.get_children())
        for symbol in current.get_symbols():
            top = current is table
            reads_global = symbol.is_referenced() and (top or symbol.is_global())
            if reads_global and not (top and (symbol.is_assigned() or symbol.is_imported())):
                free.add(symbol.get_name())
    return free - bound


def undefined_names(source: str, earlier: list[str]) -> set[str]:
    """The names `source` reads that neither Python, IPython nor one of the `earlier` cells' sources defines."""
    known = set(dir(builtins)) | IPYTHON_NAMES
    for cell in earlier:
        known |= bound_names(cell)
    return free_names(source) - known


def fenced_answers(nb) -> list[str]:
    """The titles of the exercises whose answer text still holds a fenced block (code or typed-in output)."""
    return [title for title, cell, _ in worked_answers(nb) if "```" in cell.source]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_answer_texts_hold_no_code_or_typed_in_output(path):
    """An answer's code is a cell that runs, and its output is that cell's: no fenced block stays in the text."""
    fenced = fenced_answers(notebook(path))
    assert not fenced, (f"{path.name}: these answers still hold a fenced block; move the code into a hidden answer "
                        f"cell under the answer (tags solution + answer) and let its output show: {fenced}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_answer_cells_are_hidden_run_and_under_their_answer(path):
    nb = notebook(path)
    placed = {id(cell) for _, _, code in worked_answers(nb) for cell in code}
    problems = []
    for cell in nb.cells:
        if not answer_figures.is_answer(cell) and "answer" not in cell.metadata.get("tags", []):
            continue
        where = f"{path.name}, cell {cell.get('id')}"
        if not answer_figures.is_answer(cell):
            problems.append(f"{where}: tagged 'answer' but not 'solution' (the decks and the site would show it)")
        if id(cell) not in placed:
            problems.append(f"{where}: not right under an answer's <details> cell (or another answer cell)")
        if {k: cell.metadata.get("jupyter", {}).get(k) for k in HIDDEN} != HIDDEN:
            problems.append(f"{where}: set metadata jupyter.source_hidden and jupyter.outputs_hidden to true")
        if cell.execution_count is None:
            problems.append(f"{where}: never run; run tools/refresh_notebooks.py on the notebook")
    assert not problems, "\n".join(problems)


def test_answer_size_reads_the_setting(monkeypatch):
    from course_lib.checks import answer_size

    monkeypatch.setenv("COURSE_ANSWER_SIZE", "small")
    assert answer_size(full=300, small=20) == 20
    monkeypatch.delenv("COURSE_ANSWER_SIZE")
    assert answer_size(full=300, small=20) == 300  # a learner's run
    monkeypatch.setenv("COURSE_ANSWER_SIZE", "tiny")
    with pytest.raises(ValueError, match="COURSE_ANSWER_SIZE='tiny'.*'full'.*'small'"):
        answer_size(full=300, small=20)


def test_every_notebook_has_an_answer_that_runs():
    """Each notebook has at least one answer cell with code: the one conftest.py pastes at its end."""
    missing = [p.name for p in NOTEBOOKS if not any(answer_figures.is_answer(c) for c in notebook(p).cells)]
    assert not missing, f"notebooks without an answer cell: {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_answer_code_uses_only_names_the_notebook_defines(path):
    nb = notebook(path)
    problems = []
    for position, cell in enumerate(nb.cells):
        if answer_figures.is_answer(cell):
            earlier = [c.source for c in nb.cells[:position] if c.cell_type == "code"]
            undefined = undefined_names(cell.source, earlier)
            if undefined:
                problems.append(f"{path.name}, answer cell {cell.get('id')}: uses {sorted(undefined)}, which no "
                                f"earlier cell defines")
    assert not problems, "\n".join(problems)


def test_the_name_check_can_fail():
    earlier = ["import torch\ntext = 'abc'\ndef helper(x):\n    return x", "from math import *"]
    assert undefined_names("print(len(text), helper(1), torch.pi, sqrt(4))", earlier) == set()
    assert undefined_names("vocab = sorted(set(chars))\nprint(vocab)", earlier) == {"chars"}
    assert undefined_names("def f():\n    return model(1)\n", earlier) == {"model"}
    assert undefined_names("model = 1\ndef f():\n    return model\n", earlier) == set()


def _sized(path: Path) -> list[tuple[str, object, object]]:
    """(exercise title, answer text cell, answer cell) for each answer cell that reads answer_size."""
    return [(title, text, cell) for title, text, code in worked_answers(notebook(path)) for cell in code
            if answer_figures.SIZED in cell.source]


SIZED = [pytest.param(p, title, id=f"{p.stem}-{title.split(':')[0][4:]}") for p in NOTEBOOKS for title, _, _ in
         _sized(p)]


@pytest.mark.parametrize(("path", "title"), SIZED)
def test_a_sized_answer_quotes_its_full_run(path, title):
    """The text of an answer that runs small under the tests cites its full run (command and date), that run
    was made with the answer's present code, and every number of a sentence citing it is one that run printed."""
    figures = json.loads(answer_figures.FIGURES.read_text(encoding="utf-8"))["notebooks"].get(path.name)
    assert figures, f"{path.name}: no full run stored; run python tools/answer_figures.py {path.relative_to(ROOT)}"
    for text, cell in [(t, c) for t_, t, c in _sized(path) if t_ == title]:
        stored = figures["answers"].get(cell.id)
        assert stored, f"{path.name}, {title}: cell {cell.id} has no full run in {answer_figures.FIGURES.name}"
        assert stored["source_sha"] == answer_figures.source_sha(cell.source), (
            f"{path.name}, {title}: the answer's code changed since its full run; run python tools/answer_figures.py "
            f"{path.relative_to(ROOT)}")
        prose = _strip(text.source)
        assert "answer_figures" in text.source and figures["date"] in text.source, (
            f"{path.name}, {title}: the answer must name `python tools/answer_figures.py` and its date "
            f"{figures['date']} where it quotes the full run")
        printed = _values(stored["output"])
        wrong = [m.group(0) for sentence, _ in _sentences(prose) if "answer_figures" in sentence
                 for m in MEASURED.finditer(sentence)
                 if not _printed((m.group("value") or m.group("decimal") or m.group("percent")).replace(",", ""),
                                 printed, m.group("scale") or m.group("dscale") or "")]
        assert not wrong, f"{path.name}, {title}: not printed by the full run of cell {cell.id}: {wrong}"


def test_stored_full_runs_belong_to_answers_that_exist():
    stored = json.loads(answer_figures.FIGURES.read_text(encoding="utf-8"))
    assert stored["command"] == "python tools/answer_figures.py"
    for name, entry in stored["notebooks"].items():
        sized = {cell.id for _, _, cell in _sized(ROOT / "notebooks" / name)}
        assert set(entry["answers"]) == sized, f"{name}: stored {sorted(entry['answers'])}, sized answers {sized}"
        assert re.fullmatch(r"20\d\d-\d\d-\d\d", entry["date"]) and entry["machine"]
        assert full_run_outputs(name).keys() == sized


PASTE_DEMO = [
    ("answer = 6 * 7", []),
    ("print(answer)", ["solution", "answer"]),   # the answer: runs where it stands, after the cell above
    ("del answer", []),                           # a later cell removes the name it uses
]


def _demo_notebook(folder: Path, cells) -> Path:
    """A notebook of `cells` (source, tags) stored as run: the answer cell printed 42."""
    nb = nbformat.v4.new_notebook()
    for count, (source, tags) in enumerate(cells, start=1):
        meta = {"tags": tags, "jupyter": dict(HIDDEN)} if tags else {}
        outputs = [nbformat.v4.new_output("stream", name="stdout", text="42\n")] if source.startswith("print") else []
        nb.cells.append(nbformat.v4.new_code_cell(source, metadata=meta, execution_count=count, outputs=outputs))
    path = folder / "demo.ipynb"
    nbformat.write(nb, path)
    return path


def _nbval(path: Path) -> subprocess.CompletedProcess:
    """pytest --nbval on one notebook outside the course, with the course's conftest.py as a plugin."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-c", os.devnull, "-p", "conftest", "-p", "no:cacheprovider",
                           "--nbval", "--nbval-current-env", "-v", str(path)],
                          capture_output=True, text=True, cwd=path.parent, env=env)


def test_an_answer_pasted_at_the_end_runs_there_or_fails(tmp_path):
    """conftest.py's extra item runs the answer again after the last cell: with `del answer` after it, the answer
    fails there (NameError), though every cell passes where it stands; without that cell it passes."""
    failing = _nbval(_demo_notebook(tmp_path, PASTE_DEMO))
    assert "Cell 1 pasted at the end FAILED" in failing.stdout and "NameError" in failing.stdout, failing.stdout
    assert failing.stdout.count("PASSED") == 3, failing.stdout
    (tmp_path / "demo.ipynb").unlink()
    passing = _nbval(_demo_notebook(tmp_path, PASTE_DEMO[:2]))
    assert "Cell 1 pasted at the end PASSED" in passing.stdout and passing.returncode == 0, passing.stdout


# Sentences issue 43 found false, which no number can catch: each with what the notebook shows instead.
FALSE_BEFORE = [
    ("00_overview.ipynb", r"\bseven (?:numbers|fields)\b", "GPTConfig has eight fields (tie_weights is the eighth)"),
    ("07_gpt_model.ipynb", r"\bfour things\b", "the finished module adds three things, listed under the sentence"),
    ("10_pretrained_gpt2.ipynb", r"many\s+orders\s+of\s+magnitude", "the differences sit under two orders below 1e-4"),
    ("13_scaling_up.ipynb", r"came out \*\*bit-identical\*\*", "the cell checks within 1e-6 (weights) and 1e-5 (losses), not bits"),
    ("10_pretrained_gpt2.ipynb", r"some 25 s for the Hub", "unsourced; huggingface_hub's retries are not timed here"),
    ("13_scaling_up.ipynb", r"no bfloat16 matrix units", "not measured; notebook 16 measures bfloat16 on this CPU"),
    ("16_modern_llm.ipynb", r"it is cheaper \(one statistic", "the ablation prints RMSNorm at 0.9x GPT-2's speed"),
    ("16_modern_llm.ipynb", r"a large share of a step", "the Newton-Schulz share is measured by benchmarks/"),
    ("16_modern_llm.ipynb", r"never\s+meet", "the runs do not record their scores: the growth is not measured"),
    ("16_modern_llm.ipynb", r"its input made 100 times larger\.", "in a pre-norm block the input has passed the norm"),
]


@pytest.mark.parametrize(("name", "pattern", "instead"), FALSE_BEFORE, ids=[f"{n[:2]}-{p[:20]}" for n, p, _ in
                                                                               FALSE_BEFORE])
def test_a_false_sentence_of_issue_43_is_not_back(name, pattern, instead):
    text = "\n".join(c.source for c in notebook(ROOT / "notebooks" / name).cells if c.cell_type == "markdown")
    assert not re.search(pattern, text), f"{name}: {pattern!r} is back; {instead}"


def test_the_counts_a_sentence_announces_are_the_counts_shown():
    """A sentence that announces N items of a numbered list, and notebook 00's count of GPTConfig's fields."""
    from dataclasses import fields

    from course_lib.config import GPTConfig

    words = {w: n for n, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())}
    problems = []
    for path in NOTEBOOKS:
        for cell in notebook(path).cells:
            if cell.cell_type != "markdown":
                continue
            for match in re.finditer(rf"\b({'|'.join(words)}) [\w ]+:\n\n((?:\d+\. .*\n?(?:   .*\n?)*)+)",
                                     cell.source):
                items = len(re.findall(r"^\d+\. ", match.group(2), flags=re.M))
                if words[match.group(1)] != items:
                    problems.append(f"{path.name}: {match.group(0).splitlines()[0]!r} announces "
                                    f"{match.group(1)}, the list has {items}")
    overview = "\n".join(c.source for c in notebook(NOTEBOOKS[0]).cells if c.cell_type == "markdown")
    for word in re.findall(r"\b(\w+) fields\b", overview):
        if word.lower() in words and words[word.lower()] != len(fields(GPTConfig)):
            problems.append(f"00: '{word} fields', GPTConfig has {len(fields(GPTConfig))}")
    assert not problems, "\n".join(problems)


def _put_back(claim) -> list[dict]:
    """Today's cells of the claim's notebook with the claim's cell as it was before issue 43."""
    path = ROOT / "notebooks" / claim["notebook"]
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    replaced = [dict(c, source=claim["source"]) if c.get("id") == claim["cell"] else c for c in cells]
    assert replaced != cells, f"{claim['notebook']}: no cell {claim['cell']} to put the old text in"
    return replaced


def test_the_claims_fixed_by_issue_43_are_caught():
    """Each answer, statement and sentence issue 43 names, put back as it was (tests/claims_before_issue_43.json,
    taken from the notebooks at 59a490e), is caught again: by the prose check naming one of its numbers, by the
    layout check (a fenced block in an answer), or by the name check (its code uses a name never defined)."""
    claims = json.loads(CLAIMS.read_text(encoding="utf-8"))
    assert len(claims) >= 15
    for claim in claims:
        path = ROOT / "notebooks" / claim["notebook"]
        cells = _put_back(claim)
        caught = []
        if "numbers" in claim:  # the prose check names one of its numbers (unless the answer now prints it)
            named = {p.number.strip() for p in unsupported_numbers(path, cells) if p.cell_id == claim["cell"]}
            caught += [f"numbers {sorted(named & set(claim['numbers']))}"] if named & set(claim["numbers"]) else []
        if claim.get("fenced"):  # the layout check finds code or typed-in output in the answer's text
            stored = json.loads(path.read_text(encoding="utf-8"))
            put_back = nbformat.reads(json.dumps({**stored, "cells": cells}), as_version=4)
            caught += ["fenced block"] if claim["title"] in fenced_answers(put_back) else []
        if "undefined" in claim:  # the name check finds a name no earlier cell defines
            code = "\n".join(re.findall(r"```python\n(.*?)```", claim["source"], flags=re.S))
            position = next(i for i, c in enumerate(cells) if c.get("id") == claim["cell"])
            earlier = ["".join(c["source"]) for c in cells[:position] if c["cell_type"] == "code"]
            caught += ["undefined names"] if set(claim["undefined"]) <= undefined_names(code, earlier) else []
        assert caught, f"issue 43, {claim['what']} ({claim['notebook']}, cell {claim['cell']}) is not caught"
        if not (claim.get("fenced") or "undefined" in claim):
            assert caught[0].startswith("numbers"), claim["what"]

"""Every exercise of every lesson comes with an answer a self-paced learner can check their work against.

An exercise is a markdown cell that opens with `### Exercise N: title`. Before the next heading it has either
- a hidden solution (a code cell tagged `solution`) and, after it, a code cell that runs a check from
  `course_lib.checks` on it, or
- a worked answer: a markdown cell tagged `solution` that is one collapsed `<details>` block, so the answer
  stays out of sight until the learner opens it (and out of the slide decks, like hidden code solutions)."""

import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from answer_figures import is_answer  # noqa: E402  (a worked answer's own code cell: it runs, not against a check)
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXERCISE = re.compile(r"### Exercise (\d+): \S")


def exercises(notebook):
    """(number, title line, the cells up to the next heading) for each exercise of a notebook."""
    found = []
    for index, cell in enumerate(notebook.cells):
        match = EXERCISE.match(cell.source) if cell.cell_type == "markdown" else None
        if not match:
            continue
        end = next((j for j in range(index + 1, len(notebook.cells))
                    if notebook.cells[j].cell_type == "markdown" and notebook.cells[j].source.startswith("#")),
                   len(notebook.cells))
        found.append((int(match.group(1)), cell.source.splitlines()[0], notebook.cells[index + 1:end]))
    return found


def is_solution(cell):
    return "solution" in cell.metadata.get("tags", [])




def answer_kind(cells) -> str | None:
    """'checked' for a hidden solution followed by a check, 'worked' for a collapsed written answer."""
    for position, cell in enumerate(cells):
        if cell.cell_type == "code" and is_solution(cell) and not is_answer(cell):
            later = cells[position + 1:]
            if any(c.cell_type == "code" and re.search(r"\bcheck_\w+\(", c.source) and "course_lib.checks" in c.source
                   for c in later):
                return "checked"
        if cell.cell_type == "markdown" and is_solution(cell):
            text = cell.source.strip()
            if text.startswith("<details>") and text.endswith("</details>") and "<summary>" in text:
                return "worked"
    return None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_exercise_has_an_answer(path):
    found = exercises(nbformat.read(path, as_version=4))
    assert len(found) >= 3, f"{path.name}: expected at least 3 '### Exercise N: title' cells, found {len(found)}"
    assert [number for number, _, _ in found] == list(range(1, len(found) + 1)), \
        f"{path.name}: exercises are not numbered 1, 2, 3, ...: {[title for _, title, _ in found]}"
    unanswered = [title for _, title, cells in found if answer_kind(cells) is None]
    assert not unanswered, (f"{path.name}: exercises without a hidden solution + check or a collapsed worked answer "
                            f"(a markdown cell tagged 'solution', one <details> block): {unanswered}")


def test_an_exercise_with_only_text_has_no_answer():
    """The rule above can fail: prose, an untagged <details> or a solution with no check do not count."""
    prose = [nbformat.v4.new_markdown_cell("Try it and see.")]
    untagged = [nbformat.v4.new_markdown_cell("<details><summary>Answer</summary>42</details>")]
    unchecked = [nbformat.v4.new_code_cell("def f(): ...", metadata={"tags": ["solution"]}),
                 nbformat.v4.new_code_cell("f()")]
    assert [answer_kind(cells) for cells in (prose, untagged, unchecked)] == [None, None, None]
    tagged = [nbformat.v4.new_markdown_cell("<details><summary>Answer</summary>42</details>",
                                            metadata={"tags": ["solution"]})]
    checked = [unchecked[0], nbformat.v4.new_code_cell("from course_lib.checks import check_f\ncheck_f(f)")]
    assert [answer_kind(tagged), answer_kind(checked)] == ["worked", "checked"]




def checked_solutions():
    """(notebook, solution cell id, the check cells' source) for every hidden solution followed by a check."""
    found = []
    for path in NOTEBOOKS:
        for _, title, cells in exercises(nbformat.read(path, as_version=4)):
            solutions = [c for c in cells if c.cell_type == "code" and is_solution(c) and not is_answer(c)]
            checks = [c.source for c in cells if c.cell_type == "code" and "course_lib.checks" in c.source
                      and not is_answer(c)]
            if solutions and checks:
                cell_id = solutions[0].get("id", title)
                found.append(pytest.param(path, solutions[0].source, "\n".join(checks), id=f"{path.stem}-{cell_id}"))
    return found


def lesson_namespace() -> dict:
    """What a solution cell may use: torch, nn, F, math and every name of the lesson modules."""
    import importlib
    import math

    import torch
    import torch.nn.functional as F
    from torch import nn

    namespace = {"torch": torch, "nn": nn, "F": F, "math": math}
    for name in ("config", "tokenization", "embeddings", "normalization", "feedforward", "attention", "block",
                 "model", "generation", "training", "decoding", "interpretability"):
        module = importlib.import_module(f"course_lib.{name}")
        namespace.update({key: getattr(module, key) for key in getattr(module, "__all__", [])})
    return namespace


@pytest.mark.parametrize(("path", "solution", "check"), checked_solutions())
def test_each_hidden_solution_passes_its_check(path, solution, check, capsys):
    """The hidden solution, run on its own with the lesson's names, passes the check cell under it."""
    namespace = lesson_namespace()
    exec(compile(solution, f"{path.name}:solution", "exec"), namespace)
    exec(compile(check, f"{path.name}:check", "exec"), namespace)
    assert "checks passed" in capsys.readouterr().out

"""Run the worked answers that read `answer_size` at their full size and store what they print.

Under the tests a worked answer whose full run takes more than a few seconds runs small (course_lib.checks.
answer_size); the figures its text quotes are the full run's. This command executes each notebook that holds such
an answer top to bottom with COURSE_ANSWER_SIZE=full, as a learner would run it, and writes each such answer cell's
printed output, with the date, the machine, PyTorch's version and the seconds the cell took, to
docs/answer_figures.json. tests/test_answers.py checks every number of those answers' text against it.

    python tools/answer_figures.py                        # every notebook with such an answer
    python tools/answer_figures.py notebooks/09_*.ipynb   # some of them (the others' entries are kept)

Run it alone on the machine (other jobs change the seconds, not the figures) and commit the JSON with the answer.
"""

import datetime
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "answer_figures.json"
SIZED = "answer_size("


def is_answer(cell) -> bool:
    """A worked answer's code: a code cell tagged both `solution` and `answer`."""
    tags = cell.metadata.get("tags", [])
    return cell.cell_type == "code" and "solution" in tags and "answer" in tags


def full_run(notebook: str) -> dict:
    """The stored full run of `notebook`'s sized answers (its name, e.g. "09_training.ipynb"): {"date", "machine",
    "answers": {cell id: {"output", "source_sha", "seconds"}}, ...}, or {} when it has none."""
    if not FIGURES.exists():
        return {}
    return json.loads(FIGURES.read_text(encoding="utf-8")).get("notebooks", {}).get(notebook, {})


def answer_to_paste(code_cells: list) -> int | None:
    """Which of a notebook's code cells conftest.py runs again after the last one, as a learner who pastes an answer
    at the end would: the last answer that does not read answer_size (a cheap one), else the last answer."""
    answers = [number for number, cell in enumerate(code_cells) if is_answer(cell)]
    unsized = [number for number in answers if SIZED not in code_cells[number].source]
    return (unsized or answers or [None])[-1]


def pasted_cell(cell):
    """A fresh, unrun code cell holding `cell`'s code, as a learner pastes it at the end of the notebook."""
    return nbformat.v4.new_code_cell(cell.source)


def source_sha(source: str) -> str:
    """A short fingerprint of an answer's code: the stored figures belong to this code."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def sized_answers(notebook) -> list:
    return [cell for cell in notebook.cells if is_answer(cell) and SIZED in cell.source]


def output_text(cell) -> str:
    """What a cell printed, as one string: its streams and the plain text of its results."""
    pieces = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            pieces.append(output.get("text", ""))
        elif "data" in output:
            pieces.append(output["data"].get("text/plain", ""))
    return "".join(pieces)


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    return f"{model}, {os.cpu_count()} cores, {platform.system()}"


def main(args: list[str]) -> None:
    sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
    import torch
    import conftest  # noqa: F401  (the kernels' settings, as under pytest)
    from refresh_notebooks import execute

    os.environ["COURSE_ANSWER_SIZE"] = "full"  # after refresh_notebooks imported conftest.py, which sets "small"
    paths = [Path(a).resolve() for a in args] or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    paths = [p for p in paths if sized_answers(nbformat.read(p, as_version=4))]
    stored = json.loads(FIGURES.read_text(encoding="utf-8")) if FIGURES.exists() else {}
    stored.setdefault("command", "python tools/answer_figures.py")
    stored.setdefault("notebooks", {})
    for path in paths:
        start, load = time.perf_counter(), round(os.getloadavg()[0], 1)  # 1-minute load: how busy the cores were
        notebook, _ = execute(path, timing=True)
        answers = {}
        for cell in sized_answers(notebook):
            timing = cell.metadata.get("execution", {})
            answers[cell.id] = {"output": output_text(cell), "source_sha": source_sha(cell.source)}
            if timing.get("iopub.execute_input") and timing.get("shell.execute_reply"):
                began = datetime.datetime.fromisoformat(timing["iopub.execute_input"].replace("Z", "+00:00"))
                ended = datetime.datetime.fromisoformat(timing["shell.execute_reply"].replace("Z", "+00:00"))
                answers[cell.id]["seconds"] = round((ended - began).total_seconds(), 1)
        stored["notebooks"][path.name] = {
            "date": datetime.date.today().isoformat(), "machine": machine(), "load_before": load,
            "load_after": round(os.getloadavg()[0], 1),
            "torch": torch.__version__, "threads": os.environ.get("OMP_NUM_THREADS"), "answers": answers}
        print(f"{path.relative_to(ROOT)}: {len(answers)} answer(s) at full size, {time.perf_counter() - start:.0f} s",
              flush=True)
        FIGURES.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])

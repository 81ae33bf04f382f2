"""Wall time of the whole course's test run (`pytest`: unit tests + every notebook under nbval), per notebook and
per test file (setup + call + teardown from pytest's --durations=0, so a notebook's kernel start is included),
and the slowest notebook cells.

    python benchmarks/course.py            # one full pytest run (budget: 3 min on 2 cores)
    python benchmarks/course.py --quick    # only tests/test_config.py and notebooks/00_overview.ipynb
"""

import re
import subprocess
import sys
import time
from collections import defaultdict

import nbformat

from common import REPO_ROOT, Run, parse_args, print_table

DURATION = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+?)::(.+?)\s*$")
SUMMARY = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)")
NOTEBOOK_BUDGET_S = 60  # the budget per notebook (docs/design.md, section 3 (notebooks nbval can trust)) ...
TRAINING_BUDGET_S = 150  # ... except the training notebook
COURSE_BUDGET_S = 180  # and for the whole pytest run


def first_line(notebook: str, cell_num: int) -> str:
    """The first line of the cell_num-th code cell that is not a marker (#| export, # NBVAL_...)."""
    cells = [c for c in nbformat.read(REPO_ROOT / notebook, as_version=4).cells if c.cell_type == "code"]
    for line in cells[cell_num].source.splitlines():
        if line.strip() and not line.startswith(("#|", "# NBVAL")):
            return line.strip()[:60]
    return ""


def main():
    args = parse_args(__doc__)
    run = Run("course", args)
    targets = ["tests/test_config.py", "notebooks/00_overview.ipynb"] if args.quick else []
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0",
               "--durations-min=0", *targets]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start

    per_file, cells = defaultdict(float), []
    for line in proc.stdout.splitlines():
        match = DURATION.match(line)
        if match:
            seconds, phase, path, name = float(match[1]), match[2], match[3], match[4]
            per_file[path] += seconds
            if path.endswith(".ipynb") and phase == "call":
                cells.append((seconds, path, name))
    counts = {kind: int(n) for n, kind in SUMMARY.findall(proc.stdout.splitlines()[-1] if proc.stdout else "")}
    if not per_file:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        raise RuntimeError("pytest printed no durations: see its output above")

    rows = [[path, f"{seconds:.1f} s",
             "" if not path.endswith(".ipynb") else
             ("ok" if seconds <= (TRAINING_BUDGET_S if "09_training" in path else NOTEBOOK_BUDGET_S) else "OVER")]
            for path, seconds in sorted(per_file.items())]
    rows.append(["whole pytest run (wall, incl. start-up)", f"{wall:.1f} s",
                 "ok" if wall <= COURSE_BUDGET_S else "OVER"])
    print_table(["file", "time", "budget"], rows,
                title=f"pytest: {', '.join(f'{n} {k}' for k, n in counts.items())}; return code {proc.returncode}")
    cells.sort(reverse=True)
    slowest = [{"seconds": s, "notebook": path, "cell": name, "first_line": first_line(path, int(name.split()[-1]))}
               for s, path, name in cells[:10]]
    print_table(["time", "notebook", "cell", "first line"],
                [[f"{c['seconds']:.2f} s", c["notebook"], c["cell"], c["first_line"]] for c in slowest],
                title="slowest notebook cells (call phase)")
    run.finish({
        "command": " ".join(["python", "-m", "pytest", *command[3:]]), "returncode": proc.returncode,
        "counts": counts, "wall_s": wall, "per_file_s": dict(sorted(per_file.items())),
        "notebooks_s": {p: s for p, s in sorted(per_file.items()) if p.endswith(".ipynb")},
        "slowest_cells": slowest, "notebook_budget_s": NOTEBOOK_BUDGET_S, "training_budget_s": TRAINING_BUDGET_S,
        "course_budget_s": COURSE_BUDGET_S,
    })


if __name__ == "__main__":
    main()

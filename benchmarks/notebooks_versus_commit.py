"""Wall time of notebooks under nbval now against the same notebooks at an earlier commit, interleaved
(then, now, then, now, ...) so both see the same machine load; medians per notebook and the median of the
per-round differences now - then. For a change that must not make a lesson slower.

    python benchmarks/notebooks_versus_commit.py 1a48f04 notebooks/05_attention.ipynb notebooks/08_generation.ipynb
    python benchmarks/notebooks_versus_commit.py 1a48f04 --repeats 3      # every notebook, 3 rounds

The earlier commit is checked out with `git worktree` into a temporary folder, and its notebooks run with its own
course_lib first on PYTHONPATH (ahead of the editable install of the current one). Each run is one
`pytest <notebook>` process: kernel start, every cell, nbval's comparison.
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO_ROOT, Run, parse_args, print_table


def extra_arguments(parser):
    parser.add_argument("commit", help="the earlier commit, e.g. 1a48f04")
    parser.add_argument("notebooks", nargs="*", help="notebook paths (default: every notebook)")


def seconds_of(root: Path, notebook: str) -> float:
    """One nbval run of `notebook` inside checkout `root`, with that checkout's course_lib; fails loudly."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", notebook], cwd=root,
                          env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{notebook} failed in {root}:\n{proc.stdout[-3000:]}")
    return seconds


def main():
    args = parse_args(__doc__, extra_arguments)
    notebooks = args.notebooks or sorted(str(p.relative_to(REPO_ROOT))
                                         for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    repeats = args.repeats or (1 if args.quick else 2)
    run, results = Run("notebooks_versus_commit", args), {}
    with tempfile.TemporaryDirectory() as folder:
        then_root = Path(folder) / "then"
        subprocess.run(["git", "worktree", "add", "--detach", str(then_root), args.commit], cwd=REPO_ROOT,
                       check=True, capture_output=True)
        try:
            rows = []
            for notebook in notebooks:
                times = {"then": [], "now": []}
                for _ in range(repeats):
                    for label, root in (("then", then_root), ("now", REPO_ROOT)):
                        if label == "then" and not (root / notebook).exists():
                            continue  # a notebook the earlier commit did not have
                        times[label].append(seconds_of(root, notebook))
                then = statistics.median(times["then"]) if times["then"] else None
                now = statistics.median(times["now"])
                diffs = [b - a for a, b in zip(times["then"], times["now"])]
                rows.append([notebook, "-" if then is None else f"{then:.1f} s", f"{now:.1f} s",
                             "-" if not diffs else f"{statistics.median(diffs):+.1f} s"])
                results[notebook] = times
                print(f"{notebook}: then {times['then']} now {times['now']}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(then_root)], cwd=REPO_ROOT, check=False)
    print_table(["notebook", f"then ({args.commit}), median", "now, median", "now - then (median of rounds)"], rows)
    run.finish({"commit": args.commit, "seconds": results})


if __name__ == "__main__":
    main()

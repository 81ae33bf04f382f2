"""Run every notebook top to bottom on this machine's GPU, without comparing outputs, report each one's time, error
and GPU memory peak, then run the CUDA-only tests. The test session (pytest) runs the notebooks on the CPU, so that
they match the outputs stored in them (conftest.py sets COURSE_DEVICE=cpu); this command shows that the course runs
where a learner with a GPU runs it: get_device() picks the GPU.

    python tools/notebooks_on_gpu.py                                   # every notebook, then pytest -m cuda tests
    python tools/notebooks_on_gpu.py notebooks/09_training.ipynb --no-tests
    python tools/notebooks_on_gpu.py --smoke                           # on the CPU, notebook 00: the command itself

The worked answers run at the tests' size (COURSE_ANSWER_SIZE=small, unless set). Cells tagged skip-execution (the
downloads) are skipped, as under nbval. Writes benchmarks/results/notebooks_on_gpu.json: per notebook its seconds
(kernel start included), its first error or null, and the kernel's peak of GPU memory; the CUDA-only tests' exit
code and summary; the device, PyTorch and CUDA versions, the date. Exits 1 if a notebook or a test failed.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "notebooks_on_gpu.json"
# Appended to each notebook for this run only: what the kernel's allocator held at most, in bytes.
PEAK_CELL = ("import torch\nprint('peak bytes:', torch.cuda.max_memory_allocated() if torch.cuda.is_available() "
             "else 0)")


def run_notebook(path: Path, execute) -> dict:
    """One notebook in a fresh kernel: seconds, the first error (None if it ran through) and the GPU memory peak."""
    notebook = nbformat.read(path, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(PEAK_CELL))
    start = time.perf_counter()
    try:
        notebook, _ = execute(path, notebook=notebook)
    except CellExecutionError as error:
        return {"seconds": round(time.perf_counter() - start, 1), "error": f"{error.ename}: {error.evalue}"[:500],
                "peak_gpu_bytes": None}
    printed = "".join(output.get("text", "") for output in notebook.cells[-1].outputs)
    return {"seconds": round(time.perf_counter() - start, 1), "error": None,
            "peak_gpu_bytes": int(printed.split("peak bytes:")[1])}


def cuda_tests() -> dict:
    """`pytest -m cuda tests`: the tests that skip without a GPU (conftest.py marks them)."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-m", "cuda", "tests", "-q", "-p", "no:cacheprovider",
                             "-o", "addopts=-n auto -rs"], cwd=ROOT, capture_output=True, text=True)
    lines = result.stdout.strip().splitlines()
    return {"exit_code": result.returncode, "summary": lines[-1] if lines else result.stderr[-500:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--smoke", action="store_true", help="on the CPU, notebook 00 unless others are named")
    parser.add_argument("--no-tests", action="store_true", help="leave out the CUDA-only tests")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    import torch

    if not (args.smoke or torch.cuda.is_available()):
        print("no CUDA GPU here (torch.cuda.is_available() is False): run it on a GPU machine, or with --smoke to "
              "check the command on the CPU", file=sys.stderr)
        return 1
    # The kernels inherit these: the device get_device() returns in every notebook, the answers' size.
    os.environ["COURSE_DEVICE"] = "cpu" if args.smoke else "cuda"
    os.environ.setdefault("COURSE_ANSWER_SIZE", "small")
    sys.path.insert(0, str(ROOT / "tools"))
    from refresh_notebooks import execute

    default = ["00_overview.ipynb"] if args.smoke else None
    paths = [p.resolve() for p in args.notebooks] or sorted(
        p for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb") if default is None or p.name in default)
    report = {"command": "python tools/notebooks_on_gpu.py " + " ".join(sys.argv[1:]),
              "device": os.environ["COURSE_DEVICE"], "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "machine": platform.machine(), "notebooks": {}}
    start = time.perf_counter()
    for path in paths:
        report["notebooks"][path.name] = row = run_notebook(path, execute)
        print(f"{path.name:28s} {row['seconds']:6.1f} s  peak {(row['peak_gpu_bytes'] or 0) / 2**30:5.2f} GiB  "
              f"{row['error'] or 'ok'}", flush=True)
    report["notebooks_seconds"] = round(time.perf_counter() - start, 1)
    if not args.no_tests:
        report["cuda_tests"] = cuda_tests()
        print("CUDA-only tests:", report["cuda_tests"]["summary"], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    failed = any(row["error"] for row in report["notebooks"].values()) or report.get("cuda_tests", {}).get("exit_code")
    return 1 if failed else 0  # pytest's exit code 5 (no test selected) counts as a failure too


if __name__ == "__main__":
    sys.exit(main())

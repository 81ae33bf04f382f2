"""The course on a GPU machine (issue 49, item 3), proven on the CPU: get_device() reads COURSE_DEVICE first;
conftest.py sets it to cpu for the test session unless it is set, and the notebook kernels inherit it, so on a
machine with CUDA the notebooks still compute on the CPU and match their stored outputs (shown here with CUDA faked
inside a kernel); every notebook picks its device through get_device(); conftest.py marks the CUDA-only tests so
that `pytest -m cuda` selects them; tools/notebooks_on_gpu.py runs notebooks and reports each one's time and error."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from course_lib.config import get_device

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
sys.path.insert(0, str(ROOT / "tools"))
from refresh_notebooks import execute  # noqa: E402  (tools/ is not a package)


def test_get_device_reads_course_device_before_looking_for_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with CUDA, as far as torch says
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    assert get_device() == torch.device("cuda")
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    assert get_device() == torch.device("cpu")
    monkeypatch.setenv("COURSE_DEVICE", "")  # set but empty: as if unset
    assert get_device() == torch.device("cuda")
    monkeypatch.setenv("COURSE_DEVICE", "gpu")
    with pytest.raises(ValueError, match="COURSE_DEVICE is 'gpu': set it to 'cpu', 'cuda' or 'mps'"):
        get_device()


def test_course_device_naming_a_missing_device_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("COURSE_DEVICE", "cuda")
    with pytest.raises(ValueError, match="COURSE_DEVICE is 'cuda' but this machine has no cuda device"):
        get_device()


@pytest.mark.parametrize("before, after", [(None, "cpu"), ("mps", "mps")])
def test_conftest_sets_cpu_for_the_session_unless_it_is_set(before, after):
    env = {k: v for k, v in os.environ.items() if k != "COURSE_DEVICE"} | ({"COURSE_DEVICE": before} if before else {})
    code = "import runpy, os; runpy.run_path('conftest.py'); print(os.environ['COURSE_DEVICE'])"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == [after]


def test_a_notebook_kernel_with_cuda_computes_on_the_cpu_under_the_tests_and_on_the_gpu_without(tmp_path,
                                                                                                monkeypatch):
    """A fresh notebook kernel, started as nbval starts it, where torch says CUDA is available: it inherits
    COURSE_DEVICE=cpu from the session and get_device() gives the CPU; without the variable (a learner's Jupyter)
    the same call gives CUDA."""
    monkeypatch.setenv("COURSE_DEVICE", "cpu")  # what conftest.py sets for the session
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import os\nimport torch\ntorch.cuda.is_available = lambda: True  # CUDA, faked"),
        nbformat.v4.new_code_cell("from course_lib.config import get_device\nprint(get_device())"),
        nbformat.v4.new_code_cell("del os.environ['COURSE_DEVICE']\nprint(get_device())")])
    path = tmp_path / "device.ipynb"
    nbformat.write(notebook, path)
    ran, _ = execute(path)
    assert [cell.outputs[0]["text"].strip() for cell in ran.cells[1:]] == ["cpu", "cuda"]


# A device written into a lesson cell instead of get_device(): it would ignore COURSE_DEVICE.
CHOOSING = re.compile(r"torch\.device\([\"'](cuda|mps)|\.to\([\"'](cuda|mps)|device=[\"'](cuda|mps)|\.cuda\(\)|"
                      r"torch\.cuda\.is_available\(\)|torch\.backends\.mps\.is_available\(\)")


def test_the_pattern_finds_a_device_chosen_by_hand():
    assert CHOOSING.search('model.to("cuda")') and CHOOSING.search("x.cuda()")
    assert CHOOSING.search("if torch.cuda.is_available():") and not CHOOSING.search("device = get_device()")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_chooses_its_device_through_get_device(path):
    """Outside the exported cells (library code that uses the device it is given) and the cells that tests skip
    (downloads), no cell picks a device itself."""
    chosen = [(cell.get("id"), match.group(0)) for cell in nbformat.read(path, as_version=4).cells
              if cell.cell_type == "code" and not cell.source.startswith("#| export")
              and "# NBVAL_SKIP" not in cell.source.splitlines()
              for match in CHOOSING.finditer(cell.source)]
    assert not chosen, f"{path.name}: cells that choose a device by hand (use get_device()): {chosen}"


class FakeItem:
    """What conftest.py's collection hook reads of a test item: its skipif marks; and what it writes: markers."""

    def __init__(self, reason):
        self.marks = [pytest.mark.skipif(True, reason=reason).mark]
        self.added = []

    def iter_markers(self, name):
        return iter(self.marks if name == "skipif" else [])

    def add_marker(self, marker):
        self.added.append(marker)


def test_the_cuda_only_tests_carry_the_cuda_marker():
    """conftest.py marks every test skipped for 'needs a CUDA GPU' (and no other), so `pytest -m cuda` selects them;
    every CUDA-only test in tests/ gives exactly that reason."""
    import conftest

    cuda_only, other = FakeItem("needs a CUDA GPU"), FakeItem("needs a machine without CUDA")
    conftest.pytest_collection_modifyitems(None, [cuda_only, other])
    assert cuda_only.added == ["cuda"] and other.added == []
    reasons = {reason for path in (ROOT / "tests").glob("test_*.py")
               for reason in re.findall(r'reason="([^"]*(?:CUDA|GPU)[^"]*)"', path.read_text())}
    assert {"needs a CUDA GPU"} <= reasons <= {"needs a CUDA GPU", "needs a machine without CUDA",
                                              "this machine has a GPU: the benchmark would run",
                                              "this machine has a GPU: the command would run"}, reasons


def test_the_gpu_tool_reports_each_notebooks_time_and_its_first_error(tmp_path, monkeypatch, capsys):
    """tools/notebooks_on_gpu.py: without a GPU it refuses and names --smoke; with --smoke (the CPU) a notebook
    that runs through is reported with its seconds, one that divides by zero with its error, and it returns 1."""
    import notebooks_on_gpu

    if not torch.cuda.is_available():
        monkeypatch.setattr(sys, "argv", ["notebooks_on_gpu.py"])
        assert notebooks_on_gpu.main() == 1 and "no CUDA GPU here" in capsys.readouterr().err
    fine, broken = tmp_path / "fine.ipynb", tmp_path / "broken.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), fine)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"),
                                                    nbformat.v4.new_code_cell("1 / 0")]), broken)
    out = tmp_path / "report.json"
    monkeypatch.setattr(sys, "argv", ["notebooks_on_gpu.py", "--smoke", "--no-tests", "--out", str(out), str(fine),
                                      str(broken)])
    monkeypatch.setenv("COURSE_DEVICE", "cpu")  # main() sets it for its kernels; monkeypatch puts it back after
    assert notebooks_on_gpu.main() == 1
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and list(report["notebooks"]) == ["fine.ipynb", "broken.ipynb"]
    assert report["notebooks"]["fine.ipynb"]["error"] is None and report["notebooks"]["fine.ipynb"]["seconds"] > 0
    assert report["notebooks"]["fine.ipynb"]["peak_gpu_bytes"] == 0
    assert report["notebooks"]["broken.ipynb"]["error"] == "ZeroDivisionError: division by zero"

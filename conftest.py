"""Settings for the whole test run: the unit tests and every notebook kernel that nbval starts (kernels
inherit this process's environment)."""

import os

# One PyTorch thread per process unless you set it yourself. On a machine whose cores other jobs are using, a
# second OpenMP thread makes every operation wait for a busy core: a training step of notebook 09's model took
# 340-385 ms with 2 threads against 67-84 ms with 1, and notebook 09 ran past nbval's cell timeout (docs/performance.md,
# Thread policy). Must be set before torch is imported, which is why it lives here and not in a fixture.
for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, "1")

# Worked answers whose full run takes more than a few seconds read their size from course_lib.checks.answer_size:
# under the tests (and tools/refresh_notebooks.py, which imports this file) they run small; a learner's run is full.
os.environ.setdefault("COURSE_ANSWER_SIZE", "small")

# The notebooks' stored outputs were computed on a CPU, and nbval compares every cell with them: on a GPU machine the
# test kernels must compute on the CPU too. get_device() (notebook 00), the one place where any notebook picks a
# device, reads COURSE_DEVICE first; set it yourself (COURSE_DEVICE=cuda) to run the tests' kernels elsewhere. A
# learner's own Jupyter, started without it, uses the fastest device (tools/notebooks_on_gpu.py runs them so).
os.environ.setdefault("COURSE_DEVICE", "cpu")


# Every figure a notebook draws must be readable in a lecture hall (docs/design.md, section 4 (what a lesson looks
# like)): each nbval kernel checks each figure it renders with tests/figure_check.py, and a figure that breaks a rule
# turns the cell that showed it into an error that names the problems. The kernels inherit IPYTHONDIR from this
# process, so it points at a profile made for this test session only, in a temporary folder: its startup file installs
# the check, its config keeps no history database. Your own ~/.ipython and Jupyter are untouched (and, as a bonus,
# your own startup files no longer leak into the test kernels). COURSE_FIGURE_CHECK=0 switches the check off. Made
# once, by the first process that loads this file: pytest-xdist's workers inherit the variables and reuse the folder.
def _figure_check_profile():
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    if os.environ.get("COURSE_FIGURE_CHECK") == "0" or os.environ.get("COURSE_FIGURE_CHECK_IPYTHONDIR"):
        return
    checker = Path(__file__).resolve().parent / "tests" / "figure_check.py"
    ipython_dir = Path(tempfile.mkdtemp(prefix="course-ipython-"))
    atexit.register(shutil.rmtree, ipython_dir, ignore_errors=True)
    profile = ipython_dir / "profile_default"
    (profile / "startup").mkdir(parents=True)
    (profile / "ipython_config.py").write_text("c.HistoryManager.enabled = False  # no history.sqlite shared by the kernels\n")
    # A startup file runs in the notebook's namespace: define nothing that a notebook could use by accident.
    (profile / "startup" / "00-figure-check.py").write_text(
        "def _course_figure_check():\n"
        "    import importlib.util, sys\n"
        f"    spec = importlib.util.spec_from_file_location('_course_figure_check', {str(checker)!r})\n"
        "    module = importlib.util.module_from_spec(spec)\n"
        "    sys.modules[spec.name] = module\n"
        "    spec.loader.exec_module(module)\n"
        "    module.install()\n"
        "_course_figure_check()\n"
        "del _course_figure_check\n")
    os.environ["IPYTHONDIR"] = os.environ["COURSE_FIGURE_CHECK_IPYTHONDIR"] = str(ipython_dir)


_figure_check_profile()


CUDA_REASON = "needs a CUDA GPU"  # the skip reason of every CUDA-only test


def pytest_configure(config):
    config.addinivalue_line("markers", f"cuda: a CUDA-only test (skipped with the reason {CUDA_REASON!r} where "
                            "there is no GPU); `pytest -m cuda tests` runs just those (tools/notebooks_on_gpu.py)")


# A learner may paste a worked answer into a fresh cell at the end of a notebook and run it there. nbval runs each
# answer where it stands; this hook also runs one answer of every notebook a second time (its last answer that
# does not read answer_size, or, where all do, its last: a cheap one to repeat), in the same kernel,
# after the notebook's last cell (an extra test item, "Cell N pasted at the end"): it fails if the answer uses a name
# that a later cell rebinds or a state that a later cell changes. Its output is not compared, only its errors.
def pytest_collection_modifyitems(config, items):
    import importlib.util
    from collections import defaultdict
    from pathlib import Path

    for item in items:  # the CUDA-only tests are known by their skip reason: mark them, so that `-m cuda` finds them
        if any(mark.kwargs.get("reason") == CUDA_REASON for mark in item.iter_markers("skipif")):
            item.add_marker("cuda")
    try:
        from nbval.plugin import IPyNbCell
    except ImportError:  # nbval not installed: nothing to add
        return
    spec = importlib.util.spec_from_file_location(
        "_course_answer_figures", Path(__file__).resolve().parent / "tools" / "answer_figures.py")
    answers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(answers)
    last_item = {}  # each notebook's collector -> the position of its last cell in `items`
    for position, item in enumerate(items):
        if isinstance(item, IPyNbCell):
            last_item[item.parent] = position
    for notebook, position in sorted(last_item.items(), key=lambda pair: -pair[1]):  # from the back: positions hold
        code_cells = [cell for cell in notebook.nb.cells if cell.cell_type == "code"]
        first = answers.answer_to_paste(code_cells)
        if first is None:
            continue
        pasted = answers.pasted_cell(code_cells[first])
        items.insert(position + 1, IPyNbCell.from_parent(
            notebook, name=f"Cell {first} pasted at the end", cell_num=len(code_cells), cell=pasted,
            options=defaultdict(bool, check=False)))

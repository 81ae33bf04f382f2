"""The lesson reads as its idea, and its doors are a layer of their own (docs: the doors).

* Check lines (as `tools/guard_lines.py` counts them: an `if` whose body ends in `raise`, an `assert`, a call into
  the door layer or the guards, whatever the names) are at most 8% of the code lines of all lesson modules together
  and at most 12% of any one; a lesson function holds at most one check line (the call to its door), except the
  errors that are the lesson itself, listed in LESSON_ERRORS with why.
* The doors live in course_lib/doors/, one file per lesson module, each saying at its top that it is not a lesson.
* No import cycle: every lesson module and every door imports alone, and a door never imports its own lesson or a
  later one at import time.
* The counter itself is tested on small sources, so a rule that cannot fail is caught here.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from guard_lines import count, lesson_modules, measure  # noqa: E402

ALL_LIMIT, MODULE_LIMIT = 0.08, 0.12
# function -> why its checks are the lesson, not a door
LESSON_ERRORS: dict[str, str] = {}


@pytest.fixture(scope="module")
def counts():
    return measure()


def test_the_lesson_modules_are_found_from_their_header(counts):
    assert {"config", "attention", "model", "generation", "training", "shards", "finetuning", "alignment",
            "modern"} <= set(counts)
    assert "guards" not in counts and "pretrain" not in counts


def test_check_lines_of_all_lesson_modules_together_at_most_8_percent(counts):
    checks, code = sum(c.checks for c in counts.values()), sum(c.code for c in counts.values())
    assert checks <= ALL_LIMIT * code, (f"{checks} check lines of {code} code lines ({100 * checks / code:.1f}%) in "
                                        f"the lesson modules: move checks to course_lib/doors/")


@pytest.mark.parametrize("module", lesson_modules())
def test_check_lines_of_one_module_at_most_12_percent(counts, module):
    c = counts[module]
    assert c.checks <= MODULE_LIMIT * c.code, (f"course_lib/{module}.py: {c.checks} check lines of {c.code} "
                                               f"({100 * c.checks / c.code:.1f}%): move them to "
                                               f"course_lib/doors/{module}.py")


@pytest.mark.parametrize("module", lesson_modules())
def test_a_lesson_function_holds_at_most_one_check_line(counts, module):
    crowded = {f: n for f, n in counts[module].crowded.items() if f"{module}.{f}" not in LESSON_ERRORS}
    assert not crowded, (f"course_lib/{module}.py: functions with more than one check line {crowded}: give each "
                         f"one door call, in course_lib/doors/{module}.py")


def test_every_door_file_says_it_is_not_a_lesson_and_guards_a_lesson():
    modules = set(lesson_modules())
    for path in sorted((ROOT / "course_lib" / "doors").glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        assert doc.startswith("Not a lesson"), f"{path.name}: start its docstring with 'Not a lesson'"
        assert path.stem == "__init__" or path.stem in modules, f"doors/{path.name} guards no lesson module"


def test_a_door_imports_no_lesson_of_its_own_or_later_at_import_time():
    order = lesson_modules()
    for path in sorted((ROOT / "course_lib" / "doors").glob("*.py")):
        if path.stem == "__init__":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:  # module level only: an import inside a function runs after both modules exist
            if not isinstance(node, ast.ImportFrom):
                continue
            module = node.module or ""
            name = (module if node.level == 2 else module.removeprefix("course_lib.") if node.level == 0
                    else "").split(".")[0]  # `from ..model import GPTModel` or `from course_lib.model import ...`
            if name in order:
                assert order.index(name) < order.index(path.stem), (
                    f"doors/{path.name} imports lesson {name} at import time: a door imports only earlier lessons "
                    "(import its own lesson's class inside the function)")


def test_every_lesson_module_and_door_imports_alone():
    """Each in a course_lib imported afresh (every course_lib module dropped from sys.modules first): an import
    cycle shows as an ImportError of a partly initialised module."""
    names = [f"course_lib.{m}" for m in lesson_modules()]
    names += [f"course_lib.doors.{p.stem}" for p in sorted((ROOT / "course_lib" / "doors").glob("*.py"))
              if p.stem != "__init__"]
    script = ("import importlib, sys\nimport torch\nfailed = []\n"
              f"for name in {names!r}:\n"
              "    for loaded in [m for m in sys.modules if m == 'course_lib' or m.startswith('course_lib.')]:\n"
              "        del sys.modules[loaded]\n"
              "    try:\n        importlib.import_module(name)\n"
              "    except Exception as error:\n        failed.append(f'{name}: {error!r}')\n"
              "print('\\n'.join(failed))\nsys.exit(1 if failed else 0)\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


# The counter, on sources where the answer is known.
def test_counter_counts_if_raise_assert_and_door_calls_and_finds_crowded_functions():
    source = '''
from .doors import demo as door
from .guards import require_int

def lean(x):
    """A docstring is not code."""
    door.lean(x)
    return x + 1

def crowded(x, y):
    if x < 0:
        raise ValueError("x")
    assert y
    require_int("y", y)
    return x * y
'''
    c = count(source)
    assert c.checks == 5  # door.lean, the if and its raise, the assert, require_int
    assert c.crowded == {"crowded": 4}
    assert c.code == 11


def test_counter_sees_a_door_call_under_any_name_and_a_nested_check():
    source = '''
from course_lib.doors.demo import anything as gate

class Model:
    def forward(self, x):
        for row in x:
            if row is None:
                raise ValueError("row")
        y = gate(x)
        return y
'''
    c = count(source)
    assert c.crowded == {"Model.forward": 4}  # the for of ifs (3 lines) and the door call
    assert count("from .doors import moved\n__getattr__ = moved(__name__, {})\n").checks == 0


def test_counter_lets_one_door_call_wrap_but_not_an_inline_check():
    wrapped = "from .doors import demo as door\n\ndef f(a, b):\n    door.f(a,\n           b)\n    return a\n"
    assert count(wrapped).crowded == {} and count(wrapped).checks == 2
    inline = "def f(a):\n    if a < 0:\n        raise ValueError('a')\n    return a\n"
    assert count(inline).crowded == {"f": 2}


@pytest.mark.parametrize("module", lesson_modules())
def test_every_moved_name_still_imports_from_its_old_place_with_a_warning_that_names_the_new_one(module):
    import importlib
    import warnings

    lesson = importlib.import_module(f"course_lib.{module}")
    names = getattr(getattr(lesson, "__getattr__", None), "names", {})
    for old, target in names.items():
        where, new = target.split(":")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = getattr(lesson, old)
        assert value is getattr(importlib.import_module(where), new), f"course_lib.{module}.{old} is not {target}"
        assert [w.category for w in caught] == [DeprecationWarning], f"course_lib.{module}.{old} does not warn"
        assert f"{where}.{new}" in str(caught[0].message)
        assert old not in lesson.__all__
    with pytest.raises(AttributeError, match="no attribute"):
        getattr(lesson, "no_such_name_here")


def test_the_old_guard_names_still_import_with_a_warning():
    import warnings

    import course_lib.guards as guards
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert guards.check_int is guards.require_int
    assert caught[0].category is DeprecationWarning and "require_int" in str(caught[0].message)

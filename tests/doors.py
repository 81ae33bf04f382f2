"""Not a test file: the common part of the adversarial door tables, tests/test_doors_<module>.py (issue 30).

A table lists calls a user who has not read the code might make, each with what must happen: ("error",
ExceptionType, a fragment of our message) or ("result", a check of the value). A case is (name, call, expected,
pytest marks...), the flat (name, call, "error", ExceptionType, fragment), or an entry {name: (call, expected)};
an expected error with a fourth item "pytorch" is PyTorch's own message, which names no argument of ours. Each table
file runs every case as a test, and `python tests/test_doors_<module>.py` prints how many cases are clear errors,
correct results, unclear errors and silent wrong answers (-v lists them all)."""

import re
import sys
import traceback
from collections import Counter
from pathlib import Path

import pytest
import torch

TORCH = str(Path(torch.__file__).parent)


def error(kind: type, fragment: str) -> tuple:
    return ("error", kind, fragment)


def result(check) -> tuple:
    return ("result", check)


def as_cases(table) -> list[tuple]:
    """(name, call, expected, marks) for every case of a table, in any of the forms above."""
    rows = [(name, *row) for name, row in table.items()] if isinstance(table, dict) else table
    cases = []
    for name, call, *rest in rows:
        marks = [item for item in rest if isinstance(item, pytest.MarkDecorator)]
        rest = [item for item in rest if not isinstance(item, pytest.MarkDecorator)]
        cases.append((name, call, rest[0] if len(rest) == 1 else tuple(rest), marks))
    return cases


def raised_in_torch(error: BaseException) -> bool:
    """Did the error come from inside PyTorch (a kernel, a torch function) rather than from a door that refused the
    argument before anything ran? The innermost frame of its traceback says."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(TORCH)


def outcome(call, expected) -> str:
    """'clear', 'correct', 'unclear' (an error that is not ours, or an error where a result was due) or 'silent'
    (a result where an error was due, or a result that fails its check)."""
    try:
        value = call()
    except Exception as raised:  # noqa: BLE001 - the point is to sort every failure
        ours = (expected[0] == "error" and isinstance(raised, expected[1]) and expected[2] in str(raised)
                and expected[3:] != ("pytorch",) and not raised_in_torch(raised))
        return "clear" if ours else "unclear"
    if expected[0] == "error":
        return "silent"
    try:
        return "correct" if expected[1](value) else "silent"
    except Exception:  # noqa: BLE001 - a check that cannot even read the value
        return "silent"


def door_tests(table):
    """A pytest test that runs every case of the table: the error with our fragment, or a result its check accepts."""
    @pytest.mark.parametrize("call, expected", [pytest.param(call, expected, marks=marks, id=name)
                                                for name, call, expected, marks in as_cases(table)])
    def test_door(call, expected):
        if expected[0] == "error":
            with pytest.raises(expected[1], match=re.escape(expected[2])) as raised:
                call()
            if expected[3:] != ("pytorch",):  # ours: refused at the door, before any kernel ran
                assert not raised_in_torch(raised.value), ("the error was raised inside PyTorch, not at the door:\n"
                                                           + "".join(traceback.format_tb(raised.tb)[-2:]))
        else:
            assert expected[1](call())
    return test_door


def report(table) -> None:
    counts = Counter()
    for name, call, expected, _ in as_cases(table):
        counts[kind := outcome(call, expected)] += 1
        if "-v" in sys.argv or kind in ("unclear", "silent"):
            print(f"{kind:8} {name}")
    print(dict(counts), "of", sum(counts.values()))

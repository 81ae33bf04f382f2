"""Not a lesson: the argument doors of the lessons, one file per lesson module (`doors/generation.py` guards
`course_lib/generation.py`).

A lesson function reads as its idea: its body holds at most one line of argument checking, a call to its door
(`door.generate(model, token_ids, ...)`), and then the mathematics. The door is as thorough as it must be: every
refusal is a TypeError or ValueError that names the argument, the value it got and the fix, raised before anything
is computed or written. Doors use the shared guards (`course_lib.guards`, named `require_*`) and import only the
guards, other doors and the lessons before their own (never their own lesson: that would be an import cycle; a door
that needs its lesson's own class imports it inside the function).

Three kinds of checking, three names: argument doors (here, named after what they guard), exercise checks that grade
a learner's code (`course_lib.checks.check_*`), and the lessons' own reply checker (`judge_reply`, notebook 14).
"""

import importlib
import warnings


def moved(module: str, names: dict[str, str]):
    """A module-level `__getattr__` for the public names that left a lesson module: `names` maps each old name to
    its new place, 'course_lib.doors.generation:sampling'. The old import keeps working for one version and warns
    with a DeprecationWarning that names the new place."""
    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, new = names[name].split(":")
        warnings.warn(f"{module}.{name} moved to {where}.{new}; import it from there", DeprecationWarning,
                      stacklevel=2)
        return getattr(importlib.import_module(where), new)
    __getattr__.names = dict(names)  # what moved where, for the tests
    return __getattr__

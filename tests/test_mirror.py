"""The mirror rule: docs/design.md, section 2 (the mirror rule).

* The lesson modules are generated: a fresh export of the notebooks with nbdev's exporter equals
  course_lib/ byte for byte, comments included. A module is never edited by hand.
* Every module of course_lib comes from a notebook, or is one of NON_LESSON, which says so at its top.
* No notebook redefines a name exported by an earlier notebook, or (outside its exported cell) one of its
  own exported names.
* An exported cell imports only the modules of earlier notebooks and the shared guards, never
  `transformers` and never the exercise checks.

A failure names the notebook, the cell index or the module, and shows what differs.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from refresh_notebooks import export  # noqa: E402

DEFAULT_EXP = re.compile(r"^#\|\s*default_exp\s+(\w+)\s*$", re.MULTILINE)
EXPORT = re.compile(r"^#\|\s*export(?:\s+(\w+))?\s*$")  # `#| export`, or `#| export shards`: a second module
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
# Course infrastructure, not lessons: each says so in the first line of its docstring.
NON_LESSON = {"guards", "checks", "doors", "pretrain"}
NOT_A_LESSON = "Not a lesson"


@dataclass
class Definition:
    name: str
    node: ast.AST
    where: str  # "notebooks/05_attention.ipynb cell 12"


@dataclass
class Notebook:
    path: Path
    module: str | None
    exports: dict[str, Definition] = field(default_factory=dict)
    other_definitions: list[Definition] = field(default_factory=list)  # outside export cells, not imports
    imports: list[tuple[str, str]] = field(default_factory=list)  # (module imported, where) in export cells
    exported_cells: int = 0
    second_modules: set[str] = field(default_factory=set)  # from `#| export <module>` cells
    problems: list[str] = field(default_factory=list)


def rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def patched_name(node: ast.AST) -> str | None:
    """`Cls.method` for a function that fastcore's `@patch` adds to class Cls (its `self` annotated Cls): a method
    a later lesson adds to an earlier class where it teaches the addition, not a module-level name."""
    if (isinstance(node, ast.ClassDef) or not any(isinstance(d, ast.Name) and d.id == "patch" for d in node.decorator_list)
            or not node.args.args or node.args.args[0].annotation is None):
        return None
    return f"{ast.unparse(node.args.args[0].annotation)}.{node.name}"


def definitions(tree: ast.Module, where: str) -> tuple[list[Definition], list[str]]:
    """Top-level definitions of a cell, one per bound name; imports count once per alias.
    Returns the definitions and the statements that are not definitions (the caller decides)."""
    found, others = [], []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append(Definition(patched_name(node) or node.name, node, where))
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            found += [Definition(t.id, node, where) for t in node.targets]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.append(Definition(node.target.id, node, where))
        elif isinstance(node, ast.Import):
            found += [Definition(a.asname or a.name.split(".")[0], ast.Import(names=[a]), where) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found += [Definition(a.asname or a.name, ast.ImportFrom(module=node.module, names=[a], level=0), where)
                      for a in node.names]
        else:
            others.append(f"{where}: `{ast.unparse(node).splitlines()[0]}`")
    return found, others


def code_of(cell) -> str:
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def without_magics(source: str) -> str:
    """IPython lines (`%timeit`, `!pip`) are not Python; blank them so the cell still parses."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def allowed_import(parts: list[str], earlier: set[str], this: str | None) -> bool:
    """May an exported cell import course_lib.<parts[1:]>? `earlier`: the modules of earlier notebooks and this
    notebook's second modules. Those, the guards, and the doors of this lesson and earlier ones (`from
    course_lib.doors import attention as door` is recorded as course_lib.doors.attention, `from course_lib.doors
    import moved` as course_lib.doors.moved)."""
    if len(parts) >= 3 and parts[1] == "doors":
        return parts[2] in {*earlier, this, "moved"}
    return len(parts) >= 2 and parts[1] in {*earlier, "guards"}


def read_notebook(path: Path, root: Path) -> Notebook:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    code_cells = [(i, code_of(c)) for i, c in enumerate(cells) if c["cell_type"] == "code"]
    first = DEFAULT_EXP.search(code_cells[0][1]) if code_cells else None
    nb = Notebook(path, first.group(1) if first else None)
    name = rel(path, root)
    if nb.module is None:
        nb.problems.append(f"{name}: the first code cell has no `#| default_exp <module>` line")
    for index, source in code_cells:
        lines = source.splitlines()
        marker = EXPORT.match(lines[0]) if lines else None
        exported = marker is not None
        if marker is not None and marker.group(1):
            nb.second_modules.add(marker.group(1))
        try:
            tree = ast.parse(source if exported else without_magics(source))
        except SyntaxError as error:
            nb.problems.append(f"{name} cell {index}: does not parse ({error.msg}, line {error.lineno})")
            continue
        where = f"{name} cell {index}"
        found, others = definitions(tree, where)
        if not exported:
            nb.other_definitions += [d for d in found if isinstance(d.node, DEFINITIONS)]
            continue
        nb.exported_cells += 1
        nb.problems += [f"{o}: an exported cell may hold only definitions and imports" for o in others]
        for d in found:
            if isinstance(d.node, ast.Import):
                nb.imports.append((d.node.names[0].name, where))
            elif isinstance(d.node, ast.ImportFrom):  # a door module is named whole: course_lib.doors.attention
                doors = d.node.module in ("course_lib.doors", ".doors")
                nb.imports.append((f"{d.node.module}.{d.node.names[0].name}" if doors else d.node.module, where))
            elif d.name in nb.exports:
                nb.problems.append(f"{where}: `{d.name}` is exported twice (also in {nb.exports[d.name].where})")
            if not isinstance(d.node, (ast.Import, ast.ImportFrom)):
                nb.exports[d.name] = d
    return nb


def notebook_problems(root: Path) -> tuple[list[str], list[str]]:
    """Every violation of the rules that read the notebooks alone, and the modules the notebooks export."""
    problems: list[str] = []
    notebooks = [read_notebook(p, root) for p in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    claimed: dict[str, Notebook] = {}
    earlier_exports: dict[str, Definition] = {}
    for nb in notebooks:
        problems += nb.problems
        if nb.module is None:
            continue
        taken = [m for m in (nb.module, *sorted(nb.second_modules)) if m in claimed]
        if taken:
            problems.append(f"{rel(nb.path, root)}: module `{taken[0]}` is already a module of "
                            f"{rel(claimed[taken[0]].path, root)}; a module comes from one notebook")
            continue
        for d in nb.other_definitions:
            if d.name in earlier_exports:
                problems.append(f"{d.where}: redefines `{d.name}`, exported earlier by "
                                f"{earlier_exports[d.name].where}; import it from course_lib instead")
            elif d.name in nb.exports:
                problems.append(f"{d.where}: defines `{d.name}` outside its `#| export` cell "
                                f"({nb.exports[d.name].where}); give a draft version its own name (e.g. "
                                f"`{d.name}V1`)")
        for name, d in nb.exports.items():
            # every module may have its own `__getattr__` (the names that moved out of it, course_lib.doors.moved)
            if name in earlier_exports and "." not in name and name != "__getattr__":
                problems.append(f"{d.where}: redefines `{name}`, exported earlier by {earlier_exports[name].where}")
            # a class is written in its own lesson: a later one never adds or replaces a method with @patch
            # (docs/design.md, section 5), so the code that runs is found from the class
            cls = name.split(".")[0]
            if "." in name and cls in earlier_exports:
                problems.append(f"{d.where}: patches `{name}` onto `{cls}`, a class of "
                                f"{earlier_exports[cls].where}; write the method in that lesson's class")
        for imported, where in nb.imports:
            parts = imported.split(".")
            if parts[0] == "transformers":
                problems.append(f"{where}: course_lib must not import transformers")
            elif parts[0] == "course_lib" and not allowed_import(parts, {*claimed, *nb.second_modules}, nb.module):
                problems.append(f"{where}: imports `{imported}`, which is neither a module of an earlier "
                                "notebook, nor a second module of this one, nor course_lib.guards, nor the door "
                                "of this lesson or an earlier one (course_lib.doors.<module>)")
        for module in (nb.module, *sorted(nb.second_modules)):
            claimed[module] = nb
        earlier_exports.update(nb.exports)
    return problems, [module for module, nb in claimed.items() if nb.exported_cells]  # second modules included


def export_problems(root: Path, modules: list[str]) -> list[str]:
    """Differences between course_lib/ and a fresh export of the notebooks, and modules no notebook makes."""
    problems = []
    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch)
        shutil.copytree(root / "notebooks", fresh / "notebooks")
        shutil.copy(root / "pyproject.toml", fresh)
        export(fresh)
        for module in modules:
            committed, generated = root / "course_lib" / f"{module}.py", fresh / "course_lib" / f"{module}.py"
            fix = "edit the notebook, never the module, then run `python tools/refresh_notebooks.py`"
            if not committed.exists():
                problems.append(f"course_lib/{module}.py does not exist but a notebook exports it: {fix}")
            elif committed.read_bytes() != generated.read_bytes():
                diff = difflib.unified_diff(generated.read_text(encoding="utf-8").splitlines(),
                                            committed.read_text(encoding="utf-8").splitlines(),
                                            "fresh export", f"course_lib/{module}.py", n=1, lineterm="")
                problems.append(f"course_lib/{module}.py differs from a fresh export of its notebook: {fix}\n"
                                + "\n".join(list(diff)[:14]))
    for path in sorted((root / "course_lib").iterdir()):
        name = path.stem if path.suffix == ".py" else path.name
        if name in modules or name.startswith("_") or not (path.suffix == ".py" or (path / "__init__.py").exists()):
            continue
        if name not in NON_LESSON:
            problems.append(f"{rel(path, root)}: no notebook has `#| default_exp {name}`, and it is not one of "
                            f"the non-lesson modules {sorted(NON_LESSON)}")
            continue
        top = path if path.suffix == ".py" else path / "__init__.py"
        if not (ast.get_docstring(ast.parse(top.read_text(encoding="utf-8"))) or "").startswith(NOT_A_LESSON):
            problems.append(f"{rel(top, root)}: a non-lesson module must say so: start its docstring with "
                            f"'{NOT_A_LESSON}'")
    return problems


def mirror_problems(root: Path) -> list[str]:
    """Every violation of the mirror rule in the course at `root`."""
    problems, modules = notebook_problems(root)
    return problems + export_problems(root, modules)


def test_course_obeys_the_mirror_rule():
    problems = mirror_problems(ROOT)
    assert not problems, "\n\n".join(problems)


# The checker itself, on a tiny course written to a temporary folder: it must be able to fail.

PYPROJECT = '[project]\nname = "course_lib"\n\n[tool.nbdev]\nlib_path = "course_lib"\nnbs_path = "notebooks"\n'
CELLS = ["#| default_exp demo\nimport torch",
         "#| export\nimport math\n\ndef area(r):\n    return math.pi * r**2  # (batch,)", "area(2.0)"]


def write_notebook(path: Path, cells: list[str]) -> None:
    notebook = {"cells": [{"cell_type": "code", "source": s, "metadata": {}, "outputs": [], "execution_count": None,
                           "id": f"c{i}"} for i, s in enumerate(cells)],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(notebook))


def write_course(root: Path, *notebooks: list[str]) -> None:
    """Notebooks 00_demo, 01_later, ... with these cells, and course_lib/ freshly exported from them."""
    (root / "notebooks").mkdir()
    (root / "pyproject.toml").write_text(PYPROJECT)
    for number, (cells, name) in enumerate(zip(notebooks, ["demo", "later", "third"])):
        write_notebook(root / "notebooks" / f"{number:02d}_{name}.ipynb", cells)
    export(root)


def test_checker_accepts_a_fresh_export(tmp_path):
    write_course(tmp_path, CELLS)
    module = (tmp_path / "course_lib" / "demo.py").read_text()
    assert module.startswith("# AUTOGENERATED! DO NOT EDIT! File to edit: ../notebooks/00_demo.ipynb.")
    assert "def area(r):\n    return math.pi * r**2  # (batch,)" in module
    assert mirror_problems(tmp_path) == []


def test_checker_points_at_a_comment_edited_in_the_module(tmp_path):
    write_course(tmp_path, CELLS)
    module = tmp_path / "course_lib" / "demo.py"
    module.write_text(module.read_text().replace("# (batch,)", "# (batch, tokens)"))
    [problem] = mirror_problems(tmp_path)
    assert problem.startswith("course_lib/demo.py differs from a fresh export of its notebook: edit the notebook")
    assert "-    return math.pi * r**2  # (batch,)" in problem
    assert "+    return math.pi * r**2  # (batch, tokens)" in problem


def test_checker_rejects_a_notebook_edit_not_exported(tmp_path):
    write_course(tmp_path, CELLS)
    write_notebook(tmp_path / "notebooks" / "00_demo.ipynb", [CELLS[0], CELLS[1].replace("r**2", "r**3"), CELLS[2]])
    [problem] = mirror_problems(tmp_path)
    assert "-    return math.pi * r**3  # (batch,)" in problem and "+    return math.pi * r**2" in problem


def test_checker_rejects_a_missing_module(tmp_path):
    write_course(tmp_path, CELLS)
    (tmp_path / "course_lib" / "demo.py").unlink()
    assert mirror_problems(tmp_path) == [
        "course_lib/demo.py does not exist but a notebook exports it: edit the notebook, never the module, then "
        "run `python tools/refresh_notebooks.py`"]


def test_checker_rejects_a_module_no_notebook_exports(tmp_path):
    write_course(tmp_path, CELLS)
    (tmp_path / "course_lib" / "orphan.py").write_text("X = 1\n")
    (tmp_path / "course_lib" / "guards.py").write_text('"""Not a lesson: shared checks."""\n')
    (tmp_path / "course_lib" / "checks").mkdir()
    (tmp_path / "course_lib" / "checks" / "__init__.py").write_text('"""The exercise checks."""\n')
    assert mirror_problems(tmp_path) == [
        "course_lib/checks/__init__.py: a non-lesson module must say so: start its docstring with 'Not a lesson'",
        "course_lib/orphan.py: no notebook has `#| default_exp orphan`, and it is not one of the non-lesson "
        "modules ['checks', 'doors', 'guards', 'pretrain']"]


def test_checker_rejects_a_redefinition_outside_the_export_cell(tmp_path):
    write_course(tmp_path, CELLS + ["def area(r):\n    return 0"])
    [problem] = mirror_problems(tmp_path)
    assert problem.startswith("notebooks/00_demo.ipynb cell 3: defines `area` outside its `#| export` cell")


@pytest.mark.parametrize("exported", [False, True], ids=["plain cell", "export cell"])
def test_checker_rejects_a_later_notebook_redefining_an_earlier_export(tmp_path, exported):
    redefinition = ("#| export\n" if exported else "") + "def area(r):\n    return 0"
    write_course(tmp_path, CELLS, ["#| default_exp later", redefinition])
    [problem] = mirror_problems(tmp_path)
    assert problem.startswith("notebooks/01_later.ipynb cell 1: redefines `area`, exported earlier by "
                              "notebooks/00_demo.ipynb cell 1"), problem


PATCH_CELLS = ["#| export\nfrom fastcore.basics import patch\n\nclass Shape:\n    def area(self):\n        return 0",
               "#| export\n@patch\ndef area(self: Shape):\n    return 1"]


def test_checker_accepts_a_class_patched_within_its_own_notebook(tmp_path):
    write_course(tmp_path, [CELLS[0], *PATCH_CELLS])
    assert mirror_problems(tmp_path) == []


def test_checker_rejects_a_later_notebook_patching_an_earlier_class(tmp_path):
    later = ["#| default_exp later\nfrom course_lib.demo import Shape\nfrom fastcore.basics import patch",
             "#| export\n@patch\ndef area(self: Shape):\n    return 2"]
    write_course(tmp_path, [CELLS[0], *PATCH_CELLS], later)
    [problem] = mirror_problems(tmp_path)
    assert problem.startswith("notebooks/01_later.ipynb cell 1: patches `Shape.area` onto `Shape`, a class of "
                              "notebooks/00_demo.ipynb cell"), problem


def test_checker_rejects_a_method_patched_twice_in_one_notebook(tmp_path):
    write_course(tmp_path, [CELLS[0], *PATCH_CELLS, PATCH_CELLS[1].replace("return 1", "return 2")])
    [problem] = mirror_problems(tmp_path)
    assert problem == ("notebooks/00_demo.ipynb cell 3: `Shape.area` is exported twice (also in "
                       "notebooks/00_demo.ipynb cell 2)"), problem


@pytest.mark.parametrize("imported", ["import transformers", "from course_lib.third import thing",
                                      "from course_lib.checks import check_area",
                                      "from course_lib.doors import third as door",
                                      "from course_lib.doors.third import thing"])
def test_checker_rejects_imports_of_transformers_later_modules_and_checks(tmp_path, imported):
    write_course(tmp_path, CELLS, ["#| default_exp later", f"#| export\n{imported}"], ["#| default_exp third"])
    [problem] = mirror_problems(tmp_path)
    assert problem.startswith("notebooks/01_later.ipynb cell 1: "), problem


def test_checker_accepts_imports_of_earlier_modules_and_guards(tmp_path):
    write_course(tmp_path, CELLS, ["#| default_exp later",
                                   "#| export\nfrom course_lib.demo import area\nfrom course_lib.guards import require_int"])
    assert mirror_problems(tmp_path) == []


@pytest.mark.parametrize("imported", ["from course_lib.doors import later as door",
                                      "from course_lib.doors import demo as door",
                                      "from course_lib.doors.demo import anything",
                                      "from course_lib.doors import moved"])
def test_checker_accepts_the_doors_of_this_lesson_and_earlier_ones(tmp_path, imported):
    write_course(tmp_path, CELLS, ["#| default_exp later", f"#| export\n{imported}"])
    assert mirror_problems(tmp_path) == []


def test_a_notebook_may_export_a_second_module_that_later_notebooks_import(tmp_path):
    write_course(tmp_path, [*CELLS, "#| export extra\nimport math\n\ndef volume(r):\n    return math.pi * r**3"],
                 ["#| default_exp later", "#| export\nfrom course_lib.extra import volume"])
    assert (tmp_path / "course_lib" / "extra.py").read_text(encoding="utf-8").startswith(
        "# AUTOGENERATED! DO NOT EDIT! File to edit: ../notebooks/00_demo.ipynb.")
    assert mirror_problems(tmp_path) == []
    (tmp_path / "course_lib" / "extra.py").write_text("# edited by hand\n")
    assert any(p.startswith("course_lib/extra.py differs from a fresh export") for p in mirror_problems(tmp_path))


def test_notebook_13_teaches_in_at_most_300_exported_lines():
    """Issue 42: the lesson shows data parallelism at the size of its idea; the command's plumbing lives in the
    non-lesson course_lib/pretrain.py. Counted as the source lines of the notebook's `#| export` cells."""
    cells = json.loads((ROOT / "notebooks" / "13_scaling_up.ipynb").read_text(encoding="utf-8"))["cells"]
    exported = ["".join(c["source"]) for c in cells
                if c["cell_type"] == "code" and "".join(c["source"]).startswith("#| export")]
    lines = sum(len(source.splitlines()) for source in exported)
    assert lines <= 300, f"notebook 13 exports {lines} lines in {len(exported)} cells; at most 300"
    assert not any("argparse" in source for source in exported), "a lesson cell of notebook 13 uses argparse"

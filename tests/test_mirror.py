"""The mirror rule of COURSE_GUIDE.md section 2, checked in both directions.

* Every name defined in a `#| export` cell is AST-identical in the module that the notebook's
  `#| default_exp` line names.
* Every top-level name of every module is shown in an exported cell: no code the learner never saw.
* No notebook redefines a name exported by an earlier notebook, or (outside its exported cell) one of
  its own exported names.
* Modules import only modules of earlier notebooks, and never `transformers`.

A failure names the notebook, the cell index and the definition, and shows what differs.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_EXP = re.compile(r"^#\|\s*default_exp\s+(\w+)\s*$", re.MULTILINE)
EXPORT = re.compile(r"^#\|\s*export\s*$")
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
# Course infrastructure, not a lesson: the exercise checks grade the learner against every lesson module.
EXEMPT_MODULES = {"checks"}


@dataclass
class Definition:
    name: str
    node: ast.AST
    where: str  # "notebooks/05_attention.ipynb cell 12" or "course_lib/attention.py line 40"


@dataclass
class Notebook:
    path: Path
    module: str | None
    exports: dict[str, Definition] = field(default_factory=dict)
    other_definitions: list[Definition] = field(default_factory=list)  # outside export cells, not imports
    problems: list[str] = field(default_factory=list)


def rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def definitions(tree: ast.Module, where) -> tuple[list[Definition], list[str]]:
    """Top-level definitions of a module or cell, one per bound name; imports count once per alias.

    `where(node)` says where a node sits. Returns the definitions and the statements that are not
    definitions (the caller decides whether those are allowed)."""
    found, others = [], []
    body = tree.body
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append(Definition(node.name, node, where(node)))
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            found += [Definition(t.id, node, where(node)) for t in node.targets]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.append(Definition(node.target.id, node, where(node)))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                found.append(Definition(name, ast.Import(names=[alias]), where(node)))
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                single = ast.ImportFrom(module=node.module, names=[alias], level=node.level)
                found.append(Definition(alias.asname or alias.name, single, where(node)))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and node is body[0]:
            continue  # a docstring
        else:
            others.append(f"{where(node)}: `{ast.unparse(node).splitlines()[0]}`")
    return found, others


def code_of(cell) -> str:
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def without_magics(source: str) -> str:
    """IPython lines (`%timeit`, `!pip`) are not Python; blank them so the cell still parses."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


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
        exported = bool(lines) and EXPORT.match(lines[0]) is not None
        try:
            tree = ast.parse(source if exported else without_magics(source))
        except SyntaxError as error:
            nb.problems.append(f"{name} cell {index}: does not parse ({error.msg}, line {error.lineno})")
            continue
        found, others = definitions(tree, lambda node, i=index: f"{name} cell {i}")
        if exported:
            nb.problems += [f"{o}: an exported cell may hold only definitions and imports" for o in others]
            for d in found:
                if d.name in nb.exports and not isinstance(d.node, (ast.Import, ast.ImportFrom)):
                    nb.problems.append(
                        f"{d.where}: `{d.name}` is exported twice (also in {nb.exports[d.name].where})")
                nb.exports[d.name] = d
        else:
            nb.other_definitions += [d for d in found if isinstance(d.node, DEFINITIONS)]
    return nb


def read_module(path: Path, root: Path) -> tuple[dict[str, Definition], list[str]]:
    name = rel(path, root)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found, others = definitions(tree, lambda node: f"{name} line {node.lineno}")
    problems = [f"{o}: a module may hold only definitions and imports (and a docstring)" for o in others]
    by_name: dict[str, Definition] = {}
    for d in found:
        if d.name in by_name and not isinstance(d.node, (ast.Import, ast.ImportFrom)):
            problems.append(f"{d.where}: `{d.name}` is defined twice (also at {by_name[d.name].where})")
        by_name[d.name] = d
    return by_name, problems


def difference(a: ast.AST, b: ast.AST) -> str:
    """The first lines where two definitions differ, as a unified diff of their source."""
    diff = difflib.unified_diff(ast.unparse(a).splitlines(), ast.unparse(b).splitlines(),
                                "notebook", "module", n=1, lineterm="")
    return "\n".join(list(diff)[2:14])


def mirror_problems(root: Path) -> list[str]:
    """Every violation of the mirror rule in the course at `root`."""
    problems: list[str] = []
    package = root / "course_lib"
    notebooks = [read_notebook(p, root) for p in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    claimed: dict[str, Notebook] = {}
    earlier_exports: dict[str, Definition] = {}

    for order, nb in enumerate(notebooks):
        problems += nb.problems
        nb_name = rel(nb.path, root)
        if nb.module is None:
            continue
        if nb.module in claimed:
            problems.append(f"{nb_name}: module `{nb.module}` is already the module of "
                            f"{rel(claimed[nb.module].path, root)}; one notebook, one module")
            continue
        claimed[nb.module] = nb
        module_path = package / f"{nb.module}.py"
        if not module_path.exists():
            problems.append(f"{nb_name}: `#| default_exp {nb.module}` but {rel(module_path, root)} does not exist")
            continue
        module_defs, module_problems = read_module(module_path, root)
        problems += module_problems

        for name, shown in nb.exports.items():
            kept = module_defs.get(name)
            if kept is None:
                problems.append(f"{shown.where}: exports `{name}` but {rel(module_path, root)} does not define it")
            elif ast.dump(shown.node) != ast.dump(kept.node):
                problems.append(f"{shown.where}: `{name}` differs from {kept.where}:\n"
                                f"{difference(shown.node, kept.node)}")
        for name, kept in module_defs.items():
            if name not in nb.exports:
                problems.append(f"{kept.where}: `{name}` is in the module but in no `#| export` cell of "
                                f"{nb_name}; show it in an exported cell or remove it")

        for d in nb.other_definitions:
            if d.name in earlier_exports:
                problems.append(f"{d.where}: redefines `{d.name}`, exported earlier by "
                                f"{earlier_exports[d.name].where}; import it from course_lib instead")
            elif d.name in nb.exports:
                problems.append(f"{d.where}: defines `{d.name}` outside its `#| export` cell "
                                f"({nb.exports[d.name].where}); give a draft version its own name (e.g. "
                                f"`{d.name}V1`)")
        for name, d in nb.exports.items():
            if name in earlier_exports and not isinstance(d.node, (ast.Import, ast.ImportFrom)):
                problems.append(f"{d.where}: redefines `{name}`, exported earlier by {earlier_exports[name].where}")

        # Modules only import earlier modules, and never transformers.
        earlier_modules = {n.module for n in notebooks[:order]}
        for name, kept in module_defs.items():
            node = kept.node
            imported = (node.module if isinstance(node, ast.ImportFrom) else
                        node.names[0].name if isinstance(node, ast.Import) else None)
            if imported is None:
                continue
            if imported.split(".")[0] == "transformers":
                problems.append(f"{kept.where}: course_lib must not import transformers")
            parts = imported.split(".")
            if parts[0] == "course_lib" and (len(parts) < 2 or parts[1] not in earlier_modules):
                problems.append(f"{kept.where}: imports `{imported}`, which is not the module of an "
                                f"earlier notebook")
        earlier_exports.update({k: v for k, v in nb.exports.items()
                                if not isinstance(v.node, (ast.Import, ast.ImportFrom))})

    for module_path in sorted(package.glob("*.py")):
        if module_path.stem not in {"__init__", *EXEMPT_MODULES} and module_path.stem not in claimed:
            problems.append(f"{rel(module_path, root)}: no notebook has `#| default_exp {module_path.stem}`")
    return problems


def test_course_obeys_the_mirror_rule():
    problems = mirror_problems(ROOT)
    assert not problems, "\n\n".join(problems)


# The checker itself, on a tiny course written to a temporary folder: it must be able to fail.

def write_notebook(path: Path, cells: list[str]) -> None:
    notebook = {"cells": [{"cell_type": "code", "source": s, "metadata": {}, "outputs": []} for s in cells],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(notebook))


def write_course(root: Path, cells: list[str], module: str) -> None:
    (root / "notebooks").mkdir()
    (root / "course_lib").mkdir()
    write_notebook(root / "notebooks" / "00_demo.ipynb", cells)
    (root / "course_lib" / "demo.py").write_text(module)


CELLS = ["#| default_exp demo\nimport torch", "#| export\nimport math\n\ndef area(r):\n    return math.pi * r**2",
         "area(2.0)"]


def test_checker_accepts_a_faithful_mirror(tmp_path):
    write_course(tmp_path, CELLS, "import math\n\n\ndef area(r):\n    return math.pi * r**2\n")
    assert mirror_problems(tmp_path) == []


def test_checker_points_at_a_changed_number(tmp_path):
    write_course(tmp_path, CELLS, "import math\n\n\ndef area(r):\n    return math.pi * r**3\n")
    [problem] = mirror_problems(tmp_path)
    assert problem.startswith("notebooks/00_demo.ipynb cell 1: `area` differs from course_lib/demo.py line 4")
    assert "-    return math.pi * r ** 2" in problem and "+    return math.pi * r ** 3" in problem


def test_checker_rejects_a_function_no_notebook_shows(tmp_path):
    module = "import math\n\n\ndef area(r):\n    return math.pi * r**2\n\n\ndef hidden():\n    return 1\n"
    write_course(tmp_path, CELLS, module)
    [problem] = mirror_problems(tmp_path)
    assert problem.startswith("course_lib/demo.py line 8: `hidden` is in the module but in no `#| export` cell")


def test_checker_rejects_an_export_missing_from_the_module(tmp_path):
    write_course(tmp_path, CELLS, "def area(r):\n    return 3.14159 * r**2\n")
    problems = mirror_problems(tmp_path)
    assert any("`math`" in p and "does not define it" for p in problems), problems
    assert any("`area` differs" in p for p in problems), problems


def test_checker_rejects_a_redefinition_outside_the_export_cell(tmp_path):
    cells = CELLS + ["def area(r):\n    return 0"]
    write_course(tmp_path, cells, "import math\n\n\ndef area(r):\n    return math.pi * r**2\n")
    [problem] = mirror_problems(tmp_path)
    assert problem.startswith("notebooks/00_demo.ipynb cell 3: defines `area` outside its `#| export` cell")


@pytest.mark.parametrize("exported", [False, True], ids=["plain cell", "export cell"])
def test_checker_rejects_a_later_notebook_redefining_an_earlier_export(tmp_path, exported):
    write_course(tmp_path, CELLS, "import math\n\n\ndef area(r):\n    return math.pi * r**2\n")
    redefinition = "def area(r):\n    return 0"
    write_notebook(tmp_path / "notebooks" / "01_later.ipynb",
                   ["#| default_exp later", ("#| export\n" if exported else "") + redefinition])
    (tmp_path / "course_lib" / "later.py").write_text(redefinition + "\n" if exported else "")
    [problem] = mirror_problems(tmp_path)
    assert problem.startswith("notebooks/01_later.ipynb cell 1: redefines `area`, exported earlier by "
                              "notebooks/00_demo.ipynb cell 1"), problem


def test_checker_rejects_a_module_without_notebook_except_the_checks(tmp_path):
    write_course(tmp_path, CELLS, "import math\n\n\ndef area(r):\n    return math.pi * r**2\n")
    (tmp_path / "course_lib" / "orphan.py").write_text("X = 1\n")
    (tmp_path / "course_lib" / "checks.py").write_text("def check_area(f):\n    return f(1.0)\n")
    assert mirror_problems(tmp_path) == ["course_lib/orphan.py: no notebook has `#| default_exp orphan`"]


@pytest.mark.parametrize("imported", ["import transformers", "from course_lib.later import thing"])
def test_checker_rejects_imports_of_transformers_and_later_modules(tmp_path, imported):
    cells = ["#| default_exp demo", f"#| export\n{imported}"]
    write_course(tmp_path, cells, f"{imported}\n")
    problems = mirror_problems(tmp_path)
    assert len(problems) == 1 and "course_lib/demo.py line 1" in problems[0], problems

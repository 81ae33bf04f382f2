"""pyproject.toml declares exactly the third-party packages that course_lib imports."""

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Import names that differ from the name of the package that provides them.
PROVIDED_BY = {"fancy_einsum": "fancy-einsum", "tiktoken_ext": "tiktoken"}


def imported_packages(package: Path) -> dict[str, str]:
    """Third-party top-level import name -> the first file that imports it."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "course_lib":
                    found.setdefault(PROVIDED_BY.get(top, top), path.relative_to(package.parent).as_posix())
    return found


def declared(names: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ \[;]", name, maxsplit=1)[0].lower().replace("_", "-") for name in names}


def test_pyproject_declares_every_package_course_lib_imports_and_no_other():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    imports = {name.lower().replace("_", "-"): where for name, where in imported_packages(ROOT / "course_lib").items()}
    dependencies = declared(project["dependencies"])
    assert not set(imports) - dependencies, {name: imports[name] for name in set(imports) - dependencies}
    assert not dependencies - set(imports), dependencies - set(imports)


def test_requirements_pin_every_declared_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lines = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if "==" in line]
    assert declared(project["dependencies"]) <= declared(lines)


def test_the_checker_finds_third_party_imports_only(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("import numpy.linalg\nfrom fancy_einsum import einsum\nimport json\n"
                                             "from . import x\nfrom course_lib.guards import check_int\n")
    assert imported_packages(tmp_path / "pkg") == {"numpy": "pkg/mod.py", "fancy-einsum": "pkg/mod.py"}

"""pyproject.toml declares exactly the third-party packages that course_lib imports."""

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Import names that differ from the name of the package that provides them.
PROVIDED_BY = {"fancy_einsum": "fancy-einsum", "tiktoken_ext": "tiktoken"}


def imported_packages(package: Path, module_level_only: bool = False) -> dict[str, str]:
    """Third-party top-level import name -> the first file that imports it; with module_level_only, only the
    imports that run when a module is imported (not those inside a function, which run when it is called)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in (tree.body if module_level_only else ast.walk(tree)):
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
    return {name.lower().replace("_", "-"): where for name, where in found.items()}


def declared(names: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ \[;]", name, maxsplit=1)[0].lower().replace("_", "-") for name in names}


def test_pyproject_declares_every_package_course_lib_imports_and_no_other():
    """Imports that run on `import course_lib...` are dependencies; those inside a function (notebook 12's bridge to
    TransformerLens) may instead be an optional extra, installed by requirements.txt."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    imports = imported_packages(ROOT / "course_lib")
    at_import = imported_packages(ROOT / "course_lib", module_level_only=True)
    dependencies = declared(project["dependencies"])
    extras = set().union(*(declared(names) for names in project.get("optional-dependencies", {}).values()))
    assert not set(at_import) - dependencies, {name: at_import[name] for name in set(at_import) - dependencies}
    assert not set(imports) - dependencies - extras, {n: imports[n] for n in set(imports) - dependencies - extras}
    assert not (dependencies | extras) - set(imports), (dependencies | extras) - set(imports)


def test_requirements_pin_every_declared_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lines = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if "==" in line]
    extras = [name for names in project.get("optional-dependencies", {}).values() for name in names]
    assert declared(project["dependencies"] + extras) <= declared(lines)


def test_the_checker_finds_third_party_imports_only(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("import numpy.linalg\nfrom fancy_einsum import einsum\nimport json\n"
                                             "from . import x\nfrom course_lib.guards import require_int\n")
    assert imported_packages(tmp_path / "pkg") == {"numpy": "pkg/mod.py", "fancy-einsum": "pkg/mod.py"}
    (tmp_path / "pkg" / "lazy.py").write_text("def f():\n    import scipy\n")
    assert "scipy" in imported_packages(tmp_path / "pkg")
    assert "scipy" not in imported_packages(tmp_path / "pkg", module_level_only=True)

"""How much of each lesson module is argument checking rather than the lesson: code lines that are guards, per
module of course_lib, now and (optionally) at an earlier commit side by side.

    python benchmarks/guard_lines.py               # the working tree
    python benchmarks/guard_lines.py 7ddfc11       # the working tree beside that commit

A code line is a line with code on it (no blank lines, comments or docstrings). A guard line belongs to an `if`
whose body ends in `raise` (test, body and raise), a `for` loop made only of such ifs, a statement that calls a
`check_*` function, or a function whose name starts with `check_`.
"""

import ast
import io
import subprocess
import sys
import tokenize

from common import REPO_ROOT, print_table

LESSON_MODULES = ["config", "tokenization", "embeddings", "normalization", "feedforward", "attention", "block",
                  "model", "generation", "training", "pretrained", "decoding", "interpretability", "distributed",
                  "shards"]


def code_lines(source: str, tree: ast.Module) -> set[int]:
    """Numbers of the lines that hold code: no blank lines, comments or docstrings."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines.update(range(token.start[0], token.end[0] + 1))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            lines -= set(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def raises(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], ast.Raise)


def guard_lines(tree: ast.Module) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        is_guard = (
            (isinstance(node, ast.If) and raises(node.body))
            or (isinstance(node, ast.For) and all(isinstance(s, ast.If) and raises(s.body) for s in node.body))
            or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id.startswith("check_"))
            or (isinstance(node, ast.FunctionDef) and node.name.startswith("check_")))
        if is_guard:
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def count(source: str) -> tuple[int, int, int]:
    """(code lines, guard lines among them, all lines) of one module's source."""
    tree = ast.parse(source)
    code = code_lines(source, tree)
    return len(code), len(guard_lines(tree) & code), len(source.splitlines())


def sources(commit: str | None) -> dict[str, str]:
    def read(module):  # "" for a module that did not exist yet (shards.py before notebook 13 was split)
        if commit is None:
            path = REPO_ROOT / "course_lib" / f"{module}.py"
            return path.read_text(encoding="utf-8") if path.exists() else ""
        shown = subprocess.run(["git", "show", f"{commit}:course_lib/{module}.py"], cwd=REPO_ROOT,
                               capture_output=True, text=True)
        return shown.stdout if shown.returncode == 0 else ""
    return {module: read(module) for module in [*LESSON_MODULES, "guards"]}


def main(args: list[str]) -> None:
    commits = [*args[:1], None]  # an earlier commit first, if given, then the working tree
    counts = {commit: {m: count(s) for m, s in sources(commit).items()} for commit in commits}
    rows = []
    for module in [*LESSON_MODULES, "all", "guards"]:  # "all": the lesson modules; guards.py is what they call
        row = [module]
        for commit in commits:
            code, guard, total = (tuple(map(sum, zip(*(counts[commit][m] for m in LESSON_MODULES))))
                                  if module == "all" else counts[commit][module])
            row += [f"{guard} of {code} ({100 * guard / code:.0f}%)" if code else "-", str(total)]
        rows.append(row)
    headers = ["module"]
    for commit in commits:
        name = commit or "now"
        headers += [f"guard lines, {name}", f"lines, {name}"]
    print_table(headers, rows, title="argument-guard lines among the code lines of each lesson module")


if __name__ == "__main__":
    main(sys.argv[1:])

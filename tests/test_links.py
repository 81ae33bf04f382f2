"""Every relative link in the course's prose leads somewhere, and nothing still cites the retired course guide.

* Every relative link (markdown `[text](target)` and `![alt](target)`, reference definitions `[label]: target`, and
  HTML `href=`/`src=`) in README.md, CHANGELOG.md, docs/*.md, tools/README.md, benchmarks/README.md,
  course_lib/data/**/*.md and the markdown cells of notebooks/*.ipynb names a file or folder that exists inside the
  repository, relative to the file that holds the link (a notebook's links are relative to notebooks/).
* Where such a link has a #fragment and leads to a .md file or a notebook (or is a bare `#fragment`, to the file
  itself), the fragment is a heading there, by GitHub's slug (lowercase; spaces to '-'; every other character but
  letters, digits, '-' and '_' dropped; a repeated heading gets -1, -2, ...), or an HTML anchor (`<a id=...>`,
  `name=...`). In a notebook, Jupyter's own anchor (the heading with spaces to '-', case and punctuation kept) counts
  too, since JupyterLab and nbconvert link by it.
* External links (any scheme: http, https, mailto, ...) are not followed: nothing here touches the network. Links
  inside code (fenced blocks and `inline code`) and HTML comments are not links.
* No file of the repository (code, markdown, notebooks, .ci/run, the workflow) names the course guide's old file:
  its sections are docs/design.md's now.

A failure names the file (and line, or notebook cell), the link, and what is missing. The checkers are tested on a
temporary folder below, so a check that cannot fail is caught here.
"""

from __future__ import annotations

import difflib
import html
import json
import os
import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
# The sources whose links are checked, as globs relative to the repository root.
SOURCES = ("README.md", "CHANGELOG.md", "docs/*.md", "tools/README.md", "benchmarks/README.md",
           "course_lib/data/**/*.md", "notebooks/*.ipynb")
# Documents that must exist (a glob that matches nothing would check nothing).
REQUIRED = ("README.md", "CHANGELOG.md", "LICENSE", "tools/README.md", "benchmarks/README.md")
# Written in two pieces so that this file does not name it itself.
OLD_GUIDE = "COURSE_" + "GUIDE.md"
# Folders never searched when the repository is not a git checkout (git's own list is used when it is).
NOT_SOURCES = {".git", "venv", ".venv", "build", "dist", "__pycache__", ".hypothesis", ".pytest_cache",
               ".ipynb_checkpoints", "node_modules", "results"}

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.DOTALL)
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
# [text](target "title") and ![alt](target); the text may hold one level of brackets, the target one of parentheses.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>\n]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"
                         r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]\n]+\]:[ \t]*(<[^>\n]*>|\S+)", re.MULTILINE)
HTML_LINK = re.compile(r"<(?:a|img|source|link|script|iframe)\b[^>]*?\s(?:href|src)\s*=\s*[\"']([^\"']*)[\"']",
                       re.IGNORECASE)
HTML_ANCHOR = re.compile(r"<[a-z][a-z0-9]*\b[^>]*?\s(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
ATX = re.compile(r"^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def without_fences(text: str) -> str:
    """The text with fenced code blocks and HTML comments blanked out, newlines kept (so line numbers stay right)."""
    lines, fence = [], None
    for line in text.split("\n"):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            lines.append("")
        elif fence is not None:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence) \
                    and not line.strip()[len(match.group(1)):].strip():
                fence = None
            lines.append("")
        else:
            lines.append(line)
    return COMMENT.sub(blank, "\n".join(lines))


def without_code(text: str) -> str:
    """The text with fenced code blocks, inline code spans and HTML comments blanked out, newlines kept."""
    paragraphs = re.split(r"(\n[ \t]*\n)", without_fences(text))  # a code span never crosses a blank line
    return "".join(INLINE_CODE.sub(blank, p) for p in paragraphs)


def blank(match: re.Match) -> str:
    return "\n" * match.group(0).count("\n")


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link in a markdown text, in order."""
    text = without_code(text)
    found = [(m.start(1), m.group(1)) for pattern in (INLINE_LINK, REFERENCE, HTML_LINK)
             for m in pattern.finditer(text)]
    return [(text.count("\n", 0, at) + 1, target.strip("<>").strip()) for at, target in sorted(found)]


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text as rendered, lowercased, every character but letters, digits,
    '-', '_' and spaces dropped, then spaces to '-'."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = html.unescape(re.sub(r"<[^>]+>", "", text))  # HTML tags go, entities become their characters
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def jupyter_anchor(heading: str) -> str:
    """The anchor JupyterLab and nbconvert give a heading: its text with spaces to '-', case and punctuation kept."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", heading)
    return html.unescape(re.sub(r"<[^>]+>", "", text)).replace("`", "").strip().replace(" ", "-")


def headings(text: str) -> list[str]:
    """The text of every heading (ATX `# ...` and setext underlined) of a markdown text, in order."""
    found, previous = [], ""
    for line in without_fences(text).split("\n"):  # a heading's inline code is part of its text
        atx = ATX.match(line)
        if atx:
            found.append((atx.group(1) or "").strip())
            previous = ""
            continue
        setext = SETEXT.match(line)
        if setext and previous.strip() and not ATX.match(previous) and not re.match(r"^\s*([-*+]|\d+[.)])\s", previous):
            found.append(previous.strip())
            previous = ""
            continue
        previous = line
    return found


def markdown_texts(path: Path) -> list[tuple[str, str]]:
    """(where, markdown) for a file: the whole file, or each markdown cell of a notebook ("cell N")."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return [(f"cell {i}", "".join(c["source"]) if isinstance(c["source"], list) else c["source"])
                for i, c in enumerate(cells) if c["cell_type"] == "markdown"]
    return [("", path.read_text(encoding="utf-8"))]


def anchors(path: Path) -> set[str]:
    """Every fragment that leads somewhere in a .md file or a notebook."""
    found, seen = set(), {}
    for _, text in markdown_texts(path):
        for heading in headings(text):
            slug = github_slug(heading)
            found.add(f"{slug}-{seen[slug]}" if seen.get(slug) else slug)
            seen[slug] = seen.get(slug, 0) + 1
            if path.suffix == ".ipynb":
                found.add(jupyter_anchor(heading))
        found.update(HTML_ANCHOR.findall(without_code(text)))
    return found


def sources(root: Path) -> list[Path]:
    return sorted({p for pattern in SOURCES for p in root.glob(pattern) if p.is_file()})


def link_problems(root: Path) -> list[str]:
    """One line per broken link under root: the file and line (or cell), the link, and what is missing."""
    root, problems, anchor_cache = root.resolve(), [], {}
    for source in sources(root):
        name = source.relative_to(root).as_posix()
        for where, text in markdown_texts(source):
            for line, target in links(text):
                if not target or SCHEME.match(target):
                    continue  # external (http, https, mailto, ...): not followed
                at = f"{name}{f', {where}' if where else ''}, line {line}: link `{target}`"
                path_part, _, fragment = target.partition("#")
                path_part = unquote(path_part.split("?")[0])
                destination = (source.parent / path_part).resolve() if path_part else source
                if not destination.is_relative_to(root):
                    problems.append(f"{at}: leads outside the repository, to {destination}")
                    continue
                if not destination.exists():
                    problems.append(f"{at}: no file or folder {destination.relative_to(root).as_posix()}")
                    continue
                if not fragment or not destination.is_file() or destination.suffix not in (".md", ".ipynb"):
                    continue
                if destination not in anchor_cache:
                    anchor_cache[destination] = anchors(destination)
                known = anchor_cache[destination]
                fragment = unquote(fragment)
                if fragment not in known:
                    close = difflib.get_close_matches(fragment, sorted(known), n=3)
                    hint = f" (close: {', '.join('#' + c for c in close)})" if close else ""
                    problems.append(f"{at}: no heading or anchor #{fragment} in "
                                    f"{destination.relative_to(root).as_posix()}{hint}")
    return problems


def repository_files(root: Path) -> list[Path]:
    """The repository's files: git's list (tracked, and new files not ignored) in a checkout, else a walk."""
    if (root / ".git").exists():
        try:
            listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                    cwd=root, capture_output=True, check=True).stdout.decode().split("\0")
            return sorted({root / name for name in listed if name and (root / name).is_file()})
        except (OSError, subprocess.CalledProcessError):
            pass  # no git: walk the folder instead
    found = []
    for folder, folders, files in os.walk(root):
        folders[:] = [f for f in folders if f not in NOT_SOURCES and not f.endswith(".egg-info")]
        found += [Path(folder) / f for f in files]
    return sorted(found)


def guide_mentions(root: Path) -> list[str]:
    """Every file under root that names the retired course guide's file, with its line."""
    problems = []
    for path in repository_files(root):
        data = path.read_bytes()
        if OLD_GUIDE.lower().encode() not in data.lower():
            continue
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if OLD_GUIDE.lower() in line.lower():
                problems.append(f"{path.relative_to(root).as_posix()}, line {number}: names {OLD_GUIDE} "
                                f"(cite docs/design.md and the section's heading): {line.strip()[:120]}")
    return problems


# ---------------------------------------------------------------------------------------------------------------
# The course


def test_the_documents_exist():
    missing = [name for name in REQUIRED if not (ROOT / name).is_file()]
    assert not missing, f"missing: {', '.join(missing)}"
    assert list((ROOT / "docs").glob("*.md")), "docs/ holds no .md file"


def test_every_relative_link_leads_to_a_file_and_heading_that_exist():
    problems = link_problems(ROOT)
    assert not problems, f"{len(problems)} broken links:\n" + "\n".join(problems)


def test_nothing_names_the_old_course_guide():
    problems = guide_mentions(ROOT)
    assert not problems, f"{len(problems)} mentions:\n" + "\n".join(problems)


# ---------------------------------------------------------------------------------------------------------------
# The checkers themselves, on a temporary folder


def write_repository(root: Path) -> None:
    (root / "docs").mkdir()
    (root / "notebooks").mkdir()
    (root / "README.md").write_text(
        "# The course\n\n"
        "## Tests and CI\n\n"
        "See [the design](docs/design.md), [its third section](docs/design.md#3-notebooks-that-nbval-can-trust),\n"
        "[an anchor](docs/design.md#door-layer) and [the repeated heading](docs/design.md#notes-1).\n"
        "![a picture](docs/missing.png) and [a broken heading](docs/design.md#4-no-such-section).\n"
        "[Here](#tests-and-ci), [not here](#tests-and-cd), [the web](https://example.org/x.md#nowhere),\n"
        "[mail](mailto:someone@example.org), <a href=\"docs/gone.md\">an HTML link</a>.\n\n"
        "`[in code](docs/nothing.md)`\n\n"
        "```python\nx = a[0](docs/nothing.md)\n[fenced](docs/nothing.md)\n```\n\n"
        "<!-- [commented](docs/nothing.md) -->\n"
        "[ref]: docs/absent.md\n"
        "[outside](../elsewhere.md)\n")
    (root / "docs" / "design.md").write_text(
        "# Design\n\n## 3. Notebooks that nbval can trust\n\nText.\n\n## Notes\n\n## Notes\n\n"
        "<a id=\"door-layer\"></a>\nThe doors.\n\nThe `course_lib` package\n------------------------\n")
    (root / "notebooks" / "00_overview.ipynb").write_text(json.dumps({"cells": [
        {"cell_type": "markdown", "metadata": {},
         "source": ["# 00 · Overview\n", "\n", "[Up](../README.md#the-course)"]},
        {"cell_type": "code", "metadata": {}, "source": ["[not](a_link.md)"], "outputs": [], "execution_count": None},
        {"cell_type": "markdown", "metadata": {}, "source": "[Design](../docs/design.md#the-course_lib-package) "
                                                             "[gone](../docs/none.md) [self](#00--overview)"}],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def test_the_link_checker_catches_broken_files_and_headings(tmp_path):
    write_repository(tmp_path)
    problems = link_problems(tmp_path)
    assert problems == [
        "README.md, line 7: link `docs/missing.png`: no file or folder docs/missing.png",
        "README.md, line 7: link `docs/design.md#4-no-such-section`: no heading or anchor #4-no-such-section in "
        "docs/design.md",
        "README.md, line 8: link `#tests-and-cd`: no heading or anchor #tests-and-cd in README.md "
        "(close: #tests-and-ci)",
        "README.md, line 9: link `docs/gone.md`: no file or folder docs/gone.md",
        "README.md, line 19: link `docs/absent.md`: no file or folder docs/absent.md",
        f"README.md, line 20: link `../elsewhere.md`: leads outside the repository, to "
        f"{(tmp_path.resolve().parent / 'elsewhere.md')}",
        "notebooks/00_overview.ipynb, cell 2, line 1: link `../docs/none.md`: no file or folder docs/none.md"]
    # and once mended, nothing is left
    readme = (tmp_path / "README.md").read_text()
    for bad, good in [("docs/missing.png", "docs/design.md"), ("4-no-such-section", "notes"),
                      ("#tests-and-cd", "#the-course"), ("docs/gone.md", "docs"), ("docs/absent.md", "docs/"),
                      ("../elsewhere.md", "notebooks/00_overview.ipynb#00--overview")]:
        readme = readme.replace(bad, good)
    (tmp_path / "README.md").write_text(readme)
    notebook = tmp_path / "notebooks" / "00_overview.ipynb"
    notebook.write_text(notebook.read_text().replace("../docs/none.md", "../README.md"))
    assert link_problems(tmp_path) == []


def test_slugs_follow_github():
    assert github_slug("3. Notebooks that nbval can trust") == "3-notebooks-that-nbval-can-trust"
    assert github_slug("00 · Overview") == "00--overview"
    assert github_slug("The `course_lib` package: *what* it holds") == "the-course_lib-package-what-it-holds"
    assert github_slug("See [the guide](docs/x.md) & more") == "see-the-guide--more"
    assert github_slug("Décodage, étape 2") == "décodage-étape-2"
    assert jupyter_anchor("1. Why normalise") == "1.-Why-normalise"
    assert headings("# A\n\n```\n# not a heading\n```\nB\n===\n\n- item\n---\n") == ["A", "B"]


def test_the_old_guide_is_found_wherever_it_is_named(tmp_path):
    (tmp_path / ".ci").mkdir()
    (tmp_path / "venv").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / ".ci" / "run").write_text(f"# Outputs must hold (see {OLD_GUIDE} section 3)\n")
    (tmp_path / "tests" / "test_x.py").write_text(f'"""The rule of {OLD_GUIDE.lower()}."""\n')
    (tmp_path / "venv" / "ignored.py").write_text(f"# {OLD_GUIDE}\n")
    (tmp_path / "README.md").write_text("See docs/design.md, section 3 (notebooks nbval can trust).\n")
    assert guide_mentions(tmp_path) == [
        f".ci/run, line 1: names {OLD_GUIDE} (cite docs/design.md and the section's heading): "
        f"# Outputs must hold (see {OLD_GUIDE} section 3)",
        f"tests/test_x.py, line 1: names {OLD_GUIDE} (cite docs/design.md and the section's heading): "
        f'"""The rule of {OLD_GUIDE.lower()}."""']

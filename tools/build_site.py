"""Render the course as a static website that works offline: every lesson with its stored outputs, the README and
the documents as pages, a table of contents in lesson order, next/previous links and search.

    python tools/build_site.py              # -> build/site/ (open build/site/index.html, or serve the folder)

Sphinx with MyST-NB renders the notebooks as they are stored: nothing is executed. Before a notebook is parsed,
its hidden solutions (code cells tagged `solution`, collapsed in JupyterLab) are left out, as in the slide decks,
with a line that says where they are; worked answers (markdown cells tagged `solution`, one closed `<details>`
block) stay and stay closed, with their code cells (tagged `answer`) and what those printed inside the block; nbdev's directives (`#| export`, `#| hide`, ...) and nbval's markers (`# NBVAL_...`)
are taken out of the code. MathJax is jupyter-server-mathjax's copy of MathJax 2 (as in the decks), copied into
`_static/mathjax/`; the theme (Furo) ships its CSS and JavaScript and uses the system's fonts: no page asks the
network for anything. A relative link to a folder (GitHub shows its listing) leads to a generated page that shows
the folder's pictures and lists its files."""

import re
import shutil
import sys
import warnings
from pathlib import Path

import jupyter_server_mathjax
import nbformat
from sphinx.application import Sphinx
from sphinx.deprecation import RemovedInSphinx11Warning

sys.path.insert(0, str(Path(__file__).resolve().parent))
from answer_figures import full_run, is_answer  # noqa: E402  (tools/ is not a package)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "site"
FOLDERS = ROOT / "build" / "site_folders"  # the generated folder pages (a Sphinx source, inside ROOT)
MATHJAX = Path(jupyter_server_mathjax.__file__).parent / "static"
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# The pages besides the lessons, in the order of the table of contents (the README is the home page)
DOCUMENTS = ["docs/lecturers.md", "docs/testing.md", "docs/design.md", "docs/performance.md", "CHANGELOG.md",
             "tools/README.md", "benchmarks/README.md", "course_lib/data/*.md", "course_lib/data/*/README.md"]
# What stands where a hidden solution is in the notebook
HIDDEN = "*Here the notebook holds a working solution, collapsed: open the notebook in JupyterLab to see it.*"
# A line of code that is a marker for a tool, not for the reader
MARKER = re.compile(r"^\s*#\s*(\|.*|NBVAL_\w+.*)$")
# A relative markdown link whose target ends with '/': a folder
FOLDER_LINK = re.compile(r"(\]\()(?![a-z][a-z0-9+.-]*:)([^)\s#]*/)(\))")

# MathJax 2, configured as the decks configure it (jupyter-server-mathjax ships MathJax's combined configurations
# only, not the files each input and output would load): only the formulas Sphinx marks (class "math"), and the one
# web font jupyter-server-mathjax ships (STIX-Web)
MATHJAX_CONFIG = {
    "config": ["TeX-AMS-MML_HTMLorMML-full.js", "Safe.js"],  # the combined configuration the package ships
    "tex2jax": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]], "processEscapes": True,
                "processEnvironments": True, "ignoreClass": "document|highlight|output", "processClass": "math"},
    "messageStyle": "none",
    "fast-preview": {"disabled": True},  # its quick first pass draws with MathJax's TeX fonts, which are not shipped
    "HTML-CSS": {"availableFonts": [], "preferredFont": None, "webFont": "STIX-Web", "imageFont": None},
}

# MathJax keeps an invisible MathML copy of each formula for screen readers; left to MathJax's styles, its letters
# (\mathbb, \mathcal) ask for TeX fonts that are not shipped
CSS = ".MJX_Assistive_MathML * { font-family: inherit !important; }\n"


def documents() -> list[str]:
    """The document names (paths without suffix) of the pages besides the home page and the lessons, in order."""
    found = []
    for pattern in DOCUMENTS:
        found += sorted(p.relative_to(ROOT).with_suffix("").as_posix() for p in ROOT.glob(pattern))
    return found


def toctree(caption: str, names: list[str]) -> str:
    lines = "\n".join(names)
    return f"\n\n```{{toctree}}\n:hidden:\n:caption: {caption}\n\n{lines}\n```\n"


def folder_page(folder: Path) -> Path:
    """Write the page of a folder (its pictures shown, its other files and subfolders listed), and those of its
    subfolders; return its path."""
    page = FOLDERS / folder.relative_to(ROOT) / "index.md"
    up = "/".join([".."] * len(page.parent.relative_to(ROOT).parts))  # from the page back to ROOT
    lines = ["---", "orphan: true", "---", f"# `{folder.relative_to(ROOT).as_posix()}/`", ""]
    for item in sorted(folder.iterdir()):
        target = f"{up}/{item.relative_to(ROOT).as_posix()}"
        if item.is_dir():
            lines.append(f"- [`{item.name}/`]({target}/)")
            folder_page(item)
        elif item.suffix in (".png", ".svg", ".jpg"):
            lines += ["", f"## {item.name}", "", f"![{item.name}]({target})", ""]
        else:
            lines.append(f"- [`{item.name}`]({target})")
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return page


def link_folders(text: str, path: Path) -> str:
    """The markdown `text` of the file at `path`, every relative link to a folder turned into a link to that
    folder's generated page."""
    def rewrite(match):
        folder = (path.parent / match.group(2)).resolve()
        if not folder.is_dir() or not folder.is_relative_to(ROOT):
            return match.group(0)
        page = FOLDERS / folder.relative_to(ROOT) / "index.md"
        if not page.exists():
            folder_page(folder)
        up = "/".join([".."] * len(path.parent.relative_to(ROOT).parts) + [page.relative_to(ROOT).as_posix()])
        return f"{match.group(1)}{up}{match.group(3)}"
    return FOLDER_LINK.sub(rewrite, text)


def reader_notebook(text: str, docname: str) -> str:
    """A lesson as the site shows it: no hidden solution, no tool markers, folder links to folder pages."""
    notebook = nbformat.reads(text, as_version=4)
    cells = []
    for cell in notebook.cells:
        if cell.cell_type == "code":
            if is_answer(cell) and cells and cells[-1].cell_type == "markdown":
                cells[-1].source = with_answer_code(cells[-1].source, cell, full_run(Path(docname).name))
                continue
            if "solution" in cell.metadata.get("tags", []):
                cells.append(nbformat.v4.new_markdown_cell(HIDDEN, id=cell.id))
                continue
            cell.source = "\n".join(line for line in cell.source.splitlines() if not MARKER.match(line)).strip("\n")
            if not cell.source and not cell.outputs:
                continue
        elif cell.cell_type == "markdown":
            cell.source = link_folders(cell.source, ROOT / docname)
        cells.append(cell)
    notebook.cells = cells
    return nbformat.writes(notebook)


def with_answer_code(answer: str, cell, full_run: dict) -> str:
    """A worked answer's text with its code cell inside its closed <details> block, and what the code printed: for
    an answer that runs small under the tests (answer_size), what its full run printed (docs/answer_figures.json),
    the size the text quotes; otherwise the stored output, figures included."""
    code = "\n".join(line for line in cell.source.splitlines() if not MARKER.match(line)).strip("\n")
    shown = [f"```python\n{code}\n```"]
    if cell.id in full_run.get("answers", {}):
        printed = "\n".join(line for line in full_run["answers"][cell.id]["output"].splitlines()
                            if not line.startswith("<Figure size"))  # the figure's repr, not the figure
        shown.append(f"At full size (`python tools/answer_figures.py`, {full_run['date']}) it printed:")
        shown.append(f"```text\n{printed.strip()}\n```")
    else:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" in data:
                shown.append(f'<img alt="the figure this answer draws" src="data:image/png;base64,'
                             f'{data["image/png"].strip()}">')
            elif output.get("text") or data.get("text/plain"):
                shown.append(f"```text\n{(output.get('text') or data['text/plain']).rstrip()}\n```")
    head, closing, tail = answer.rpartition("</details>")
    block = "\n\n" + "\n\n".join(shown) + "\n\n"
    return f"{head}{block}{closing}{tail}" if closing else answer + block


def on_source_read(app, docname: str, source: list[str]) -> None:
    suffix = Path(app.env.doc2path(docname)).suffix
    if suffix == ".ipynb":
        source[0] = reader_notebook(source[0], docname + suffix)
        return
    source[0] = link_folders(source[0], ROOT / (docname + suffix))
    if docname == "README":  # the home page holds the table of contents
        lessons = [p.relative_to(ROOT).with_suffix("").as_posix() for p in LESSONS]
        source[0] += toctree("Lessons", lessons) + toctree("Documents", documents())


def build_site(out: Path = OUT, quiet: bool = False) -> Path:
    """Build the site into `out`, printing Sphinx's progress unless `quiet`; return the path of its home page.
    Fails on any Sphinx warning (a broken link or image, a page left out of the table of contents)."""
    for stale in (out, FOLDERS):  # a renamed or removed lesson or document leaves no page behind
        shutil.rmtree(stale, ignore_errors=True)
    for path in [ROOT / "README.md", *LESSONS, *(ROOT / f"{name}.md" for name in documents())]:
        link_folders(path.read_text(encoding="utf-8"), path)  # writes the pages of the folders it links to
    (out / "_static").mkdir(parents=True, exist_ok=True)
    shutil.copytree(MATHJAX, out / "_static" / "mathjax", dirs_exist_ok=True)
    (out / "_static" / "course.css").write_text(CSS, encoding="utf-8")
    config = {
        "project": "GPT-2 from scratch", "html_title": "GPT-2 from scratch", "language": "en",
        "extensions": ["myst_nb"], "root_doc": "README", "html_theme": "furo",
        "include_patterns": ["README.md", *DOCUMENTS, "notebooks/[0-9][0-9]_*.ipynb", "build/site_folders/**"],
        "exclude_patterns": ["**.ipynb_checkpoints"],
        "nb_execution_mode": "off",  # the stored outputs, as the tests proved them
        "myst_enable_extensions": ["dollarmath"], "myst_heading_anchors": 6,  # GitHub's #fragments
        "mathjax_path": "mathjax/MathJax.js", "mathjax2_config": MATHJAX_CONFIG,
        "html_css_files": ["course.css"],
        "smartquotes": False,  # the text as written: straight quotes, '--' stays '--'
        "html_copy_source": False, "html_show_sourcelink": False,  # the notebooks' sources hold the solutions
        "html_last_updated_fmt": None, "html_permalinks": True,
    }
    app = Sphinx(srcdir=ROOT, confdir=None, outdir=out, doctreedir=ROOT / "build" / "site_doctrees",
                 buildername="html", confoverrides=config, status=None if quiet else sys.stdout,
                 warning=sys.stderr, freshenv=True, warningiserror=True)
    app.connect("source-read", on_source_read)
    with warnings.catch_warnings():  # myst-parser 5.2 still uses Sphinx API that Sphinx 11 removes
        warnings.simplefilter("ignore", RemovedInSphinx11Warning)
        app.build()
    if app.statuscode:
        sys.exit(f"the site's build failed (status {app.statuscode})")
    index = out / "index.html"
    index.write_text('<!DOCTYPE html>\n<meta charset="utf-8">\n<meta http-equiv="refresh" content="0; url=README.html">'
                     '\n<title>GPT-2 from scratch</title>\n<a href="README.html">GPT-2 from scratch</a>\n',
                     encoding="utf-8")
    return index


if __name__ == "__main__":
    print(f"open {build_site()}")

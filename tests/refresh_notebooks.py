"""Re-execute notebooks in place, top to bottom, so their stored outputs are one fresh run.

    python tests/refresh_notebooks.py                       # every notebook
    python tests/refresh_notebooks.py notebooks/05_*.ipynb  # some of them
    python tests/refresh_notebooks.py --slides-only         # only the slide metadata, nothing executed

It starts the kernel exactly as `pytest` (nbval with --nbval-current-env) does: this Python, the
notebook's folder as working directory. A cell that raises stops the refresh and leaves the file as it was.
Every refresh also sets each cell's slide type (see `mark_slides`), so that
`jupyter nbconvert --to slides` turns any notebook into a lecture deck.
"""

import sys
import time
from pathlib import Path

import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager

ROOT = Path(__file__).resolve().parents[1]


RAISES = "# NBVAL_RAISES_EXCEPTION"


def slide_type(cell, previous: str | None) -> str:
    """The reveal.js role of a cell, given the type of the last cell shown before it (None: the first).

    The title and every `## ` section open a slide; a `### ` heading, or an explanation that comes after
    code, opens a sub-slide below it; code right after its explanation is a fragment, shown on the next
    click, so the class can guess the output first; hidden exercise solutions are left out of the deck."""
    if "solution" in cell.metadata.get("tags", []):
        return "skip"
    heading = cell.cell_type == "markdown" and cell.source.lstrip().startswith(("# ", "## "))
    if previous is None or heading:
        return "slide"
    if cell.cell_type == "markdown":
        return "subslide" if previous == "code" or cell.source.lstrip().startswith("### ") else "-"
    return "fragment" if previous == "markdown" else "-"


def mark_slides(notebook) -> None:
    """Store every cell's slide type in its metadata, where nbconvert's slides exporter reads it."""
    previous = None
    for cell in notebook.cells:
        kind = slide_type(cell, previous)
        cell.metadata["slideshow"] = {"slide_type": kind}
        if kind != "skip":
            previous = cell.cell_type


def refresh(path: Path) -> float:
    """Run one notebook and overwrite it with fresh outputs; return the wall time in seconds."""
    notebook = nbformat.read(path, as_version=4)
    # A cell nbval expects to raise must not stop the run: nbclient skips errors in cells tagged so.
    expected_to_raise = [c for c in notebook.cells if c.cell_type == "code" and RAISES in c.source.splitlines()]
    for cell in expected_to_raise:
        cell.metadata["tags"] = [*cell.metadata.get("tags", []), "raises-exception"]
    manager = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME, kernel_spec_manager=NbvalKernelspecManager())
    client = NotebookClient(notebook, km=manager, timeout=600, record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    for cell in expected_to_raise:  # nbval warns when a cell carries both the tag and the comment
        cell.metadata["tags"] = [tag for tag in cell.metadata["tags"] if tag != "raises-exception"]
        if not cell.metadata["tags"]:
            del cell.metadata["tags"]
    notebook.metadata.pop("widgets", None)
    mark_slides(notebook)
    nbformat.write(notebook, path)
    return seconds


def main(args: list[str]) -> None:
    slides_only = "--slides-only" in args
    args = [a for a in args if a != "--slides-only"]
    paths = [Path(a).resolve() for a in args] or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for path in paths:
        if slides_only:
            notebook = nbformat.read(path, as_version=4)
            mark_slides(notebook)
            nbformat.write(notebook, path)
            print(f"{path.relative_to(ROOT)}: slide types set", flush=True)
        else:
            print(f"{path.relative_to(ROOT)}: {refresh(path):.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Re-execute notebooks in place, top to bottom, so their stored outputs are one fresh run.

    python tests/refresh_notebooks.py                       # every notebook
    python tests/refresh_notebooks.py notebooks/05_*.ipynb  # some of them

It starts the kernel exactly as `pytest` (nbval with --nbval-current-env) does: this Python, the
notebook's folder as working directory. A cell that raises stops the refresh and leaves the file as it was.
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


def refresh(path: Path) -> float:
    """Run one notebook and overwrite it with fresh outputs; return the wall time in seconds."""
    notebook = nbformat.read(path, as_version=4)
    # A cell nbval expects to raise must not stop the run: nbclient skips errors in cells tagged so.
    expected_to_raise = [c for c in notebook.cells if c.cell_type == "code" and RAISES in c.source.splitlines()]
    for cell in expected_to_raise:
        cell.metadata.setdefault("tags", []).append("raises-exception")
    manager = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME, kernel_spec_manager=NbvalKernelspecManager())
    client = NotebookClient(notebook, km=manager, timeout=600, record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    for cell in expected_to_raise:  # nbval warns when a cell carries both the tag and the comment
        cell.metadata["tags"].remove("raises-exception")
        if not cell.metadata["tags"]:
            del cell.metadata["tags"]
    notebook.metadata.pop("widgets", None)
    nbformat.write(notebook, path)
    return seconds


def main(args: list[str]) -> None:
    paths = [Path(a).resolve() for a in args] or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for path in paths:
        print(f"{path.relative_to(ROOT)}: {refresh(path):.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

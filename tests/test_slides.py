"""Lecture mode: every notebook carries slide metadata and converts to a reveal.js deck."""

import html
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbconvert import SlidesExporter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from refresh_notebooks import mark_slides, slide_type  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_slide_types_follow_the_sections():
    cells = [nbformat.v4.new_markdown_cell("# 03 · LayerNorm"),
             nbformat.v4.new_code_cell("import torch"),
             nbformat.v4.new_markdown_cell("## 1. Why normalise"),
             nbformat.v4.new_markdown_cell("More words."),
             nbformat.v4.new_code_cell("x = 1"),
             nbformat.v4.new_code_cell("print(x)"),
             nbformat.v4.new_markdown_cell("What the output shows."),
             nbformat.v4.new_markdown_cell("### Exercise 1"),
             nbformat.v4.new_code_cell("class MyLayerNorm: ...", metadata={"tags": ["solution"]}),
             nbformat.v4.new_code_cell("check_layernorm(MyLayerNorm)")]
    notebook = nbformat.v4.new_notebook(cells=cells)
    mark_slides(notebook)
    assert [c.metadata["slideshow"]["slide_type"] for c in notebook.cells] == [
        "slide", "fragment", "slide", "-", "fragment", "-", "subslide", "subslide", "skip", "fragment"]


def test_the_first_cell_is_a_slide_whatever_it_is():
    assert slide_type(nbformat.v4.new_code_cell("1 + 1"), None) == "slide"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_has_current_slide_metadata_and_converts(path):
    notebook = nbformat.read(path, as_version=4)
    stored = ([c.metadata.get("slideshow", {}).get("slide_type") for c in notebook.cells],
              notebook.metadata.get("rise"))
    mark_slides(notebook)
    expected = ([c.metadata["slideshow"]["slide_type"] for c in notebook.cells], notebook.metadata["rise"])
    assert stored == expected, (f"{path.name}: slide metadata is missing or stale; run "
                                f"python tools/refresh_notebooks.py --slides-only {path.relative_to(ROOT)}")
    sections = [c for c in notebook.cells if c.cell_type == "markdown" and c.source.startswith("## ")]
    assert len(sections) >= 3, f"{path.name}: a lesson needs sections (## headings) to make slides"

    deck, _ = SlidesExporter().from_notebook_node(notebook)
    title = re.sub(r"[*_`]", "", notebook.cells[0].source.splitlines()[0].lstrip("# ").strip())
    assert title in html.unescape(re.sub(r"<[^>]+>", "", deck)), f"{path.name}: the deck lost its title"
    # reveal.js nests a <section> per slide and one per sub-slide inside it
    assert len(re.findall(r"<section", deck)) >= 2 * (len(sections) + 1)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_section_heading_opens_its_own_cell(path):
    """A slide starts at a cell, so a `#`/`##` heading in the middle of a markdown cell would be buried in the
    previous slide: split the cell at the heading."""
    buried = []
    for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
        if cell.cell_type != "markdown":
            continue
        in_fence = False
        for number, line in enumerate(cell.source.splitlines()):
            if line.lstrip().startswith("```"):
                in_fence = not in_fence
            elif number > 0 and not in_fence and line.startswith(("# ", "## ")):
                buried.append(f"cell {index}: {line!r}")
    assert not buried, f"{path.name}: headings inside a cell, not at its start: {buried}"

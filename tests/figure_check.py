"""Is a matplotlib figure readable from the back of a lecture hall? (docs/design.md, section 4 (what a lesson looks
like))

Not a lesson module: the test suite's check of every figure the notebooks draw.

`problems(fig)` returns one readable message per violation (an empty list: the figure is fine):

1. Width. The figure is at most 10 inches wide, and so is what it draws: a legend or a label that sticks out of
   the figure makes the inline image (``bbox_inches="tight"``) wider than the figure, and every font smaller
   when the notebook scales it to the page.
2. Font size. Every text that is drawn -- tick labels, axis labels, titles, the suptitle, legend texts and
   titles, annotations, ``ax.text`` labels, colorbar ticks and labels, an axis's offset text ("1e-4") -- is at
   least 12 pt. Only texts that are really drawn count (the figure is drawn to find them): hidden tick labels,
   labels of ticks outside the view, empty strings and axes turned off with ``axis("off")`` are ignored.
3. Axis labels. Every Axes that shows data (lines, images, collections, patches, tables or its own texts) has an
   x label and a y label. Not checked: colorbar axes, axes turned off with ``axis("off")``, and an axis made
   invisible (the hidden x axis of ``twinx``). A label is also covered, for several panels that share an axis,
   when
     * the figure (or the subfigure the panel sits in) has ``fig.supxlabel`` / ``fig.supylabel``, or
     * another panel of the same grid column (for x; the same grid row for y) shares this axis with the panel
       (``sharex`` / ``sharey``: the same ticks, so one label names both) and has the label.
   A panel with its own, unshared axis needs its own label, even if its neighbour's label would fit it.

Inside the notebook kernels that the test run starts, `install()` makes every rendered figure pass through
`problems`: the rendering raises `UnreadableFigure`, which turns the cell that drew the figure into an error
(conftest.py explains how it is switched on).
"""

from __future__ import annotations

import contextlib
import functools

from matplotlib.axes import Axes
from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.figure import FigureBase
from matplotlib.text import Annotation, Text

MIN_FONT_PT = 12.0
MAX_WIDTH_IN = 10.0
_SHOWN_EXAMPLES = 3  # texts or panels named in one message before "and N more"

__all__ = ["MIN_FONT_PT", "MAX_WIDTH_IN", "UnreadableFigure", "problems", "install"]


class UnreadableFigure(Exception):
    """A figure that the lecture hall cannot read: its `problems` are in the message."""


# ---------------------------------------------------------------------------------------------------------------
# Which texts a draw really draws


@contextlib.contextmanager
def _recording():
    """Collect every Text that draws itself while the block runs (Annotation draws through Text.draw)."""
    drawn = {}
    original = Text.draw

    @functools.wraps(original)
    def draw(self, renderer):
        if self.get_visible() and self.get_text().strip():
            drawn[id(self)] = self
        return original(self, renderer)

    Text.draw = draw
    try:
        yield drawn
    finally:
        Text.draw = original


# ---------------------------------------------------------------------------------------------------------------
# Naming things in messages


def _short(text, limit=40):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _all_axes(fig):
    return [a for a in fig.findobj(lambda artist: isinstance(artist, Axes)) if a is not None]


def _colorbar_of(ax):
    return getattr(ax, "_colorbar", None)


def _is_colorbar(ax):
    return _colorbar_of(ax) is not None or ax.get_label() == "<colorbar>"


def _describe(ax, fig):
    """'panel "head 2"', 'panel at row 1, column 3', 'the colorbar of panel "..."'."""
    colorbar = _colorbar_of(ax)
    if colorbar is not None:
        parent = getattr(colorbar.mappable, "axes", None)
        return "the colorbar" + (f" of {_describe(parent, fig)}" if parent is not None else "")
    if ax.get_label() == "<colorbar>":
        return "a colorbar"
    title = next((t.get_text() for t in (ax.title, ax._left_title, ax._right_title) if t.get_text().strip()), "")
    if title:
        return f"panel {_short(title)!r}"
    spec = ax.get_subplotspec()
    if spec is not None:
        return f"panel at row {spec.rowspan.start}, column {spec.colspan.start}"
    return f"axes {_all_axes(fig).index(ax)}"


def _text_kinds(fig):
    """id(text) -> (kind, where) for the texts whose role we know; every other text is 'text' in the figure."""
    kinds = {}
    for figure in fig.findobj(lambda artist: isinstance(artist, FigureBase)):
        for name, kind in (("_suptitle", "suptitle"), ("_supxlabel", "supxlabel"), ("_supylabel", "supylabel")):
            text = getattr(figure, name, None)
            if text is not None:
                kinds[id(text)] = (kind, "the figure")
        for legend in figure.legends:
            kinds.update({id(t): ("legend text", "a figure legend") for t in legend.texts})
            kinds[id(legend.get_title())] = ("legend title", "a figure legend")
    for ax in _all_axes(fig):
        where = _describe(ax, fig)
        prefix = "colorbar " if _is_colorbar(ax) else ""
        for text in (ax.title, ax._left_title, ax._right_title):
            kinds[id(text)] = (prefix + "title", where)
        for letter, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            kinds[id(axis.label)] = (prefix + ("label" if prefix else f"{letter} label"), where)
            kinds[id(axis.offsetText)] = (prefix + "axis offset text", where)
            for tick in list(axis.majorTicks) + list(axis.minorTicks):
                kinds[id(tick.label1)] = kinds[id(tick.label2)] = (prefix + "tick label", where)
        legend = ax.get_legend()
        if legend is not None:
            kinds.update({id(t): ("legend text", where) for t in legend.texts})
            kinds[id(legend.get_title())] = ("legend title", where)
        for text in ax.texts:
            kinds[id(text)] = ("annotation" if isinstance(text, Annotation) else "text", where)
    return kinds


def _list(items, total=None):
    """'a', 'b', 'c' and 5 more"""
    items = list(items)
    total = len(items) if total is None else total
    shown = ", ".join(items[:_SHOWN_EXAMPLES])
    return shown + (f" and {total - _SHOWN_EXAMPLES} more" if total > _SHOWN_EXAMPLES else "")


def _plural(kind, n):
    return kind if n == 1 else kind + "s"


# ---------------------------------------------------------------------------------------------------------------
# The three rules


def _width_problems(fig):
    width, height = fig.get_size_inches()
    found = []
    if width > MAX_WIDTH_IN + 1e-9:
        found.append(f"figure width {width:.1f} in > {MAX_WIDTH_IN:g} in (figsize=({width:g}, {height:g}); "
                     f"at most {MAX_WIDTH_IN:g} in wide, so that {MIN_FONT_PT:g} pt stays {MIN_FONT_PT:g} pt "
                     f"on the page)")
    else:
        drawn = fig.get_tightbbox().width  # inches: what bbox_inches="tight" keeps, outside parts included
        if drawn > MAX_WIDTH_IN + 0.05:
            found.append(f"drawn content {drawn:.1f} in wide > {MAX_WIDTH_IN:g} in: something sticks out of the "
                         f"{width:g} in figure (a legend or label outside the axes)")
    return found


def _font_problems(fig, drawn):
    kinds = _text_kinds(fig)
    small = {}  # (kind, size) -> [(text, where)]
    for text in drawn.values():
        size = float(text.get_fontsize())
        if size < MIN_FONT_PT - 1e-9:
            kind, where = kinds.get(id(text), ("annotation" if isinstance(text, Annotation) else "text",
                                               "the figure"))
            small.setdefault((kind, round(size, 2)), []).append((text.get_text(), where))
    found = []
    for (kind, size), texts in sorted(small.items(), key=lambda item: (item[0][1], item[0][0])):
        wheres = list(dict.fromkeys(where for _, where in texts))
        place = wheres[0] if len(wheres) == 1 else f"in {len(wheres)} places: {_list(wheres)}"
        names = list(dict.fromkeys(repr(_short(s)) for s, _ in texts))
        if len(texts) == 1:
            found.append(f"{kind} {names[0]} at {size:.1f} pt < {MIN_FONT_PT:g} pt ({place})")
        else:
            examples = ", ".join(names[:_SHOWN_EXAMPLES]) + (", ..." if len(names) > _SHOWN_EXAMPLES else "")
            found.append(f"{len(texts)} {_plural(kind, 2)} at {size:.1f} pt < {MIN_FONT_PT:g} pt "
                         f"({examples}; {place})")
    return found


def _has_label(axis):
    return bool(axis.label.get_text().strip()) and axis.label.get_visible()


def _sup_label(ax, letter):
    figure = ax.get_figure(root=False)
    while figure is not None:
        text = getattr(figure, f"_sup{letter}label", None)
        if text is not None and text.get_visible() and text.get_text().strip():
            return True
        parent = figure.get_figure(root=False) if hasattr(figure, "get_figure") else None
        figure = None if parent is figure else parent
    return False


def _neighbour_label(ax, letter, panels):
    """A panel of the same grid column (x) or row (y) that shares this axis and has the label."""
    spec = ax.get_subplotspec()
    if spec is None:
        return False
    shared = ax.get_shared_x_axes() if letter == "x" else ax.get_shared_y_axes()
    for other in panels:
        other_spec = other.get_subplotspec()
        if other is ax or other_spec is None or other_spec.get_gridspec() is not spec.get_gridspec():
            continue
        same_line = (other_spec.colspan == spec.colspan) if letter == "x" else (other_spec.rowspan == spec.rowspan)
        if same_line and shared.joined(ax, other) and _has_label(getattr(other, f"{letter}axis")):
            return True
    return False


def _shows_data(ax):
    return bool(ax.lines or ax.images or ax.collections or ax.patches or ax.tables or ax.texts or ax.artists)


def _label_problems(fig):
    panels = [ax for ax in _all_axes(fig) if ax.get_visible() and not _is_colorbar(ax)]
    missing = {"x": [], "y": []}
    for ax in panels:
        if not ax.axison or not _shows_data(ax):
            continue
        for letter in "xy":
            axis = getattr(ax, f"{letter}axis")
            if not axis.get_visible() or _has_label(axis):
                continue
            if _sup_label(ax, letter) or _neighbour_label(ax, letter, panels):
                continue
            missing[letter].append(_describe(ax, fig))
    share = {"x": "sharex, a labelled panel in the same column", "y": "sharey, a labelled panel in the same row"}
    return [f"no {letter} label: {_list(where)} "
            f"(set_{letter}label, or share the axis ({share[letter]}), or fig.sup{letter}label)"
            for letter, where in missing.items() if where]


def _check(fig, drawn):
    return _width_problems(fig) + _font_problems(fig, drawn) + _label_problems(fig)


def problems(fig):
    """Everything that makes `fig` unreadable from the back of a lecture hall; [] when it is fine.

    Draws the figure (without output) to see which texts are really drawn, and at what size.
    """
    with _recording() as drawn:
        fig.draw_without_rendering()
    return _check(fig, drawn)


def report(fig, found):
    """The message of UnreadableFigure."""
    width, height = fig.get_size_inches()
    lines = [f"this {width:g} x {height:g} in figure is not readable from the back of a lecture hall "
             f"(tests/figure_check.py; docs/design.md, section 4 (what a lesson looks like)):"]
    return "\n".join(lines + [f"  - {p}" for p in found])


# ---------------------------------------------------------------------------------------------------------------
# Inside a notebook kernel


def install():
    """Check every figure that is rendered (inline display, savefig): a problem raises UnreadableFigure.

    Wraps FigureCanvasBase.print_figure, through which the inline backend's display and every savefig pass;
    the texts are collected during that render, so the figure is not drawn twice. The image is rendered first
    (a savefig still writes its file); then the error is raised. In IPython's display of a figure the error
    becomes an error output of the cell that showed it, which nbval reports as a failed cell.
    """
    if getattr(FigureCanvasBase.print_figure, "_course_figure_check", False):
        return
    original = FigureCanvasBase.print_figure
    busy = []

    @functools.wraps(original)
    def print_figure(self, *args, **kwargs):
        if busy:  # a render inside a render: the outer one checks
            return original(self, *args, **kwargs)
        busy.append(True)
        try:
            with _recording() as drawn:
                result = original(self, *args, **kwargs)
            found = _check(self.figure, drawn)
        finally:
            busy.pop()
        if found:
            raise UnreadableFigure(report(self.figure, found))
        return result

    print_figure._course_figure_check = True
    FigureCanvasBase.print_figure = print_figure


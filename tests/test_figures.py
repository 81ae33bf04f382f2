"""The lecture-hall check of figures (tests/figure_check.py): planted faults are found and named, a readable
figure passes, and the notebook kernels that the test run starts really apply it."""

import os
from pathlib import Path

import matplotlib
import numpy as np
import pytest
from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.figure import Figure

import figure_check
from figure_check import UnreadableFigure, problems


@pytest.fixture(autouse=True)
def course_style():
    """The course's setting (each notebook's first cell): 13 pt text. Ticks read rcParams when drawn."""
    with matplotlib.rc_context({"font.size": 13}):
        yield


def line_panel(ax, title="a curve", xlabel="step", ylabel="value"):
    ax.plot([0, 0.5, 1], [0, 0.5, 1])
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel, xticks=[0, 0.5, 1], yticks=[0, 0.5, 1])
    return ax


def readable():
    fig = Figure(figsize=(9, 4.5))
    ax = line_panel(fig.add_subplot(), title="A readable figure")
    ax.plot([0, 1], [1, 0], label="falling")
    ax.legend()
    ax.annotate("crossing", xy=(0.5, 0.5), xytext=(0.7, 0.8), arrowprops={"arrowstyle": "->"})
    image = ax.imshow(np.eye(3), extent=(0, 1, 0, 1), alpha=0.2)
    fig.colorbar(image, ax=ax, label="weight")
    fig.suptitle("Everything at 13 pt or more")
    return fig


def test_a_readable_figure_passes():
    assert problems(readable()) == []


def test_small_tick_labels_are_named_with_their_size():
    fig = readable()
    fig.axes[0].tick_params(axis="x", labelsize=8)
    (message,) = problems(fig)
    assert message.startswith("3 tick labels at 8.0 pt < 12 pt ('0.0', '0.5', '1.0'")
    assert "panel 'A readable figure'" in message


@pytest.mark.parametrize("plant, expected", [
    (lambda fig: fig.axes[0].title.set_fontsize(11), "title 'A readable figure' at 11.0 pt < 12 pt"),
    (lambda fig: fig.axes[0].xaxis.label.set_fontsize(9), "x label 'step' at 9.0 pt < 12 pt"),
    (lambda fig: fig.axes[0].get_legend().texts[0].set_fontsize(10), "legend text 'falling' at 10.0 pt"),
    (lambda fig: fig.axes[0].texts[0].set_fontsize(8), "annotation 'crossing' at 8.0 pt < 12 pt"),
    (lambda fig: fig._suptitle.set_fontsize(11.5), "suptitle 'Everything at 13 pt or more' at 11.5 pt"),
    (lambda fig: fig.axes[1].tick_params(labelsize=9), "colorbar tick labels at 9.0 pt"),
    (lambda fig: fig.axes[1].yaxis.label.set_fontsize(9), "colorbar label 'weight' at 9.0 pt"),
])
def test_every_kind_of_text_is_checked(plant, expected):
    fig = readable()
    plant(fig)
    found = problems(fig)
    assert len(found) == 1 and expected in found[0], found


def test_text_at_exactly_12_pt_passes_and_hidden_text_is_ignored():
    fig = readable()
    fig.axes[0].tick_params(labelsize=12)
    assert problems(fig) == []
    fig.axes[0].tick_params(axis="x", labelsize=8, labelbottom=False)  # small, but not drawn
    fig.axes[0].texts[0].set(fontsize=6, visible=False)
    assert problems(fig) == []


def test_the_default_10_pt_of_matplotlib_fails():
    with matplotlib.rc_context({"font.size": 10}):
        fig = Figure(figsize=(8, 4))
        line_panel(fig.add_subplot())
        found = problems(fig)
    assert any("tick labels at 10.0 pt < 12 pt" in p for p in found), found


def test_a_wide_figure_fails():
    fig = Figure(figsize=(12, 4))
    line_panel(fig.add_subplot())
    assert problems(fig) == ["figure width 12.0 in > 10 in (figsize=(12, 4); at most 10 in wide, so that 12 pt "
                             "stays 12 pt on the page)"]


def test_a_legend_outside_a_full_width_figure_fails():
    fig = Figure(figsize=(10, 4))
    ax = line_panel(fig.add_subplot())
    ax.plot([0, 1], [1, 0], label="a legend entry outside the axes")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    (message,) = problems(fig)
    assert message.startswith("drawn content") and "sticks out of the 10 in figure" in message


def test_a_panel_without_axis_labels_fails():
    fig = Figure(figsize=(10, 4))
    left, right = fig.subplots(1, 2)
    line_panel(left, title="left")
    line_panel(right, title="right", xlabel="", ylabel="")
    found = problems(fig)
    assert found == [
        "no x label: panel 'right' (set_xlabel, or share the axis (sharex, a labelled panel in the same column), "
        "or fig.supxlabel)",
        "no y label: panel 'right' (set_ylabel, or share the axis (sharey, a labelled panel in the same row), "
        "or fig.supylabel)"]


def test_an_image_panel_with_ticks_turned_off_still_needs_labels():
    fig = Figure(figsize=(6, 6))
    ax = fig.add_subplot()
    ax.imshow(np.eye(4))
    ax.set(xticks=[], yticks=[], title="head 0")
    assert [p.split(":")[0] for p in problems(fig)] == ["no x label", "no y label"]


def grid(sharex, sharey):
    fig = Figure(figsize=(9, 8))
    axes = fig.subplots(2, 2, sharex=sharex, sharey=sharey)
    for ax in axes.flat:
        ax.plot([0, 1], [0, 1])
    for ax in axes[1]:
        ax.set_xlabel("key")
    for ax in axes[:, 0]:
        ax.set_ylabel("query")
    return fig, axes


def test_shared_axes_are_covered_by_the_label_of_their_row_or_column():
    fig, _ = grid(sharex=True, sharey=True)
    assert problems(fig) == []


def test_unshared_axes_each_need_their_own_label():
    fig, _ = grid(sharex=False, sharey=False)
    found = problems(fig)
    assert [p.split(":")[0] for p in found] == ["no x label", "no y label"]
    assert "panel at row 0, column 0, panel at row 0, column 1 (" in found[0]  # the top row
    assert "panel at row 0, column 1, panel at row 1, column 1 (" in found[1]  # the right column


def test_sharing_with_a_panel_of_another_column_does_not_cover():
    fig = Figure(figsize=(9, 4))
    left, right = fig.subplots(1, 2, sharex=True)
    line_panel(left)
    line_panel(right, xlabel="")
    assert [p.split(":")[0] for p in problems(fig)] == ["no x label"]


def test_figure_level_labels_cover_every_panel():
    fig, axes = grid(sharex=False, sharey=False)
    for ax in axes.flat:
        ax.set(xlabel="", ylabel="")
    fig.supxlabel("key (attended to)")
    fig.supylabel("query (attending)")
    assert problems(fig) == []


def test_colorbars_diagrams_and_twin_axes_need_no_labels():
    fig = Figure(figsize=(10, 4))
    diagram, plot = fig.subplots(1, 2)
    diagram.text(0.5, 0.5, "a box", ha="center")
    diagram.axis("off")
    line_panel(plot)
    twin = plot.twinx()  # its own x axis is hidden
    twin.plot([0, 1], [3, 2])
    twin.set_ylabel("other value")
    fig.colorbar(plot.imshow(np.eye(2), extent=(0, 1, 0, 1)), ax=plot)
    assert problems(fig) == []
    diagram.texts[0].set_fontsize(8)  # a diagram's text is still checked
    assert problems(fig) == ["text 'a box' at 8.0 pt < 12 pt (panel at row 0, column 0)"]


def test_many_small_texts_are_reported_in_one_message_per_kind_and_size():
    fig = Figure(figsize=(10, 5))
    axes = fig.subplots(2, 4, sharex=True, sharey=True)
    for k, ax in enumerate(axes.flat):
        ax.imshow(np.eye(3))
        ax.set_title(f"head {k}", fontsize=11)
    fig.supxlabel("key")
    fig.supylabel("query")
    assert problems(fig) == ["8 titles at 11.0 pt < 12 pt ('head 0', 'head 1', 'head 2', ...; in 8 places: "
                             "panel 'head 0', panel 'head 1', panel 'head 2' and 5 more)"]


def test_install_checks_every_rendered_figure(monkeypatch, tmp_path):
    monkeypatch.setattr(FigureCanvasBase, "print_figure", FigureCanvasBase.print_figure)  # undone after the test
    figure_check.install()
    figure_check.install()  # a second call does not wrap twice
    assert FigureCanvasBase.print_figure.__wrapped__.__name__ == "print_figure"
    assert not hasattr(FigureCanvasBase.print_figure.__wrapped__, "__wrapped__")
    readable().savefig(tmp_path / "good.png")
    bad = readable()
    bad.axes[0].tick_params(labelsize=8)
    with pytest.raises(UnreadableFigure, match=r"not readable from the back of a lecture hall(.|\n)*"
                                               r"tick labels at 8.0 pt < 12 pt"):
        bad.savefig(tmp_path / "bad.png")
    assert (tmp_path / "good.png").stat().st_size > 0


@pytest.mark.skipif(os.environ.get("COURSE_FIGURE_CHECK") == "0", reason="COURSE_FIGURE_CHECK=0 switches it off")
def test_the_notebook_kernels_check_their_figures():
    """Started as nbval starts a kernel (conftest.py's IPYTHONDIR is inherited): an unreadable figure shown
    with plt.show() becomes an error output of its cell, which nbval reports as a failed cell."""
    from nbval.kernel import CURRENT_ENV_KERNEL_NAME, start_new_kernel

    startup = Path(os.environ["IPYTHONDIR"]) / "profile_default" / "startup" / "00-figure-check.py"
    assert startup.is_file(), "conftest.py did not make the test session's IPython profile"
    manager, client = start_new_kernel(kernel_name=CURRENT_ENV_KERNEL_NAME)
    try:
        def run(code):
            outputs = []
            client.execute_interactive(code, timeout=120, output_hook=outputs.append)
            return [(m["msg_type"], m["content"]) for m in outputs if m["msg_type"] in ("error", "display_data")]

        run("import matplotlib.pyplot as plt\nplt.rcParams.update({'font.size': 13})")
        assert run("_course_figure_check") [0][1]["ename"] == "NameError"  # the startup leaves no names behind
        good = run("fig, ax = plt.subplots(figsize=(9, 4))\nax.plot([0, 1])\nax.set(xlabel='x', ylabel='y')\n"
                   "plt.show()")
        assert [kind for kind, _ in good] == ["display_data"] and "image/png" in good[0][1]["data"]
        bad = run("fig, ax = plt.subplots(figsize=(9, 4))\nax.plot([0, 1])\nax.set(xlabel='x', ylabel='y')\n"
                  "ax.tick_params(labelsize=8)\nplt.show()")
        errors = [content for kind, content in bad if kind == "error"]
        assert len(errors) == 1 and errors[0]["ename"] == "UnreadableFigure"
        assert "tick labels at 8.0 pt < 12 pt" in errors[0]["evalue"]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)

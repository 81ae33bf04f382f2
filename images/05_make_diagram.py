"""Draw images/05_attention_layer.svg, the data-flow diagram of notebook 05 (run from the repository root).

    python images/05_make_diagram.py
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "05_attention", "font.family": "DejaVu Sans"})
BLUE, GREEN, ORANGE, GREY = "#dbe9f7", "#dff2df", "#fde7cc", "#eeeeee"


def box(ax, x, y, text, shape=None, color=BLUE, w=2.3, h=0.95):
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.12",
                                fc=color, ec="#333333", lw=1.2))
    lift = 0 if not shape else 0.36 if "\n" in shape else 0.15
    ax.text(x, y + lift, text, ha="center", va="center", fontsize=13, weight="bold")
    if shape:
        ax.text(x, y + lift - 0.42 - 0.16 * shape.count("\n"), shape, ha="center", va="center", fontsize=10.5,
                color="#333333")


def arrow(ax, start, end, **kwargs):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, lw=1.3, color="#333333",
                                 shrinkA=0, shrinkB=0, **kwargs))


def draw(path: Path) -> None:
    fig, ax = plt.subplots(figsize=(16, 7.4))
    ax.set_xlim(0, 21.8)
    ax.set_ylim(0, 9.6)
    ax.axis("off")
    ax.text(10.9, 9.25, "Causal multi-head self-attention: one layer of GPT-2", ha="center", fontsize=18,
            weight="bold")

    # Top: project every token three times and split d_out into heads.
    box(ax, 1.6, 6.7, "x", "(batch, tokens, d_in)", GREY, w=2.8)
    for y, name, letter in ((8.0, "W_key", "K"), (6.7, "W_value", "V"), (5.4, "W_query", "Q")):
        box(ax, 5.5, y, name, "Linear: d_in → d_out", w=3.0)
        box(ax, 10.0, y, f"split into heads: {letter}", "(batch, heads, tokens, head_dim)", w=4.3)
        arrow(ax, (3.0, 6.7), (4.0, y))
        arrow(ax, (7.0, y), (7.85, y))
    box(ax, 15.6, 7.35, "KV cache (optional)", "keys and values of earlier\ntokens, new ones appended",
        ORANGE, w=3.8, h=1.5)
    arrow(ax, (12.15, 8.0), (13.7, 7.65))
    arrow(ax, (12.15, 6.7), (13.7, 7.05))

    # Middle: the five steps F.scaled_dot_product_attention fuses.
    steps = [(2.6, 3.7, "Q Kᵀ / √head_dim", "(batch, heads, tokens, keys)"),
             (6.6, 3.4, "mask the future", "−∞ above the diagonal"),
             (10.6, 3.6, "softmax", "over keys: rows sum to 1"),
             (14.4, 3.0, "dropout", "training only"),
             (18.85, 4.5, "weights @ V", "(batch, heads, tokens, head_dim)")]
    for x, w, name, shape in steps:
        box(ax, x, 2.9, name, shape, GREEN, w=w)
    for (x1, w1, *_), (x2, w2, *_) in zip(steps, steps[1:]):
        arrow(ax, (x1 + w1 / 2, 2.9), (x2 - w2 / 2, 2.9))
    ax.add_patch(FancyBboxPatch((0.5, 1.8), 20.8, 2.2, boxstyle="round,pad=0.05,rounding_size=0.2",
                                fc="none", ec="#2e7d32", lw=1.6, ls="--"))
    ax.text(0.6, 1.35, "F.scaled_dot_product_attention does these five steps in one call; its fast kernels "
            "never store the whole (tokens × keys) matrix", fontsize=12.5, color="#2e7d32", style="italic")
    line = dict(color="#333333", lw=1.3)
    ax.plot([10.0, 10.0, 1.7], [4.92, 4.6, 4.6], **line)  # Q: down and left to the scores
    arrow(ax, (1.7, 4.6), (1.7, 3.38))
    ax.text(1.2, 4.7, "Q", fontsize=13, weight="bold")
    ax.plot([14.6, 14.6, 3.3], [6.6, 4.25, 4.25], **line)  # K: from the cache to the scores
    arrow(ax, (3.3, 4.25), (3.3, 3.38))
    ax.text(3.45, 4.35, "K", fontsize=13, weight="bold")
    ax.plot([17.5, 19.3], [7.35, 7.35], **line)  # V: from the cache to the weighted sum
    arrow(ax, (19.3, 7.35), (19.3, 3.38))
    ax.text(19.45, 4.6, "V", fontsize=13, weight="bold")

    # Bottom: heads side by side again, mixed by one Linear layer.
    box(ax, 18.9, 0.55, "merge heads, out_proj", "(batch, tokens, d_out)", GREY, w=4.2)
    arrow(ax, (18.9, 2.42), (18.9, 1.03))
    fig.savefig(path, format="svg", metadata={"Date": None}, bbox_inches="tight")  # no date: reproducible


if __name__ == "__main__":
    draw(Path(__file__).with_name("05_attention_layer.svg"))

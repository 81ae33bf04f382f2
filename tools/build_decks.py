"""Build a reveal.js slide deck of every lesson into one folder that works offline, opened from file://.

    python tools/build_decks.py                                # every notebook -> build/decks/
    python tools/build_decks.py --out /tmp/decks notebooks/05_attention.ipynb

`jupyter nbconvert --to slides` writes a deck that loads reveal.js, MathJax, require.js and jQuery from CDNs and
links figures by a path relative to the notebook, so offline it is one long page with raw LaTeX. Here:
- reveal.js and MathJax come from registry packages installed by requirements.txt (sphinx-revealjs ships
  reveal.js's dist/, jupyter-server-mathjax ships MathJax 2) and are copied once into `<out>/_static/`;
- the template below loads them by relative paths with plain <script> tags (no require.js, no jQuery, no mermaid,
  no web fonts): nothing in a deck asks for the network;
- figures in markdown cells are embedded as data URIs (plots already are), so a deck can be copied anywhere;
- cells tagged `solution` (hidden exercise solutions and worked answers) are left out.
The slide type of each cell comes from its metadata, set by `tools/refresh_notebooks.py` (`mark_slides`)."""

import base64
import mimetypes
import re
import shutil
import sys
from pathlib import Path

import jupyter_server_mathjax
import nbformat
import sphinx_revealjs
from jinja2 import DictLoader
from nbconvert import SlidesExporter

ROOT = Path(__file__).resolve().parents[1]
REVEAL = Path(sphinx_revealjs.__file__).parent / "_static" / "revealjs"
MATHJAX = Path(jupyter_server_mathjax.__file__).parent / "static"

# nbconvert's reveal template with every asset local: its head loads require.js, jQuery, mermaid and MathJax
# from CDNs and its footer starts reveal.js through require.js. Here the first three are gone, MathJax and
# reveal.js are plain script tags, and <body data-math-typeset="done"> says when the formulas are drawn.
TEMPLATE = r"""{%- extends 'reveal/index.html.j2' -%}
{%- block html_head_js_jquery -%}{%- endblock html_head_js_jquery -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_css -%}
<style>
/* a slide taller than the screen scrolls, instead of losing its end below the bottom edge */
.reveal .slides section:not(.stack) { max-height: 100vh; overflow-y: auto; }
/* MathJax keeps an invisible MathML copy of each formula for screen readers; left to MathJax's styles, its
   letters (\mathbb, \mathcal) ask for TeX fonts that are not shipped */
.MJX_Assistive_MathML * { font-family: inherit !important; }
</style>
{%- endblock html_head_css -%}
{%- block html_head_js_mathjax -%}
<script type="text/x-mathjax-config">
MathJax.Hub.Config({
  skipStartupTypeset: true,  // typeset once reveal.js has laid the slides out (see the footer)
  tex2jax: {inlineMath: [["$", "$"], ["\\(", "\\)"]], displayMath: [["$$", "$$"], ["\\[", "\\]"]],
            processEscapes: true, processEnvironments: true},
  messageStyle: "none",
  "fast-preview": {disabled: true},  // its quick first pass draws with MathJax's TeX fonts, which are not shipped
  // jupyter-server-mathjax ships one web font for MathJax 2's HTML-CSS output: STIX-Web
  "HTML-CSS": {availableFonts: [], preferredFont: null, webFont: "STIX-Web", imageFont: null},
});
</script>
<script src="{{ resources.mathjax_url }}"></script>
{%- endblock html_head_js_mathjax -%}
{% block footer_js %}
<script src="{{ reveal_url_prefix }}/dist/reveal.js"></script>
<script>
// MathJax 2 measures a formula wrongly in a slide that is not displayed, so every slide stays displayed
// (viewDistance) and the formulas are typeset once, after reveal.js has laid them out.
Reveal.initialize({
  controls: true, progress: true, history: true, slideNumber: "{{ reveal_number }}",
  transition: "{{ reveal_transition }}", width: {{ reveal_width }}, height: {{ reveal_height }},
  viewDistance: 1000,
}).then(function () {
  MathJax.Hub.Queue(["Typeset", MathJax.Hub], function () { document.body.dataset.mathTypeset = "done"; });
});
</script>
{% endblock footer_js %}
"""


def copy_assets(out: Path) -> None:
    """reveal.js's dist/ (its themes' fonts included) and MathJax 2 into `out/_static`."""
    static = out / "_static"
    shutil.copytree(REVEAL / "dist", static / "reveal.js" / "dist", dirs_exist_ok=True)
    shutil.copytree(MATHJAX, static / "mathjax", dirs_exist_ok=True)


def exporter() -> SlidesExporter:
    return SlidesExporter(
        extra_loaders=[DictLoader({"offline_deck.html.j2": TEMPLATE})], template_file="offline_deck.html.j2",
        reveal_url_prefix="_static/reveal.js", reveal_theme="white",  # white: its fonts ship in dist/theme/fonts
        mathjax_url="_static/mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe")


def embed_figures(markdown: str, folder: Path) -> str:
    """Markdown images with a local path (`![alt](../images/x.svg)`) as data URIs. nbconvert's own
    `embed_images` refuses files outside the notebook's folder, and the course's figures live in images/."""
    def embed(match):
        alt, src = match.groups()
        if re.match(r"[a-z]+:", src):  # http:, data: ...: not a file
            return match.group(0)
        file = folder / src
        if not file.is_file():
            raise FileNotFoundError(f"a markdown cell shows {src!r}, and {file} does not exist")
        mime = mimetypes.guess_type(file.name)[0]
        return f"![{alt}](data:{mime};base64,{base64.b64encode(file.read_bytes()).decode()})"
    return re.sub(r"!\[([^\]]*)\]\(([^)\s]+)\)", embed, markdown)


def build_deck(path: Path, out: Path) -> Path:
    """Write `out/<notebook>.slides.html` for one notebook, hidden solutions removed; return its path."""
    notebook = nbformat.read(path, as_version=4)
    notebook.cells = [c for c in notebook.cells if "solution" not in c.metadata.get("tags", [])]
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            cell.source = embed_figures(cell.source, path.parent)
    html, _ = exporter().from_notebook_node(notebook)
    deck = out / f"{path.stem}.slides.html"
    deck.write_text(html, encoding="utf-8")
    return deck


def build_decks(paths: list[Path], out: Path) -> list[Path]:
    """Every deck, the assets they share and an index page that links them."""
    out.mkdir(parents=True, exist_ok=True)
    copy_assets(out)
    decks = [build_deck(path, out) for path in paths]
    links = "\n".join(f'<li><a href="{d.name}">{d.name.removesuffix(".slides.html")}</a></li>' for d in decks)
    (out / "index.html").write_text(f"<!DOCTYPE html>\n<meta charset='utf-8'>\n<title>GPT-2 from scratch: "
                                    f"slides</title>\n<h1>GPT-2 from scratch: slides</h1>\n<ul>\n{links}\n</ul>\n",
                                    encoding="utf-8")
    return decks


def main(args: list[str]) -> None:
    out = ROOT / "build" / "decks"
    if "--out" in args:
        at = args.index("--out")
        if at + 1 == len(args):
            sys.exit("--out needs a folder: python tools/build_decks.py --out DIR [notebooks...]")
        out = Path(args[at + 1]).resolve()
        del args[at:at + 2]
    paths = [Path(a).resolve() for a in args] or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        sys.exit(f"no such notebook: {', '.join(missing)}")
    for deck in build_decks(paths, out):
        print(f"{deck} ({deck.stat().st_size / 1e6:.1f} MB)", flush=True)
    print(f"open {out / 'index.html'}")


if __name__ == "__main__":
    main(sys.argv[1:])

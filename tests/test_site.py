"""The course as a website (tools/build_site.py): every lesson has a page with its stored outputs, hidden solutions
and tool markers stay out of it, worked answers stay closed, and in a real browser, with every host but 127.0.0.1
unresolvable, every page loads with its images, links and typeset maths, the table of contents and the
next/previous links go through the lessons in order, search finds a lesson, and nothing asks the network.

The site is the one in build/site/ (`.ci/run` builds it before pytest), rebuilt here first when it is missing or
older than a notebook, a document or the build script. The browser tests use tests/test_browser.py's Chromium and
are skipped, or fail under COURSE_REQUIRE_BROWSER=1, in the same way; the screenshot of a lesson page is written to
build/artifacts/ (a copy is docs/screenshots/site_lesson.png)."""

import functools
import html
import re
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import nbformat
import pytest
from bs4 import BeautifulSoup

from test_browser import ARTIFACTS, Visit, browser  # noqa: F401 (the fixture, shared)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from build_site import LESSONS, MARKER, OUT, build_site, documents, is_answer  # noqa: E402

SCREENSHOT_LESSON = "05_attention"  # maths, a figure from images/ and plots among its outputs
MATH = ".math.notranslate"  # a formula, as Sphinx writes it (MathJax's own output has class "math" too)


def sources() -> list[Path]:
    """What the site is made from."""
    return [ROOT / "tools" / "build_site.py", ROOT / "README.md", *LESSONS,
            *(ROOT / f"{name}.md" for name in documents()), *(ROOT / "images").iterdir()]


@pytest.fixture(scope="module")
def site() -> Path:
    index = OUT / "index.html"
    if not index.exists() or index.stat().st_mtime < max(p.stat().st_mtime for p in sources()):
        build_site(quiet=True)
    return OUT


def page(site: Path, notebook: Path) -> BeautifulSoup:
    return BeautifulSoup((site / "notebooks" / f"{notebook.stem}.html").read_text(encoding="utf-8"), "html.parser")


def article(soup: BeautifulSoup) -> str:
    """The text of a page's content, without the navigation."""
    return soup.find("article").get_text()


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_every_lesson_has_a_page_without_hidden_solutions_or_markers(site, path):
    notebook = nbformat.read(path, as_version=4)
    soup = page(site, path)
    text = article(soup)
    title = notebook.cells[0].source.splitlines()[0].lstrip("# ")
    assert soup.find("h1").get_text().rstrip("¶").strip() == re.sub(r"[*_`]", "", title)

    # the stored outputs are shown: every figure, and the text of the last printed output
    figures = sum("image/png" in o.get("data", {}) for c in notebook.cells if c.cell_type == "code" and not is_answer(c)
                  for o in c.outputs)
    assert len(soup.select("div.cell_output img")) == figures
    printed = [o.text for c in notebook.cells if c.cell_type == "code" and "solution" not in c.metadata.get("tags", [])
               for o in c.outputs if o.output_type == "stream" and o.text.strip()]
    assert printed and printed[-1].strip().splitlines()[-1] in text

    # no line of a hidden solution that the lesson does not show elsewhere (a worked answer's code is shown, inside
    # its closed answer: test_worked_answers_are_closed_details)
    hidden = [c for c in notebook.cells if c.cell_type == "code" and "solution" in c.metadata.get("tags", [])
              and not is_answer(c)]
    shown = "\n".join(c.source + "".join(o.get("text", "") for o in c.get("outputs", [])) for c in notebook.cells
                      if c not in hidden)
    for cell in hidden:
        own = [line.strip() for line in cell.source.splitlines()
               if len(line.strip()) > 25 and line.strip() not in shown]
        assert own, f"{path.name}: a hidden solution with no line of its own to look for: {cell.source[:80]!r}"
        leaked = [line for line in own if line in text]
        assert not leaked, f"{path.name}: the page shows a hidden solution's lines {leaked[:3]}"

    # no nbdev directive or nbval marker in the code shown
    code = [line for pre in soup.select("div.cell_input pre") for line in pre.get_text().splitlines()]
    assert code and not [line for line in code if MARKER.match(line)]
    assert "NBVAL_" not in "\n".join(code)


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_worked_answers_are_closed_details(site, path):
    cells = nbformat.read(path, as_version=4).cells
    answers = [c for c in cells if c.cell_type == "markdown" and "solution" in c.metadata.get("tags", [])]
    content = page(site, path).find("article")
    details = content.find_all("details")
    assert len(details) == sum(c.source.count("<details>") for c in cells if c.cell_type == "markdown") >= len(answers)
    assert not [d for d in details if d.has_attr("open")], f"{path.name}: a worked answer is open"
    assert all(d.find("summary") and d.find("summary").get_text().strip() for d in details)
    # each answer's longest plain line (prose or code, no markup) is inside a <details>, and nowhere else
    inside = [" ".join(d.get_text().split()) for d in details]
    for detail in details:
        detail.decompose()
    outside = " ".join(content.get_text().split())
    # an answer's code cells (tagged `answer`) are shown inside its <details> too, with what they printed
    for cell in answers + [c for c in cells if is_answer(c)]:
        lines = [" ".join(line.split()) for line in cell.source.splitlines()
                 if len(line.strip()) > 20 and not MARKER.match(line)
                 and (cell.cell_type == "code" or not re.search(r"[$`*\[\]<>\\|#]", line))]
        assert lines, f"{path.name}: a worked answer with no plain line to look for: {cell.source[:80]!r}"
        probe = max(lines, key=len)
        assert any(probe in text for text in inside), f"{path.name}: {probe!r} is not inside a <details>"
        assert probe not in outside, f"{path.name}: {probe!r} is shown outside its <details>"

def test_the_site_ships_no_notebook_source(site):
    assert not list(site.rglob("*.ipynb")) and not list((site / "_sources").rglob("*.*"))


def test_the_documents_are_pages(site):
    for name in ["README", *documents()]:
        assert (site / f"{name}.html").is_file(), name


# ---------------------------------------------------------------------------------------------------------------
# In a browser


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(site):
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def local_target(site: Path, base: str, href: str) -> tuple[Path, str] | None:
    """The file and fragment a link of the site leads to, or None for a link elsewhere."""
    url, fragment = urldefrag(href)
    if not url.startswith(base):
        return None
    path = unquote(urlparse(url).path).lstrip("/")
    return site / (path or "index.html"), fragment


def typeset(page) -> None:
    """Wait until MathJax has typeset the page's formulas (where it has any)."""
    if page.locator(MATH).count():
        page.wait_for_function("() => window.MathJax && MathJax.isReady", timeout=30_000)
        page.evaluate("() => new Promise(done => MathJax.Hub.Queue(done))")


def test_the_site_reads_offline_in_order(browser, site, served):  # noqa: F811
    order = ["README", *(f"notebooks/{p.stem}" for p in LESSONS), *documents()]
    links, visited, maths = set(), [], 0
    with Visit(browser, lambda url: url.startswith((served, "data:")), "site") as visit:
        page = visit.page
        page.goto(served)  # index.html sends the reader to the README
        page.wait_for_url(f"{served}README.html")
        toc = page.eval_on_selector_all(".sidebar-tree a.reference.internal", "links => links.map(a => a.href)")
        assert toc == [f"{served}{name}.html" for name in order[1:]], "the table of contents is not in lesson order"
        while True:
            url = page.url
            visited.append(url.removeprefix(served).removesuffix(".html"))
            typeset(page)
            left = page.evaluate(f"[...document.querySelectorAll('{MATH}')].filter(m => !m.querySelector("
                                 f"'.MathJax, .MathJax_Display')).map(m => m.textContent)")
            assert not left, f"{url}: formulas not typeset: {left[:3]}"
            maths += page.locator(MATH).count()
            assert page.locator(".MathJax_Error, merror").count() == 0, f"{url}: MathJax errors"
            images = page.evaluate("[...document.images].map(i => [i.complete && i.naturalWidth > 0, i.src])")
            assert all(ok for ok, _ in images), f"{url}: broken images {[s for ok, s in images if not ok]}"
            links.update(page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)"))
            if visited[-1] == f"notebooks/{SCREENSHOT_LESSON}":
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                section = page.locator("article h2").nth(1)  # section 2: formulas, a section heading
                section.evaluate("h => h.scrollIntoView({behavior: 'instant'})")
                page.screenshot(path=ARTIFACTS / "site_lesson.png")
            following = page.locator("a.next-page")
            if not following.count():
                break
            previous = following.get_attribute("href")
            following.click()
            page.wait_for_url(lambda now: now != url)
            back = page.locator("a.prev-page")
            assert back.count() and page.evaluate("a => a.href", back.element_handle()) == url, \
                f"{page.url}: 'previous' does not lead back to {url} ({previous})"
        assert visited == order, "next/previous do not go through the pages in order"
        assert maths > 100, f"only {maths} formulas on the whole site"

        # every link inside the site leads to a page, file or heading that exists
        broken, texts = [], {}
        for href in sorted(links):
            target = local_target(site, served, href)
            if target is None:
                continue
            file, fragment = target
            if file.is_dir():
                file = file / "index.html"
            if not file.is_file():
                broken.append(href)
            elif fragment and file.suffix == ".html":
                if file not in texts:
                    texts[file] = file.read_text(encoding="utf-8")
                if f'id="{html.escape(unquote(fragment))}"' not in texts[file]:
                    broken.append(href)
        assert not broken, f"links to nothing: {broken}"
        assert len([h for h in links if local_target(site, served, h)]) > 100

        # search finds a lesson by a word it teaches
        page.goto(f"{served}search.html?q=perplexity")
        results = page.locator("#search-results ul.search li a")
        results.first.wait_for(timeout=30_000)
        assert f"{served}notebooks/09_training.html" in [urldefrag(h)[0] for h in
                                                          results.evaluate_all("links => links.map(a => a.href)")]

        assert visit.blocked == [], f"the site asked the network for {visit.blocked}"
        assert visit.failed == [], f"files that failed to load: {visit.failed}"
        assert visit.errors == [], f"console errors {visit.errors}"

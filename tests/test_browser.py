"""What a lecturer sees, checked in a real browser with the network cut: the offline slide decks, JupyterLab
running a notebook, and RISE's live slides.

Chromium comes from the system's packages (`apt-get install -y chromium` on Debian/Ubuntu; `.ci/run` installs it
when missing); Playwright, from requirements.txt, drives it. Where no Chromium is found these tests are skipped
with that instruction, unless COURSE_REQUIRE_BROWSER=1 (as in .ci/run), where they fail. Set COURSE_CHROMIUM to
use another Chromium or Chrome binary. Screenshots of the decks' first slides are written to
build/artifacts/."""

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import sync_playwright

from build_decks import build_decks
from refresh_notebooks import mark_slides

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ARTIFACTS = ROOT / "build" / "artifacts"
INSTALL = ("no Chromium found: install it with `apt-get install -y chromium` (Debian/Ubuntu, as root), "
           "or point COURSE_CHROMIUM at a Chromium or Chrome binary")
# Flags for a browser on a closed network: no background requests to Google's services, and every host name
# but the loopback address resolves to nothing, so nothing can leave the machine whatever a page asks for.
FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic",
         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]


def chromium_path() -> str | None:
    named = os.environ.get("COURSE_CHROMIUM")
    if named:
        if not Path(named).is_file():
            pytest.fail(f"COURSE_CHROMIUM={named!r} is not a file: set it to a Chromium or Chrome binary")
        return named
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


@pytest.fixture(scope="module")
def browser():
    path = chromium_path()
    if path is None:
        if os.environ.get("COURSE_REQUIRE_BROWSER") == "1":
            pytest.fail(INSTALL)
        pytest.skip(INSTALL)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=path, args=FLAGS)
        yield chromium
        chromium.close()


class Visit:
    """A fresh page that lets through only the addresses `allowed` accepts, and records everything else a
    page tried to load, every request that failed and every error on the console."""

    def __init__(self, browser, allowed, name):
        self.name = name
        self.context = browser.new_context(viewport={"width": 1280, "height": 800})
        self.blocked, self.failed, self.errors = [], [], []

        def route(request_route):
            url = request_route.request.url
            if allowed(url):
                request_route.continue_()
            else:
                self.blocked.append(url)
                request_route.abort()

        self.context.route("**/*", route)
        self.page = self.context.new_page()
        # MathJax 2 declares a font "MathJax_Blank" at about:blank on purpose (it measures text with it); a page
        # opened from file:// may not load it, which changes nothing that is drawn.
        blank = ("about:blank", "Failed to load resource: net::ERR_FAILED")
        self.page.on("requestfailed", lambda request: request.url not in blank and self.failed.append(request.url))
        self.page.on("console", lambda message: message.type == "error" and not message.text.startswith(blank)
                     and "font at 'about:blank'" not in message.text and self.errors.append(message.text))

    def __enter__(self):
        return self

    def __exit__(self, kind, *exc):
        if kind is not None:  # what the page looked like when the test failed
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=ARTIFACTS / f"failed_{self.name}.png")
        self.context.close()


@pytest.fixture(scope="module")
def decks(tmp_path_factory):
    out = tmp_path_factory.mktemp("decks")
    return dict(zip([p.stem for p in NOTEBOOKS], build_decks(NOTEBOOKS, out)))


def slide_cells(path):
    """The cells of a notebook that reveal.js shows: everything but skipped cells and hidden solutions."""
    cells = nbformat.read(path, as_version=4).cells
    return [c for c in cells if c.metadata.get("slideshow", {}).get("slide_type") != "skip"
            and "solution" not in c.metadata.get("tags", [])]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_deck_works_offline(browser, decks, path):
    deck = decks[path.stem]
    cells = slide_cells(path)
    with Visit(browser, lambda url: url.startswith(("file://", "data:")), f"deck_{path.stem}") as visit:
        page = visit.page
        page.goto(deck.as_uri())
        page.wait_for_function("() => window.Reveal && Reveal.isReady()", timeout=60_000)

        # reveal.js made slides: one horizontal slide per title or `##` section, sub-slides below them
        sections = sum(c.metadata["slideshow"]["slide_type"] == "slide" for c in cells)
        assert page.evaluate("Reveal.getHorizontalSlides().length") == sections
        subslides = sum(c.metadata["slideshow"]["slide_type"] in ("slide", "subslide") for c in cells)
        assert page.evaluate("Reveal.getTotalSlides()") == subslides

        # the keyboard moves through it, as a lecturer's clicker does
        first = page.evaluate("Reveal.getIndices()")
        page.keyboard.press("ArrowRight")  # the next fragment, or the next slide where there is none
        assert page.evaluate("Reveal.getIndices()") != first
        page.keyboard.press("End")
        assert page.evaluate("Reveal.getIndices().h") == sections - 1
        page.keyboard.press("Home")
        assert page.evaluate("Reveal.getIndices().h") == 0

        # MathJax typeset every formula of the markdown cells: no raw $...$ LaTeX is left in their text
        page.wait_for_selector("body[data-math-typeset='done']", state="attached", timeout=60_000)
        has_math = any(c.cell_type == "markdown" and re.search(r"\$[^$\s][^$]*\$", c.source) for c in cells)
        typeset = page.evaluate("document.querySelectorAll('.jp-MarkdownCell script[type^=\"math/tex\"]').length")
        assert (typeset > 0) == has_math, f"{deck.name}: {typeset} formulas typeset"
        text = page.evaluate("[...document.querySelectorAll('.jp-MarkdownCell')].map(c => c.textContent).join(' ')")
        raw = re.findall(r"\$\\?[A-Za-z_^{}\\ ]{1,40}\$", text)
        assert not raw, f"{deck.name}: LaTeX left untypeset: {raw[:5]}"
        assert page.evaluate("document.querySelectorAll('.MathJax_Error, merror').length") == 0

        # every image loaded: embedded figures from markdown and the plots among the outputs
        images = page.evaluate("[...document.images].map(i => [i.complete && i.naturalWidth > 0, i.alt])")
        assert all(ok for ok, _ in images), f"{deck.name}: broken images {[alt for ok, alt in images if not ok]}"
        if path.stem == "00_overview":  # the course's overview figure, an SVG from images/
            assert any("GPT-2 overview" in alt for _, alt in images)

        # hidden exercise solutions stayed out of the deck
        hidden = [c.source for c in nbformat.read(path, as_version=4).cells
                  if "solution" in c.metadata.get("tags", [])]
        html = deck.read_text(encoding="utf-8")
        assert not [s for s in hidden if s.strip()[:60] in html], f"{deck.name}: a hidden solution is in the deck"

        assert visit.blocked == [], f"{deck.name} asked the network for {visit.blocked}"
        assert visit.failed == [], f"{deck.name}: files that failed to load: {visit.failed}"
        assert visit.errors == [], f"{deck.name}: console errors {visit.errors}"

        if path.stem in ("00_overview", "05_attention"):
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            for number in range(1, 4):
                page.evaluate(f"Reveal.slide({number - 1}, 0)")
                page.wait_for_timeout(600)  # the slide transition
                page.screenshot(path=ARTIFACTS / f"deck_{path.stem}_slide{number}.png")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """A JupyterLab server on a free loopback port, serving a folder with one small notebook."""
    folder = tmp_path_factory.mktemp("lab")
    cells = [nbformat.v4.new_markdown_cell("# Smoke test\n\nThe course's config, imported: $d_{model}$"),
             nbformat.v4.new_code_cell("from course_lib.config import GPTConfig\nprint(GPTConfig().emb_dim * 7)")]
    notebook = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    mark_slides(notebook)  # the slide types and RISE settings every course notebook carries
    nbformat.write(notebook, folder / "smoke.ipynb")
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(folder / ".runtime"), "JUPYTER_CONFIG_DIR": str(folder / ".config")}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--ServerApp.port={port}",
         "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={folder}",
         "--ServerApp.allow_root=True",  # CI machines often run as root
         # nothing that asks PyPI or jupyter.org: no update check, no news, no extension manager
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.news_url=None",
         "--LabApp.extension_manager=readonly"],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as answer:
                json.load(answer)
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"JupyterLab did not start:\n{server.stdout.read()[-3000:]}")
            time.sleep(0.5)
    yield url, token
    server.terminate()
    server.wait(timeout=30)


def test_jupyterlab_opens_a_notebook_and_runs_a_cell(browser, jupyterlab):
    url, token = jupyterlab
    with Visit(browser, lambda u: u.startswith((url, "data:", "blob:")), "jupyterlab") as visit:
        page = visit.page
        page.goto(f"{url}/lab/tree/smoke.ipynb?token={token}")
        page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=90_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
        # JupyterLab may ask which kernel to start ("Select Kernel"), at once or when the first run is asked for
        # while it is still connecting, and drop that run: accept its choice and run again, as a person would.
        prompt, dialog = page.locator(".jp-CodeCell .jp-InputPrompt").first, page.locator(".jp-Dialog")
        for _ in range(10):
            if dialog.count():
                dialog.locator("button.jp-mod-accept").click()
                dialog.wait_for(state="detached", timeout=30_000)
            page.locator(".jp-CodeCell .cm-content").first.click()
            page.keyboard.press("Control+Enter")  # run the cell and stay on it
            try:
                page.wait_for_function("p => /\\[[0-9*]+\\]/.test(p.textContent)", arg=prompt.element_handle(),
                                       timeout=10_000)
                break
            except PlaywrightTimeout:
                continue
        output = page.locator(".jp-CodeCell .jp-OutputArea-output").first
        output.wait_for(timeout=90_000)
        assert output.inner_text().strip() == "5376"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=ARTIFACTS / "jupyterlab.png")
        # RISE's button, which opens the notebook as slides, is in the notebook's toolbar
        assert page.locator("[data-jp-item-name='RISE-button'] [data-command='RISE:preview']").count() == 1
        assert visit.blocked == [], f"JupyterLab asked the network for {visit.blocked}"


def test_rise_presents_the_notebook_live(browser, jupyterlab):
    url, token = jupyterlab
    with Visit(browser, lambda u: u.startswith((url, "data:", "blob:")), "rise") as visit:
        page = visit.page
        page.goto(f"{url}/rise/smoke.ipynb?token={token}")
        page.wait_for_selector(".reveal .slides section", timeout=90_000)
        assert "smoke test" in page.locator(".reveal .slides").inner_text().lower()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=ARTIFACTS / "rise.png")
        assert visit.blocked == [], f"RISE asked the network for {visit.blocked}"

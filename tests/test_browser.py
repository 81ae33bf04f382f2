"""What a lecturer sees, checked in a real browser with the network cut: the offline slide decks, JupyterLab
running a lesson to its figures, and RISE presenting the lesson live.

Chromium comes from the system's packages (`apt-get install -y chromium` on Debian/Ubuntu; `.ci/run` installs it
when missing); Playwright, from requirements.txt, drives it. Where no Chromium is found these tests are skipped
with that instruction, unless COURSE_REQUIRE_BROWSER=1 (as in .ci/run), where they fail. Set COURSE_CHROMIUM to
use another Chromium or Chrome binary. Screenshots of the decks' first slides, of the lesson in JupyterLab and of
its RISE slides are written to build/artifacts/ (a set is kept in docs/screenshots/)."""

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from build_decks import build_decks  # noqa: E402

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

    def __init__(self, browser, allowed, name, zoom=1.0):
        self.name = name
        # a 1280 x 800 screen (a projector's), the page zoomed in by `zoom` as a browser's Ctrl + does
        self.context = browser.new_context(viewport={"width": round(1280 / zoom), "height": round(800 / zoom)},
                                           device_scale_factor=zoom)
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


# The lesson the JupyterLab and RISE tests open: it runs in seconds and draws its first figure (GELU against ReLU)
# on its third slide. The tests open copies without outputs, so every figure they see was drawn in this run.
LESSON = ROOT / "notebooks" / "04_gelu_feedforward.ipynb"
ZOOM = 1.25  # the lecture's pages, zoomed in as a lecturer does for the back of the hall
STDERR = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"  # errors, tracebacks, warnings


def lesson_facts(path):
    """The lesson's title, its number of code cells that show their code (a hidden solution shows no prompt), its
    number of figures shown (not those of a worked answer, whose output is folded) and the first line of the cell
    that draws the first one, as committed."""
    cells = nbformat.read(path, as_version=4).cells
    code = [c for c in cells if c.cell_type == "code"]
    shown = [c for c in code if not c.metadata.get("jupyter", {}).get("source_hidden")]
    drawn = [c for c in code if any("image/png" in o.get("data", {}) for o in c.outputs)
             and not c.metadata.get("jupyter", {}).get("outputs_hidden")]  # a worked answer's figure stays folded
    assert drawn, f"{path.name} draws no figure: choose another lesson for the browser tests"
    title = next(c for c in cells if c.cell_type == "markdown").source.splitlines()[0].lstrip("# ").strip()
    return title, len(shown), len(drawn), drawn[0].source.splitlines()[0]


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """A JupyterLab server on a free loopback port, serving two copies of the lesson without outputs: lab/ for
    JupyterLab, slides/ for RISE (each with its own kernel). The committed notebook is never opened."""
    folder = tmp_path_factory.mktemp("lab")
    notebook = nbformat.read(LESSON, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    for sub in ("lab", "slides"):
        (folder / sub).mkdir()
        nbformat.write(notebook, folder / sub / LESSON.name)
    # No "get notified about Jupyter news?" toast over the lesson (news_url=None already stops the request)
    settings = folder / ".config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(folder / ".runtime"), "JUPYTER_CONFIG_DIR": str(folder / ".config"),
           "JUPYTERLAB_SETTINGS_DIR": str(folder / ".config" / "lab" / "user-settings"),
           # The kernels inherit these: one thread, as nbval's kernels, and a fresh IPython profile, as on a
           # learner's machine (not the test session's, whose figure check nbval applies to every notebook).
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "IPYTHONDIR": str(folder / ".ipython")}
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


def kernel_idle(url, token, path, timeout=90):
    """Wait until the server has a kernel for the notebook at `path` and that kernel is idle."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/api/sessions?token={token}", timeout=5) as answer:
            states = [s["kernel"]["execution_state"] for s in json.load(answer) if s["path"] == path]
        if states == ["idle"]:
            return
        time.sleep(0.5)
    pytest.fail(f"no idle kernel for {path} after {timeout} s")


def figure_shown(page, image):
    """Scroll a figure into view and return its PNG source and its size as drawn, once it has loaded."""
    image.scroll_into_view_if_needed()
    page.wait_for_function("i => i.complete && i.naturalWidth > 0", arg=image.element_handle(), timeout=30_000)
    return image.evaluate("i => [i.src.slice(0, 22), i.naturalWidth, i.getBoundingClientRect().width]")


def test_jupyterlab_runs_a_lesson_and_draws_its_figures(browser, jupyterlab):
    url, token = jupyterlab
    title, n_code, n_figures, _ = lesson_facts(LESSON)
    with Visit(browser, lambda u: u.startswith((url, "data:", "blob:")), "jupyterlab", zoom=ZOOM) as visit:
        page = visit.page
        page.goto(f"{url}/lab/tree/lab/{LESSON.name}?token={token}")
        page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=90_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
        assert page.locator(".jp-Notebook h1").first.text_content().startswith(title)
        assert page.locator(".jp-Notebook .jp-OutputArea-output img").count() == 0  # the copy has no outputs
        # Run > Run All Cells, from the menu as a lecturer does. JupyterLab may ask which kernel to start ("Select
        # Kernel"), at once or when a run is asked for while it is still connecting, and drop that run: accept its
        # choice and ask again, as a person would.
        prompt, dialog = page.locator(".jp-CodeCell .jp-InputPrompt").first, page.locator(".jp-Dialog")
        for _ in range(10):
            if dialog.count():
                dialog.locator("button.jp-mod-accept").click()
                dialog.wait_for(state="detached", timeout=30_000)
            try:
                page.get_by_role("menuitem", name="Run", exact=True).click(timeout=10_000)
                page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click(timeout=10_000)
                page.wait_for_function("p => /\\[[0-9*]+\\]/.test(p.textContent)", arg=prompt.element_handle(),
                                       timeout=10_000)
                break
            except PlaywrightTimeout:
                continue
        # the last code cell that shows its code ran (a hidden answer cell's prompt stays empty; Run All stops at
        # the first error, so wait for that too), none shows an error, and every code cell that shows its code has
        # a number
        page.wait_for_function(
            """s => document.querySelector(s) || /\\[[0-9]+\\]/.test(
                   [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
                   .filter(p => p.textContent.trim()).at(-1).textContent)""",
            arg=STDERR, timeout=120_000)
        errors = page.locator(STDERR)
        assert errors.count() == 0, f"{LESSON.name}: a cell shows an error:\n{errors.first.text_content()[-2000:]}"
        prompts = [t.strip() for t in page.locator(".jp-CodeCell .jp-InputPrompt").all_text_contents() if t.strip()]
        assert len(prompts) == n_code and all(re.fullmatch(r"\[[0-9]+\]:", t) for t in prompts), prompts
        # every figure the lesson draws was drawn again here, as a PNG image in the notebook; a worked answer's
        # folded output may be in the page too, not shown (display: none): only the images shown count
        images = page.locator(".jp-Notebook .jp-OutputArea-output img:visible")
        assert images.count() == n_figures
        source, natural, drawn = figure_shown(page, images.first)
        assert source == "data:image/png;base64," and natural > 500 and drawn > 500
        page.keyboard.press("Control+b")  # hide the file browser, as a lecturer does, to give the figure the room
        page.wait_for_timeout(500)  # the panel's animation
        images.first.evaluate("i => i.scrollIntoView({block: 'end'})")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=ARTIFACTS / f"jupyterlab_{LESSON.stem}.png")
        # RISE's button, which opens the notebook as slides, is in the notebook's toolbar
        assert page.locator("[data-jp-item-name='RISE-button'] [data-command='RISE:preview']").count() == 1
        assert visit.blocked == [], f"JupyterLab asked the network for {visit.blocked}"


def test_rise_presents_the_lesson_live(browser, jupyterlab):
    url, token = jupyterlab
    title, _, _, figure_line = lesson_facts(LESSON)
    with Visit(browser, lambda u: u.startswith((url, "data:", "blob:")), "rise", zoom=ZOOM) as visit:
        page = visit.page
        page.goto(f"{url}/rise/slides/{LESSON.name}?token={token}")
        page.wait_for_selector(".reveal .slides section.present .jp-Cell", timeout=90_000)
        # the first slide is the lesson's title slide
        assert page.locator(".reveal .slides section.present h1").first.text_content().startswith(title)
        assert page.locator(".reveal .jp-OutputArea-output img").count() == 0  # the copy has no outputs
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=ARTIFACTS / f"rise_{LESSON.stem}_title.png")

        # The lecturer runs the lesson from the slides: Shift+Enter runs the selected cell and moves on, slide after
        # slide, up to the cell that draws the first figure; Space shows that cell (a fragment), Ctrl+Enter runs it
        # where it stands.
        kernel_idle(url, token, f"slides/{LESSON.name}")
        page.locator(".reveal .slides section.present .jp-MarkdownCell").first.click()
        selected = "() => document.querySelector('.jp-Cell.jp-mod-selected')?.textContent ?? ''"
        for _ in range(40):
            if figure_line in page.evaluate(selected):
                break
            before = page.evaluate(selected)
            page.keyboard.press("Shift+Enter")
            page.wait_for_function(f"b => ({selected})() !== b", arg=before, timeout=30_000)
        else:
            pytest.fail(f"Shift+Enter never reached the cell that starts with {figure_line!r}")
        cell = page.locator(".reveal .slides section.present .jp-CodeCell.jp-mod-selected")
        if not cell.is_visible():  # a fragment not shown yet
            page.keyboard.press("Space")
            cell.wait_for(state="visible")
        page.keyboard.press("Control+Enter")
        # the cell ran (its number comes once all its outputs are in) or a cell shows an error
        page.wait_for_function("([p, s]) => document.querySelector(s) || /\\[[0-9]+\\]/.test(p.textContent)",
                               arg=[cell.locator(".jp-InputPrompt").element_handle(), STDERR], timeout=90_000)
        errors = page.locator(STDERR)
        assert errors.count() == 0, f"{LESSON.name}: a cell shows an error:\n{errors.first.text_content()[-2000:]}"
        figure = page.locator(".reveal .slides section.present .jp-CodeCell", has_text=figure_line).locator(
            ".jp-OutputArea-output img")
        assert figure.count() == 1, f"the cell that starts with {figure_line!r} drew no figure on its slide"
        source, natural, drawn = figure_shown(page, figure)
        assert source == "data:image/png;base64," and natural > 500 and drawn > 500

        # RISE makes a slide taller than the screen scrollable when the slide is entered, not when an output makes
        # it taller: step to the next slide and back, as a lecturer does, and scroll down to the figure.
        page.keyboard.press("ArrowRight")
        figure.wait_for(state="detached")
        for _ in range(5):  # a key pressed during the slide transition may be lost
            page.keyboard.press("ArrowLeft")
            try:
                figure.wait_for(state="attached", timeout=3_000)
                break
            except PlaywrightTimeout:
                continue
        else:
            pytest.fail("ArrowLeft did not go back to the figure's slide")
        settled = "() => document.getAnimations().every(a => a.playState !== 'running')"  # the slide transition
        page.wait_for_function(settled, timeout=10_000)
        screen = page.viewport_size
        page.mouse.move(screen["width"] / 2, screen["height"] / 2)
        box = figure.bounding_box()
        page.mouse.wheel(0, box["y"] + box["height"] - screen["height"] + 10)
        page.wait_for_function("i => { const r = i.getBoundingClientRect(); return r.top >= 0 && r.bottom <= "
                               "innerHeight; }", arg=figure.element_handle(), timeout=10_000)
        page.wait_for_function(settled, timeout=10_000)
        page.screenshot(path=ARTIFACTS / f"rise_{LESSON.stem}_figure.png")
        assert visit.blocked == [], f"RISE asked the network for {visit.blocked}"

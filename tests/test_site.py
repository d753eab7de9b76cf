"""The site (tools/build_site.py) as a reader sees it: every page opened in a real headless browser.

Builds the site from the committed notebooks into a temporary folder, serves it on 127.0.0.1 and opens
every page in Debian's chromium, driven by playwright (never `playwright install`: no browser is
downloaded). Checks: a build without Sphinx warnings, no console error, no failed request, no broken
internal link (every internal href/src answers 200, every #anchor exists), every image loaded, every
notebook page showing as many plots as its notebook has image outputs, and a landing page that names
the GPU whose outputs the notebook pages show.
"""
from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - CI installs it with the test extras
    sync_playwright = None

needs_browser = pytest.mark.skipif(
    sync_playwright is None or not Path(CHROMIUM).exists(),
    reason="the browser test needs playwright (pip install -e '.[test]') and Debian's chromium "
           "(apt-get install -y chromium); .ci/run installs both")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(site folder, staged sources, build log) of a fresh build: a fresh one reports every warning.

    Under pytest-xdist the workers share one build (the first builds it, under a lock), so that the
    site is not built once per worker that runs a test of this file."""
    import fcntl
    import os

    shared = os.environ.get("PYTEST_XDIST_WORKER") is not None
    tmp = (tmp_path_factory.getbasetemp().parent / "site_build") if shared else tmp_path_factory.mktemp("site")
    tmp.mkdir(exist_ok=True)
    with open(tmp / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        log = tmp / "build.log"
        if not log.exists():
            done = subprocess.run([sys.executable, str(ROOT / "tools" / "build_site.py"), "--out", str(tmp / "site"),
                                   "--stage", str(tmp / "src")], cwd=ROOT, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stdout + done.stderr
            log.write_text(done.stderr)
    return tmp / "site", tmp / "src", log.read_text()


@pytest.fixture(scope="module")
def server(site):
    handler = functools.partial(_QuietHandler, directory=str(site[0]))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_build_has_no_warnings(site):
    warnings = [line for line in site[2].splitlines() if "WARNING" in line or "ERROR" in line]
    assert not warnings, "\n".join(warnings)


def test_site_has_every_page(site):
    out, src, _ = site
    for nb in [*src.glob("notebooks/*.ipynb"), *src.glob("notebooks/solutions/*.ipynb")]:
        assert (out / nb.relative_to(src)).with_suffix(".html").exists(), nb.name
    for name in ("index", "docs/results", "docs/instructors", "docs/DEVELOPING"):
        assert (out / f"{name}.html").exists(), name


def _image_outputs(nb_path: Path) -> int:
    nb = json.loads(nb_path.read_text())
    return sum(1 for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
               if any(k.startswith("image/") for k in o.get("data", {})))


def _results_gpu(src: Path) -> str:
    """The GPU the landing page must name: the one notebook 07 ran on (the landing page plots its summary,
    so the plot and 07's page agree), else the one most notebooks' outputs name."""
    names, summary = Counter(), None
    for nb in sorted(src.glob("notebooks/*.ipynb")):
        on = json.loads(nb.read_text()).get("metadata", {}).get("nf4lab", {}).get("executed_on") or ""
        if on and not on.startswith("mode=") and "simulator" not in on:
            names[on.split(" (")[0]] += 1
            summary = on.split(" (")[0] if nb.name.startswith("07_") else summary
    assert names, "no committed notebook says which GPU its outputs come from"
    return summary or names.most_common(1)[0][0]


_LINKS_JS = """() => {
  const urls = [];
  for (const [sel, attr] of [["a[href]", "href"], ["img[src]", "src"], ["link[href]", "href"], ["script[src]", "src"]])
    for (const el of document.querySelectorAll(sel)) urls.push(el[attr]);
  return urls;
}"""
_IMAGES_JS = """() => Array.from(document.images).map(i => ({src: i.currentSrc || i.src, ok: i.complete && i.naturalWidth > 0,
  output: !!i.closest('.cell_output')}))"""


@needs_browser
def test_every_page_in_chromium(site, server):
    out, src, _ = site
    pages = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html") if "_static" not in p.parts)
    plots = {p.relative_to(src).with_suffix(".html").as_posix(): _image_outputs(p)
             for p in src.glob("notebooks/**/*.ipynb")}
    gpu = _results_gpu(src)
    status: dict[str, int] = {}
    html: dict[str, str] = {}
    problems: list[str] = []

    def fetch(url: str) -> int:
        if url not in status:
            try:
                with urllib.request.urlopen(url, timeout=30) as r:
                    status[url], html[url] = r.status, r.read().decode("utf-8", "replace")
            except urllib.error.HTTPError as e:
                status[url] = e.code
        return status[url]

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url} ({r.failure})"))
        page.on("response", lambda r: errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
        for name in pages:
            errors.clear()
            page.goto(server + name, wait_until="load")
            page.wait_for_load_state("networkidle")
            problems += [f"{name}: {e}" for e in errors]
            for url in page.evaluate(_LINKS_JS):
                if not url.startswith(server):
                    continue
                target, _, anchor = url.partition("#")
                if fetch(target) != 200:
                    problems.append(f"{name}: broken link {url} (HTTP {status[target]})")
                elif anchor and target.endswith(".html") and \
                        f'id="{urllib.parse.unquote(anchor)}"' not in html[target]:
                    problems.append(f"{name}: link to a missing anchor {url}")
            images = page.evaluate(_IMAGES_JS)
            problems += [f"{name}: image not shown {i['src']}" for i in images if not i["ok"]]
            shown = sum(1 for i in images if i["ok"] and i["output"])
            if name in plots and shown < plots[name]:
                problems.append(f"{name}: {shown} plots shown, its notebook has {plots[name]} image outputs")
            if name == "index.html":
                text = page.inner_text("body")
                if gpu not in text:
                    problems.append(f"index.html does not name the GPU of the results shown ({gpu})")
                if not any(i["ok"] and "gbps" in i["src"] for i in images):
                    problems.append("index.html does not show the GB/s plot")
        browser.close()
    assert not problems, "\n".join(problems)

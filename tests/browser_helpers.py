"""Shared by tests/test_browser.py and tools/screenshots.py: the built book, its pages, a local server, Chromium.

The book is read from ``POSENC_BOOK_HTML`` (default ``_build/html``, where ``make book`` writes it) and served on
127.0.0.1 at a free port. Chromium is Debian's (``POSENC_CHROMIUM``, default ``/usr/bin/chromium``), driven by
Playwright: ``playwright install`` cannot download browsers everywhere this runs, so none is downloaded.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent

# Without the background-networking flags Chromium reaches out to Google hosts on its own. Every request beyond
# this machine goes to a proxy on a closed local port (DEAD_PROXY) and fails there, in the browser itself:
# Chromium sends loopback addresses (the book's server) direct, whatever the proxy. (The pages used to route
# every request through Playwright to abort the external ones, a round trip to this process per request.)
DEAD_PROXY = "127.0.0.1:9"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    f"--proxy-server=http://{DEAD_PROXY}",
]
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


def book_html_dir() -> Path:
    """The folder of the built HTML book: ``$POSENC_BOOK_HTML`` or ``_build/html``."""
    return Path(
        os.environ.get("POSENC_BOOK_HTML") or ROOT / "_build" / "html"
    ).resolve()


def chromium_path() -> str | None:
    """Debian's Chromium (``$POSENC_CHROMIUM`` or ``/usr/bin/chromium``), or None when it is not installed."""
    candidate = os.environ.get("POSENC_CHROMIUM") or "/usr/bin/chromium"
    return shutil.which(candidate)


def toc_pages(toc: Path = ROOT / "_toc.yml") -> list[str]:
    """Every document of the table of contents, in reading order (``book/intro``, ``book/01_derivation``, ...)."""
    data = yaml.safe_load(toc.read_text(encoding="utf-8"))
    pages = [data["root"]]

    def walk(node: dict[str, Any]) -> None:
        if "file" in node:
            pages.append(node["file"])
        for key in ("parts", "chapters", "sections"):
            for child in node.get(key) or []:
                walk(child)

    walk(data)
    return [page.removesuffix(".md").removesuffix(".ipynb") for page in pages]


def html_path(docname: str) -> str:
    """The page's path relative to the book's root: ``book/intro`` -> ``book/intro.html``."""
    return f"{docname}.html"


def book_missing_reason() -> str | None:
    """Why there is no built book to check, or None."""
    if not (book_html_dir() / "index.html").is_file():
        return f"no built book at {book_html_dir()} (run `make book`, or set POSENC_BOOK_HTML)"
    return None


def browser_missing_reason() -> str | None:
    """Why no browser can be driven here (no Playwright, no Chromium), or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (it is pinned in requirements.txt)"
    if chromium_path() is None:
        where = os.environ.get("POSENC_CHROMIUM") or "/usr/bin/chromium"
        return f"Chromium not found at {where} (apt-get install -y chromium, or set POSENC_CHROMIUM)"
    return None


def unavailable(reason: str) -> None:
    """Skip, or fail where ``CI`` is set: CI must run the browser checks, never skip them."""
    import pytest

    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{reason} -- CI is set, so the browser tests must run")
    pytest.skip(reason)


def missing_reason() -> str | None:
    """Why the browser checks cannot run here (no Playwright, no Chromium, no built book), or None."""
    return browser_missing_reason() or book_missing_reason()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` over HTTP on 127.0.0.1 at a free port, in a thread; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def launch_chromium(playwright: Any) -> Any:
    """A headless Debian Chromium, with every flag that keeps it from reaching the network on its own."""
    return playwright.chromium.launch(
        executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True
    )


def is_local(url: str) -> bool:
    """True for the book's own server (and for data:, blob: and about: URLs, which make no request)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme in ("data", "blob", "about"):
        return True
    return parts.hostname in ("127.0.0.1", "localhost")


# Waits until MathJax (loaded with `defer`) has typeset the page; resolves at once on pages without it.
WAIT_FOR_MATHJAX = """async () => {
  for (let i = 0; i < 100 && !(window.MathJax && window.MathJax.startup && window.MathJax.startup.promise); i++) {
    if (!document.querySelector('script[src*="mathjax"]')) return false;
    await new Promise(r => setTimeout(r, 50));
  }
  if (window.MathJax && window.MathJax.startup && window.MathJax.startup.promise) {
    await window.MathJax.startup.promise;
    return true;
  }
  return false;
}"""

"""Shared by tests/book/test_browser.py and tools/screenshots.py: the built book, its pages, a local server, Chromium.

The book is read from ``POSENC_BOOK_HTML`` (default ``_build/html``, where ``make book`` writes it) and served on
127.0.0.1 at a free port. Chromium is Debian's (``POSENC_CHROMIUM``, default ``/usr/bin/chromium``), driven by
Playwright: ``playwright install`` cannot download browsers everywhere this runs, so none is downloaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]

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
#: The theme's column at each width (px, the article's content box; tests/book/test_layout.py measures it), the width
#: a figure's image gets in it (the figure's 8 px side padding is dropped on a phone, book/_static/posenc.css),
#: and how tall a figure's smallest text must read there (px as displayed): 10 px on a desktop, 8 px on a phone.
COLUMN_PX = {"desktop": 688, "phone": 358}
FIGURE_PX = {"desktop": 672, "phone": 358}
MIN_TEXT_PX = {"desktop": 10.0, "phone": 8.0}
#: A table cell of at most this many characters ("5 of 5", "0.51× (0.45–0.54)") must not wrap over lines
#: (tests/book/test_layout.py; book/_ext/table_reflow.py estimates table widths with the same limit).
SHORT_CELL = 20
#: The figure style every notebook applies in its first code cell (tests/book/test_figure_style.py).
FIGURE_STYLE = ROOT / "book" / "posenc.mplstyle"


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


@dataclasses.dataclass(frozen=True)
class FigureStyle:
    """What book/posenc.mplstyle fixes about a stored figure: its widest size, resolution and smallest text."""

    width_in: float  # figure.figsize's width
    dpi: float  # figure.dpi (IPython's inline backend saves at the figure's dpi)
    savefig_dpi: float
    pad_in: float  # savefig.pad_inches: the margin the inline backend's tight bounding box adds on each side
    font_pt: float  # font.size: what a relative size ("small") is relative to
    min_font_pt: float  # the smallest text size the style sets (font.size and every *labelsize, *titlesize, ...)
    min_font_key: str  # which setting it is

    @property
    def min_font_px(self) -> float:
        """The smallest text's height in pixels of the stored PNG (points at ``dpi``)."""
        return self.min_font_pt * self.dpi / 72

    @property
    def max_png_width(self) -> float:
        """The widest PNG a figure of the style stores: its width plus the tight bounding box's two margins."""
        return (self.width_in + 2 * self.pad_in) * self.dpi


def font_size_pt(value: Any, base: float) -> float:
    """A matplotlib font size in points: a number, or a name ("small", "x-large") relative to ``base``."""
    from matplotlib.font_manager import font_scalings

    if isinstance(value, str) and value in font_scalings:
        return font_scalings[value] * base
    return float(value)


def font_size_keys(params: Any) -> list[str]:
    """The rcParams that set a text size: font.size and every ``*labelsize``, ``*titlesize``, ``*fontsize``."""
    return [
        key
        for key in params
        if key == "font.size" or key.endswith(("labelsize", "titlesize", "fontsize"))
    ]


@functools.cache
def figure_style(path: Path = FIGURE_STYLE) -> FigureStyle:
    """Read ``path`` as matplotlib does (its settings over matplotlib's defaults): the smallest font is the
    minimum over every text-size setting, a name such as "large" taken relative to font.size, and a setting left
    at None (legend.title_fontsize) following font.size."""
    import matplotlib

    params = matplotlib.rc_params_from_file(str(path), use_default_template=True)
    base = float(params["font.size"])
    sizes = {
        key: font_size_pt(params[key], base) if params[key] is not None else base
        for key in font_size_keys(params)
    }
    key = min(sizes, key=sizes.__getitem__)
    savefig_dpi = params["savefig.dpi"]
    return FigureStyle(
        width_in=float(params["figure.figsize"][0]),
        dpi=float(params["figure.dpi"]),
        savefig_dpi=float(
            params["figure.dpi"] if savefig_dpi == "figure" else savefig_dpi
        ),
        pad_in=float(params["savefig.pad_inches"]),
        font_pt=base,
        min_font_pt=sizes[key],
        min_font_key=key,
    )

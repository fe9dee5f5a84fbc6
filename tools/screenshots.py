"""Screenshot every page of the built book at desktop and phone width, in light and dark mode, to look at.

    .venv/bin/python tools/screenshots.py                      # _build/html -> /tmp/posenc-screenshots
    .venv/bin/python tools/screenshots.py --book /tmp/b/_build/html --out /tmp/shots --pages book/intro --tiles

Pages are those of ``_toc.yml`` (plus the search page), served on 127.0.0.1 and rendered by Debian's Chromium
(see tests/book/browser_helpers.py). Each page is saved whole (``NN_page.desktop.light.png``); with ``--tiles`` also
one screen at a time (``...tile03.png``), which is easier to read than a very tall image. Dark mode is the
reader's system preference (``prefers-color-scheme: dark``), which the theme follows in its default "auto" mode.
Prints one line per page: its height, anything wider than the screen (which makes a phone scroll sideways), and
the figures whose smallest text reads under tests/book/test_layout.py's bar at that width (derived from
book/posenc.mplstyle's smallest font and the image's displayed scale).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.book.browser_helpers import (  # noqa: E402 (the repository root is put on the path first)
    DESKTOP,
    MIN_TEXT_PX,
    PHONE,
    SHORT_CELL,
    WAIT_FOR_MATHJAX,
    book_html_dir,
    browser_missing_reason,
    figure_style,
    html_path,
    launch_chromium,
    serve,
    toc_pages,
)
from tests.book.browser_pages import MEASURE  # noqa: E402

# Elements of the article wider than the viewport (they make the page scroll sideways on a phone).
OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const wide = [];
  for (const el of document.querySelectorAll('article *')) {
    const box = el.getBoundingClientRect();
    if (box.right > width + 1 && !el.closest('.highlight, .output, pre, .table-wrapper, .bd-sidebar, mjx-container')) {
      wide.push(el.tagName.toLowerCase() + (el.className ? '.' + String(el.className).split(' ')[0] : ''));
    }
  }
  return {scrollWidth: document.documentElement.scrollWidth, width, wide: [...new Set(wide)].slice(0, 8)};
}"""


def small_figures(layout: dict[str, Any], width: str) -> list[str]:
    """``"Fig. 9 (fig-unit-circle) 7.3 px"`` for each figure whose smallest text reads under the bar at ``width``."""
    style = figure_style()
    found = []
    for image in layout["images"]:
        text_px = image["shown"] / image["natural"] * style.min_font_px
        if text_px < MIN_TEXT_PX[width]:
            found.append(f"{image['name']} {text_px:.1f} px")
    return found


def shoot(
    context: Any, url: str, stem: Path, tiles: bool, width: str
) -> dict[str, Any]:
    """Open ``url``, wait for MathJax and images, save the whole page (and its screens); report overflow and
    figures whose text reads too small."""
    page = context.new_page()
    try:
        page.goto(url, wait_until="load")
        page.evaluate(WAIT_FOR_MATHJAX)
        page.wait_for_load_state("networkidle")
        page.screenshot(path=f"{stem}.png", full_page=True)
        height = page.evaluate("document.documentElement.scrollHeight")
        viewport = page.viewport_size["height"]
        if tiles:
            for index, top in enumerate(range(0, height, viewport)):
                page.evaluate(f"window.scrollTo(0, {top})")
                page.wait_for_timeout(100)
                page.screenshot(path=f"{stem}.tile{index:02d}.png")
        report = page.evaluate(OVERFLOW)
        report["height"] = height
        report["small"] = small_figures(page.evaluate(MEASURE, SHORT_CELL), width)
        return report
    finally:
        page.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--book",
        type=Path,
        default=None,
        help="built HTML (default: $POSENC_BOOK_HTML or _build/html)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("/tmp/posenc-screenshots"),
        help="folder for the PNGs",
    )
    parser.add_argument(
        "--pages",
        nargs="*",
        default=None,
        help="docnames (default: every page of _toc.yml)",
    )
    parser.add_argument(
        "--tiles", action="store_true", help="also save one PNG per screen"
    )
    parser.add_argument(
        "--modes", nargs="*", default=["light", "dark"], choices=["light", "dark"]
    )
    parser.add_argument(
        "--widths",
        nargs="*",
        default=["desktop", "phone"],
        choices=["desktop", "phone"],
    )
    args = parser.parse_args(argv)

    book = (args.book or book_html_dir()).resolve()
    reason = browser_missing_reason()
    if not (book / "index.html").is_file():
        reason = f"no built book at {book} (run `make book`, or pass --book)"
    if reason:
        print(f"cannot take screenshots: {reason}", file=sys.stderr)
        return 2
    docnames = args.pages or toc_pages()
    targets = [
        (f"{index:02d}_{Path(name).name}", html_path(name))
        for index, name in enumerate(docnames)
    ]
    if args.pages is None:
        targets.append((f"{len(targets):02d}_search", "search.html?q=frequencies"))
    args.out.mkdir(parents=True, exist_ok=True)

    from playwright.sync_api import sync_playwright

    with serve(book) as base, sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        for width in args.widths:
            for mode in args.modes:
                viewport = DESKTOP if width == "desktop" else PHONE
                context = browser.new_context(
                    viewport=viewport,
                    color_scheme=mode,
                    device_scale_factor=1 if width == "desktop" else 2,
                    is_mobile=width == "phone",
                    has_touch=width == "phone",
                )
                for stem, path in targets:
                    report = shoot(
                        context,
                        base + path,
                        args.out / f"{stem}.{width}.{mode}",
                        args.tiles,
                        width,
                    )
                    sideways = (
                        f"; wider than the screen ({report['scrollWidth']} > {report['width']} px): {report['wide']}"
                        if report["scrollWidth"] > report["width"]
                        else ""
                    )
                    small = (
                        f"; figure text under {MIN_TEXT_PX[width]:g} px: {report['small']}"
                        if report["small"]
                        else ""
                    )
                    print(
                        f"{stem}.{width}.{mode}: {report['height']} px tall{sideways}{small}"
                    )
                context.close()
        browser.close()
    print(f"screenshots in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

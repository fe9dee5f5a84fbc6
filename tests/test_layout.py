"""Nothing is clipped: the rendered book, measured in a real browser at a desktop and a phone width.

For every page of the table of contents, at 1280 px and at 390 px (``DESKTOP``, ``PHONE`` in browser_helpers):

- **code** (a cell's visible source): fits the column at desktop width, no horizontal scrollbar (the notebooks
  are formatted to 88 columns); on a phone it may scroll, but only inside its own box, never widening the page.
  A folded cell (``hide-input``) is measured when opened by the reader, so not here;
- **outputs** (what a cell printed): fit, or scroll inside their own box (counted, so a change can report them);
- **tables**: fit, or scroll visibly inside their own box (``overflow-x: auto``), at both widths;
- **display equations**: fit or scroll inside their box at both widths, and the equation number never covers
  the equation;
- **the page itself** never scrolls sideways.

Every figure image also has a caption (a ``figcaption``) and is at least 300 px wide at desktop width.
Counts per page are printed (``-s``) so the before/after numbers of a change can be reported.

Without Chromium or a built book these tests skip, saying why; with ``CI`` set they fail instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urljoin

import pytest

from tests.browser_helpers import (
    DESKTOP,
    PHONE,
    WAIT_FOR_MATHJAX,
    book_html_dir,
    html_path,
    launch_chromium,
    missing_reason,
    serve,
    toc_pages,
)

pytestmark = pytest.mark.browser

PAGES = toc_pages()
VIEWPORTS = {"desktop": DESKTOP, "phone": PHONE}

# Measures every element of interest: overflow (scrollWidth > clientWidth), whether its own box scrolls
# (computed overflow-x auto/scroll), and for equations whether the number's box intersects the formula's.
MEASURE = r"""() => {
  const article = document.querySelector('article') || document.body;
  const scrolls = el => {
    for (let e = el; e && e !== article; e = e.parentElement) {
      const o = getComputedStyle(e).overflowX;
      if ((o === 'auto' || o === 'scroll') && e.clientWidth < article.clientWidth + 2) return true;
    }
    return false;
  };
  // a folded cell (hide-input) is not rendered until the reader opens it: nothing of it can overflow the page
  const shown = el => !el.closest('details:not([open])') && el.getClientRects().length > 0
                      && (!el.checkVisibility || el.checkVisibility({visibilityProperty: true}));
  const over = el => shown(el) && el.scrollWidth > el.clientWidth + 1;
  const describe = el => (el.innerText || el.textContent || '').trim().split('\n')[0].slice(0, 70);
  const result = {code: [], codeScroll: [], outputs: [], outputsScroll: [], tables: [], equations: [],
                  numbers: [], page: 0, figures: [], narrowFigures: []};
  for (const pre of article.querySelectorAll('.cell_input pre, div.highlight-python pre, div.highlight-bash pre')) {
    if (over(pre)) { result.code.push(describe(pre)); if (!scrolls(pre)) result.codeScroll.push(describe(pre)); }
  }
  for (const pre of article.querySelectorAll('.cell_output pre, .output pre')) {
    if (over(pre)) { result.outputs.push(describe(pre)); if (!scrolls(pre)) result.outputsScroll.push(describe(pre)); }
  }
  for (const table of article.querySelectorAll('table')) {
    const box = table.parentElement;
    const wide = table.getBoundingClientRect().width > article.clientWidth + 1;
    if (wide && !scrolls(table)) result.tables.push(describe(table));
  }
  for (const math of article.querySelectorAll('div.math')) {
    const formula = math.querySelector('mjx-container');
    if (!formula) continue;
    const wide = formula.getBoundingClientRect().width > math.getBoundingClientRect().width + 1
                 || math.getBoundingClientRect().right > article.getBoundingClientRect().right + 1;
    if (wide && !scrolls(formula)) result.equations.push(describe(math));
    const number = math.querySelector('.eqno');
    const inner = formula.querySelector('mjx-math') || formula;
    if (number) {
      const a = number.getBoundingClientRect(), b = inner.getBoundingClientRect();
      const overlap = Math.min(a.right, b.right) - Math.max(a.left, b.left);
      const vertical = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (overlap > 2 && vertical > 2) result.numbers.push(describe(math));
    }
  }
  result.page = document.documentElement.scrollWidth - document.documentElement.clientWidth;
  for (const img of article.querySelectorAll('img')) {
    if (img.closest('.cell_output') || img.closest('figure')) {
      const figure = img.closest('figure');
      if (!figure || !figure.querySelector('figcaption')) result.figures.push(img.getAttribute('src'));
      if (img.getBoundingClientRect().width < 300) result.narrowFigures.push(img.getAttribute('src'));
    }
  }
  return result;
}"""


@pytest.fixture(scope="module")
def measurements() -> Iterator[dict[tuple[str, str], dict[str, Any]]]:
    """``(viewport, page) -> measurement`` for every page at both widths (one browser, one visit each)."""
    reason = missing_reason()
    if reason:
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"{reason} -- CI is set, so the browser tests must run")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    found: dict[tuple[str, str], dict[str, Any]] = {}
    with serve(book_html_dir()) as base, sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            for name, viewport in VIEWPORTS.items():
                context = browser.new_context(viewport=viewport)
                context.set_default_timeout(20_000)
                for docname in PAGES:
                    page = context.new_page()
                    page.route(
                        "**/*",
                        lambda route: (
                            route.continue_()
                            if route.request.url.startswith(base)
                            else route.abort()
                        ),
                    )
                    page.goto(urljoin(base, html_path(docname)), wait_until="load")
                    page.evaluate(WAIT_FOR_MATHJAX)
                    found[name, docname] = page.evaluate(MEASURE)
                    page.close()
                context.close()
        finally:
            browser.close()
    for (name, docname), m in sorted(found.items()):
        counts = {k: len(v) if isinstance(v, list) else v for k, v in m.items()}
        print(f"layout {name:7s} {docname:28s} {counts}")
    yield found


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
@pytest.mark.parametrize("docname", PAGES)
def test_nothing_is_clipped(measurements: dict, viewport: str, docname: str) -> None:
    m = measurements[viewport, docname]
    assert m["page"] <= 1, f"the page scrolls sideways by {m['page']} px"
    assert not m["tables"], (
        f"tables wider than the column that do not scroll: {m['tables']}"
    )
    assert not m["equations"], (
        f"display equations wider than the column that do not scroll: {m['equations']}"
    )
    assert not m["numbers"], f"equation numbers covering their equation: {m['numbers']}"
    if viewport == "desktop":
        assert not m["code"], (
            f"code cells with a horizontal scrollbar at {DESKTOP['width']} px: {m['code']}"
        )
    else:
        assert not m["codeScroll"], (
            f"code wider than the phone that does not scroll in its box: {m['codeScroll']}"
        )
    # a printed line longer than the column (a long message, a table row) scrolls in its own box
    assert not m["outputsScroll"], (
        f"outputs wider than the column that do not scroll: {m['outputsScroll']}"
    )


@pytest.mark.parametrize("docname", PAGES)
def test_figures_have_captions_and_legible_width(
    measurements: dict, docname: str
) -> None:
    m = measurements["desktop", docname]
    assert not m["figures"], (
        f"figures without a caption (mystnb figure metadata): {m['figures']}"
    )
    assert not m["narrowFigures"], (
        f"figures narrower than 300 px at desktop width: {m['narrowFigures']}"
    )

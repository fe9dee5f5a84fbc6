"""Nothing is clipped and nothing is too small: the rendered book, measured in a real browser at a desktop and a
phone width.

For every page of the table of contents, at 1280 px and at 390 px (``DESKTOP``, ``PHONE`` in browser_helpers), with
every folded cell (``hide-input``, ``hide-cell``) opened as a reader would open it:

- **code** (a cell's source): fits the column at desktop width, no horizontal scrollbar (the notebooks are
  formatted to 88 columns); on a phone it may scroll, but only inside its own box, never widening the page;
- **outputs** (what a cell printed): fit the column at desktop width; on a phone they may scroll in their box;
- **tables**: fit the column at desktop width, every column visible without scrolling; on a phone they may
  scroll visibly inside their own box (``overflow-x: auto``);
- **display equations**: fit the column at both widths (long ones are split over lines, as chapter 01's are),
  and the equation number never covers the equation;
- **figures**: on a phone an image is shown at no less than ``PHONE_FIGURE_SCALE`` of its drawn size (scrolling
  sideways in its own box), so that text drawn at 8 pt or more (tests/test_notebooks.py) stays legible;
- **the page itself** never scrolls sideways.

Every figure image also has a caption (a ``figcaption``) and is at least 300 px wide at desktop width.
Counts per page are printed (``-s``) so the before/after numbers of a change can be reported.

Without Chromium or a built book these tests skip, saying why; with ``CI`` set they fail instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.browser_helpers import DESKTOP, PHONE, html_path, toc_pages

pytestmark = pytest.mark.browser

PAGES = toc_pages()
VIEWPORTS = {"desktop": DESKTOP, "phone": PHONE}
#: On a phone, a figure is shown at no less than this fraction of its drawn size (8 pt text at 100 dpi, 11 px
#: drawn, then reads at 8.9 px or more).
PHONE_FIGURE_SCALE = 0.75


@pytest.fixture(scope="module")
def measurements(visit: Callable[..., Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """``(viewport, page) -> measurement`` for every page at both widths, from the session's one visit per page
    (tests/browser_pages.py: ``MEASURE`` at 1280 px, then with the page resized to 390 px)."""
    found = {
        (name, docname): visit(html_path(docname)).layout[name]
        for docname in PAGES
        for name in VIEWPORTS
    }
    for (name, docname), m in sorted(found.items()):
        counts = {k: len(v) if isinstance(v, list) else v for k, v in m.items()}
        print(f"layout {name:7s} {docname:28s} {counts}")
    return found


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
@pytest.mark.parametrize("docname", PAGES)
def test_nothing_is_clipped(measurements: dict, viewport: str, docname: str) -> None:
    m = measurements[viewport, docname]
    width = VIEWPORTS[viewport]["width"]
    assert m["page"] <= 1, f"the page scrolls sideways by {m['page']} px"
    assert not m["equationsWide"], (
        f"display equations wider than the column at {width} px (split them over lines): "
        f"{m['equationsWide']}"
    )
    assert not m["numbers"], f"equation numbers covering their equation: {m['numbers']}"
    if viewport == "desktop":
        assert not m["code"], (
            f"code wider than the column at {width} px (opened folds included): {m['code']}"
        )
        assert not m["outputs"], (
            f"printed outputs wider than the column at {width} px: {m['outputs']}"
        )
        assert not m["tablesWide"], (
            f"tables wider than the column at {width} px (columns hidden behind a scroll): "
            f"{m['tablesWide']}"
        )
    else:
        assert not m["codeScroll"], (
            f"code wider than the phone that does not scroll in its box: {m['codeScroll']}"
        )
        assert not m["outputsScroll"], (
            f"outputs wider than the phone that do not scroll in their box: {m['outputsScroll']}"
        )
        assert not m["tables"], (
            f"tables wider than the phone that do not scroll in their box: {m['tables']}"
        )


@pytest.mark.parametrize("docname", PAGES)
def test_figures_stay_legible_on_a_phone(measurements: dict, docname: str) -> None:
    small = [
        f"{src} at {scale:.2f}"
        for src, scale in measurements["phone", docname]["figureScales"]
        if scale < PHONE_FIGURE_SCALE
    ]
    assert not small, (
        f"figures shrunk below {PHONE_FIGURE_SCALE} of their drawn size at "
        f"{PHONE['width']} px (their text would be unreadable): {small}"
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

"""Nothing is clipped, nothing is too small: the rendered book, measured in a real browser at a desktop and a
phone width.

For every page of the table of contents, at 1280 px and at 390 px (``DESKTOP``, ``PHONE`` in browser_helpers), with
every folded cell (``hide-input``, ``hide-cell``) opened as a reader would open it. The column (the article's
content box, measured by ``MEASURE`` in tests/book/browser_pages.py) is 688 px wide at 1280 px, of which a figure's
image gets 672 px (the figure's own 8 px side padding); at 390 px it is 358 px, all of it the image's
(book/_static/posenc.css drops the figure's padding there). An output box holds 94 characters of the code font per
line at 1280 px (656 px of 11.52 px DejaVu Sans Mono) and 42 at 390 px (326 px of 12.8 px, where lines wrap).
``test_the_columns_are_as_measured`` keeps the column and figure widths honest.

- **code** (a cell's source): fits the column at desktop width, no horizontal scrollbar (the notebooks are
  formatted to 88 columns); on a phone it may scroll, but only inside its own box, never widening the page;
- **printed outputs**: fit the column at both widths; on a phone and a tablet their lines wrap
  (``white-space: pre-wrap``), so none scrolls, and no HTML output (an animation's player) runs past the column;
- **tables**: no table is wider than the column at either width, and no short cell (at most ``SHORT_CELL`` = 20
  characters, such as "5 of 5") wraps over two lines: on a phone a wide table is shown as one card per row
  (book/_ext/table_reflow.py, posenc.css);
- **display equations**: fit the column at both widths (long ones are split over lines, as chapter 01's are),
  and the equation number never covers the equation;
- **figures**: see ``test_figures_fit_and_stay_legible``;
- **the page itself** never scrolls sideways.

Every figure image also has a caption (a ``figcaption``) and is at least 300 px wide at desktop width.
Counts per page are printed (``-s``) so the before/after numbers of a change can be reported.

Without Chromium or a built book these tests skip, saying why; with ``CI`` set they fail instead.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.book.browser_helpers import (
    COLUMN_PX,
    DESKTOP,
    FIGURE_PX,
    MIN_TEXT_PX,
    PHONE,
    ROOT,
    SHORT_CELL,
    figure_style,
    html_path,
    toc_pages,
)

pytestmark = pytest.mark.browser

PAGES = toc_pages()
VIEWPORTS = {"desktop": DESKTOP, "phone": PHONE}


@pytest.fixture(scope="module")
def measurements(visit: Callable[..., Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """``(viewport, page) -> measurement`` for every page at both widths, from the session's one visit per page
    (tests/book/browser_pages.py: ``MEASURE`` at 1280 px, then with the page resized to 390 px)."""
    found = {
        (name, docname): visit(html_path(docname)).layout[name]
        for docname in PAGES
        for name in VIEWPORTS
    }
    for (name, docname), m in sorted(found.items()):
        counts = {k: len(v) if isinstance(v, list) else v for k, v in m.items()}
        print(f"layout {name:7s} {docname:28s} {counts}")
    return found


def test_the_columns_are_as_measured(measurements: dict) -> None:
    """The widths quoted above (and in posenc.css, posenc.mplstyle and book/_ext/table_reflow.py) are the
    theme's: a theme update that changes them fails here first."""
    for (viewport, docname), m in measurements.items():
        assert abs(m["column"] - COLUMN_PX[viewport]) <= 1, (
            f"{docname}: the column is {m['column']} px at {VIEWPORTS[viewport]['width']} px, not "
            f"{COLUMN_PX[viewport]} px: update COLUMN_PX (tests/book/browser_helpers.py) and the widths quoted with it"
        )
        rooms = {round(i["room"]) for i in m["images"] if i["inFigure"]}
        assert rooms <= {FIGURE_PX[viewport]}, (
            f"{docname}: figures get {sorted(rooms)} px at {VIEWPORTS[viewport]['width']} px, not "
            f"{FIGURE_PX[viewport]} px: update FIGURE_PX (tests/book/browser_helpers.py) and the widths quoted with it"
        )


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
    else:
        assert not m["codeScroll"], (
            f"code wider than the phone that does not scroll in its box: {m['codeScroll']}"
        )


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
@pytest.mark.parametrize("docname", PAGES)
def test_outputs_fit_the_column(
    measurements: dict, viewport: str, docname: str
) -> None:
    """No printed block is wider than its box (at a phone's width its lines wrap, book/_static/posenc.css), and
    no output runs past the column."""
    m = measurements[viewport, docname]
    width = VIEWPORTS[viewport]["width"]
    assert not m["outputs"], (
        f"{docname}: printed outputs wider than the column at {width} px "
        f"({len(m['outputs'])}, first lines): {m['outputs']}"
    )
    assert not m["outputsWide"], (
        f"{docname}: outputs running past the column at {width} px: {m['outputsWide']}"
    )


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
@pytest.mark.parametrize("docname", PAGES)
def test_tables_fit_without_wrapping_short_values(
    measurements: dict, viewport: str, docname: str
) -> None:
    """No table is wider than the column (none hides columns behind a scroll), and no cell of at most
    ``SHORT_CELL`` characters runs over two lines. On a phone a table that would not fit reflows into one card per
    row (book/_ext/table_reflow.py estimates which; this measures the result)."""
    m = measurements[viewport, docname]
    width = VIEWPORTS[viewport]["width"]
    problems = [f"wider than the column: {t}" for t in m["tablesWide"]] + [
        f"a value of at most {SHORT_CELL} characters wrapped over lines: {c}"
        for c in m["wrappedCells"]
    ]
    assert not problems, (
        f"{docname}: tables at {width} px (a table too wide for the phone reflows into cards when "
        f"book/_ext/table_reflow.py estimates it too wide; class posenc-reflow forces it): {problems}"
    )


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
@pytest.mark.parametrize("docname", PAGES)
def test_figures_fit_and_stay_legible(
    measurements: dict, viewport: str, docname: str
) -> None:
    """Every figure image fits the column (it scales to it; nothing scrolls sideways) and its smallest text reads
    at least ``MIN_TEXT_PX`` tall as displayed: 10 px at 1280 px, 8 px at 390 px.

    A PNG's text cannot be read from the page, so the size is derived. Every figure is drawn with
    book/posenc.mplstyle, whose smallest font (read from the style: 10.5 pt today) is that many points at the
    style's dpi (100), 14.6 px in the stored image; the image is shown at ``displayed width / natural width`` of
    that, so its smallest text reads at ``scale * 14.6 px``. Two premises make that the text's real size, and
    tests/book/test_figure_style.py checks both without a browser: every notebook that draws applies the style in its
    first code cell and passes no smaller font size anywhere, and every stored PNG was saved at the style's dpi
    and is no wider than the style's 6.2 in plus the tight bounding box's margins (640 px). This test checks the
    second premise again on the page (a figure wider than 640 px was not drawn with the style), so that a failure
    here names the figure. With the style a figure is at most 640 px wide: unshrunk in the 672 px of a desktop
    column (14.6 px text), and at 358 / 640 = 0.56 or more on a phone (8.2 px text)."""
    style = figure_style()
    bar = MIN_TEXT_PX[viewport]
    width = VIEWPORTS[viewport]["width"]
    problems = []
    for image in measurements[viewport, docname]["images"]:
        scale = image["shown"] / image["natural"]
        text_px = scale * style.min_font_px
        why = []
        if not image["fits"]:
            why.append("wider than the column (scrolls or overflows)")
        if image["natural"] > style.max_png_width + 1:
            why.append(
                f"drawn {image['natural']} px wide, wider than book/posenc.mplstyle's "
                f"{style.max_png_width:.0f} px ({style.width_in} in at {style.dpi:.0f} dpi with margins)"
            )
        if text_px < bar:
            why.append(
                f"shown at {scale:.2f} of its size, its {style.min_font_pt} pt text reads at "
                f"{text_px:.1f} px < {bar} px"
            )
        if why:
            problems.append(f"{image['name']}: {'; '.join(why)}")
    assert not problems, (
        f"{docname}: figures at {width} px ({len(problems)}; redraw them with book/posenc.mplstyle, at most "
        f"{style.width_in} in wide, no text under {style.min_font_pt} pt):\n  "
        + "\n  ".join(problems)
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


# ---- book/_ext/table_reflow.py, without a browser -------------------------------------------------------------


def _table_reflow() -> Any:
    import importlib.util

    path = ROOT / "book" / "_ext" / "table_reflow.py"
    spec = importlib.util.spec_from_file_location("table_reflow", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(
        spec.name, module
    )  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _table(head: list[str], rows: list[list[str]], attrs: str = "") -> str:
    cells = "".join(f"<th>{h}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table{attrs}><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def test_table_reflow_marks_wide_tables_and_short_values() -> None:
    reflow = _table_reflow()
    assert reflow.SHORT_CELL == SHORT_CELL
    wide = _table(
        ["task", "scheme", "seeds", "exact 1..20", "≥ 95 %", "exact 21..40"],
        [["copy", "sinusoidal", "5", "98 [98, 99]", "5 of 5", "0.4 [0.2, 0.5]"]],
        ' class="x"',
    )
    out = reflow.reflow_tables(f"<p>before</p>{wide}<p>after</p>")
    assert out.startswith('<p>before</p><table class="x posenc-reflow">')
    assert '<td class="posenc-short" data-label="≥ 95 %">5 of 5</td>' in out
    assert out.count("posenc-short") == 6 and out.endswith("<p>after</p>")
    # a narrow table stays a table; its short values still keep to one line, long text wraps
    narrow = reflow.reflow_tables(_table(["n", "why"], [["5 of 5", "a sentence " * 6]]))
    assert "posenc-reflow" not in narrow and "data-label" not in narrow
    assert narrow.count("posenc-short") == 1
    # a header row in <tbody> (no <thead>) is marked to hide on a phone; Markdown cells' <p> and math read short
    md = (
        "<table><tr><th><p>a</p></th><th><p>\\(u\\,p\\)</p></th></tr>"
        + "<tr><td><p>x y z</p></td><td><p>\\(2^{-22}\\)</p></td></tr>" * 2
    )
    forced = reflow.reflow_tables(
        md.replace("<table>", '<table class="posenc-reflow">') + "</table>"
    )
    assert forced.startswith('<table class="posenc-reflow" data-header-row>')
    # the label is shown by CSS as plain text: math reads without its TeX markup
    assert forced.count('data-label="up"') == 2
    # asked not to reflow, or cells spanning rows: left a table
    assert "data-label" not in reflow.reflow_tables(
        wide.replace('class="x"', 'class="posenc-no-reflow"')
    )
    assert "data-label" not in reflow.reflow_tables(
        wide.replace("<td>copy</td>", '<td rowspan="2">copy</td>')
    )


def test_the_book_loads_table_reflow() -> None:
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    sphinx = config["sphinx"]
    assert sphinx["local_extensions"].get("table_reflow") == "book/_ext/", (
        "_config.yml: add `table_reflow: book/_ext/` under sphinx.local_extensions"
    )
    assert "table_reflow" in sphinx["config"]["extensions"], (
        "_config.yml: add `- table_reflow` to sphinx.config.extensions"
    )

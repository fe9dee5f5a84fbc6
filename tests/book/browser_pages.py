"""One visit per page of the built book, shared by every browser test (tests/book/test_browser.py and
tests/book/test_layout.py).

:func:`visitor` opens a page once, records its requests and console, collects what it shows (``COLLECT``) and
measures its layout (``MEASURE``) at the desktop width, then resized to the phone width (the page is not
reloaded: media queries apply on resize, and MathJax's output does not depend on the width). tests/conftest.py
makes one such visitor per test session, on the session's one Chromium.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

from tests.book.browser_helpers import (
    PHONE,
    SHORT_CELL,
    WAIT_FOR_MATHJAX,
    is_local,
    unavailable,
)


# Everything the browser saw on one page, collected in a single visit.
@dataclasses.dataclass
class Visit:
    url: str
    status: int | None = None
    title: str = ""
    h1: str = ""
    failed_requests: list[str] = dataclasses.field(default_factory=list)
    bad_responses: list[str] = dataclasses.field(default_factory=list)
    external_requests: list[str] = dataclasses.field(default_factory=list)
    console_errors: list[str] = dataclasses.field(default_factory=list)
    dom: dict[str, Any] = dataclasses.field(default_factory=dict)
    layout: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


# One pass over the rendered page: images (loaded eagerly, then decoded), math, raw TeX outside code, links,
# code text, captions. Raw TeX: text outside pre/code/MathJax output holding \( \) \[ \] $$, a $...$ pair or a TeX
# command such as \texttt (the bibliography's entries are not LaTeX-rendered: pybtex prints commands as they are).
COLLECT = r"""async () => {
  const imgs = Array.from(document.images);
  for (const img of imgs) img.loading = 'eager';
  await Promise.all(imgs.map(img => img.decode().catch(() => null)));
  await document.fonts.ready;
  // the code font served with the book (book/_static/posenc.css), loaded and used by code blocks
  const codeFont = {loaded: Array.from(document.fonts).filter(f => f.family.replace(/"/g, '') === 'posenc mono')
                                  .map(f => f.status),
                    used: Array.from(document.querySelectorAll('pre')).slice(0, 1)
                               .map(p => getComputedStyle(p).fontFamily)};
  const images = imgs.map(img => ({src: img.currentSrc || img.src, ok: img.complete && img.naturalWidth > 0}));
  const maths = Array.from(document.querySelectorAll('.math'));
  const untypeset = maths.filter(m => !m.querySelector('mjx-container')).map(m => m.textContent.slice(0, 80));
  const mathErrors = Array.from(document.querySelectorAll('mjx-merror')).map(e => e.textContent.slice(0, 80));
  const skip = 'pre, code, script, style, textarea, mjx-container, .highlight';
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT, {
    acceptNode: n => (n.parentElement && n.parentElement.closest(skip)) ? NodeFilter.FILTER_REJECT
                                                                        : NodeFilter.FILTER_ACCEPT});
  let text = '';
  for (let n = walker.nextNode(); n; n = walker.nextNode()) text += n.nodeValue;
  const rawTex = [];
  const pattern = /\\\(|\\\)|\\\[|\\\]|\\[a-zA-Z]+|\$\$|(?<![\w$\\])\$[^$\s][^$]*?(?<![\s\\])\$(?![\w$])/g;
  for (const m of text.matchAll(pattern)) {
    rawTex.push(text.slice(Math.max(0, m.index - 30), m.index + m[0].length + 30).replace(/\s+/g, ' '));
  }
  // each formula as MathJax typeset it: its assistive MathML's text ("max_len", or "max\\_len" where TeX's escape
  // was shown rather than read)
  const mathText = Array.from(document.querySelectorAll('mjx-assistive-mml')).map(e => e.textContent);
  const unlabelled = Array.from(document.querySelectorAll('div.math')).filter(m => !m.querySelector('.eqno'))
    .map(m => m.textContent.slice(0, 80));
  const article = document.querySelector('article') || document.body;
  const h1 = article.querySelector('h1');
  const top = h1 ? (h1.closest('section') || h1.parentElement) : null;
  const firstParagraph = top ? (top.querySelector(':scope > p') || {innerText: ''}).innerText : '';
  const h2s = Array.from(article.querySelectorAll('section > h2'));
  const lastSection = h2s.length ? h2s[h2s.length - 1].closest('section') : null;
  const links = Array.from(document.querySelectorAll('a[href]')).map(a => a.href);
  const downloads = Array.from(document.querySelectorAll('a.btn-download-source-button')).map(a => a.href);
  const code = Array.from(document.querySelectorAll('pre')).map(p => p.textContent);
  // figure, table and code-block captions, as a reader sees them (MathJax output as its text)
  const captions = Array.from(article.querySelectorAll('figcaption, caption, .code-block-caption'))
    .map(c => c.innerText.replace(/\s+/g, ' ').trim());
  return {codeFont, captions, images, mathCount: maths.length, untypeset, mathErrors, rawTex, unlabelled, mathText,
          links, downloads, code,
          text: article.innerText, firstParagraph,
          lastHeading: lastSection ? h2s[h2s.length - 1].innerText : '',
          lastSectionText: lastSection ? lastSection.innerText : ''};
}"""


# Measures every element of interest: overflow (scrollWidth > clientWidth), whether its own box scrolls
# (computed overflow-x auto/scroll), and for equations whether the number's box intersects the formula's. Also:
# the column's width (the article's content box); every figure image's displayed and natural width and whether it
# fits the column with nothing scrolling around it; printed outputs and tables wider than the column; and table
# cells of at most SHORT_CELL characters whose text runs over more than one line ("5 of 5" squeezed into a narrow
# column). Figures and tables are named by their number and the start of their text, for failure messages.
MEASURE = r"""(shortCell) => {
  for (const d of document.querySelectorAll('details')) d.open = true;  // a reader may open every folded cell
  const article = document.querySelector('article') || document.body;
  const style = getComputedStyle(article);
  const box = article.getBoundingClientRect();
  const left = box.left + parseFloat(style.paddingLeft), right = box.right - parseFloat(style.paddingRight);
  const scrolls = el => {
    for (let e = el; e && e !== article; e = e.parentElement) {
      const o = getComputedStyle(e).overflowX;
      if ((o === 'auto' || o === 'scroll') && e.clientWidth < article.clientWidth + 2) return true;
    }
    return false;
  };
  const shown = el => el.getClientRects().length > 0
                      && (!el.checkVisibility || el.checkVisibility({visibilityProperty: true}));
  const over = el => shown(el) && el.scrollWidth > el.clientWidth + 1;
  const describe = el => (el.innerText || el.textContent || '').trim().split('\n')[0].slice(0, 70);
  // the number of lines an element's text runs over: the boxes of its text (outside math) and of each formula,
  // grouped into lines; two boxes lie on different lines when neither's middle is within the other's height
  const lines = el => {
    const boxes = [];
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT | NodeFilter.SHOW_ELEMENT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      if (n.nodeType === Node.ELEMENT_NODE) {
        if (n.tagName.toLowerCase() === 'mjx-container') boxes.push(...n.getClientRects());
        continue;
      }
      if (n.parentElement.closest('mjx-container') || !n.nodeValue.trim()) continue;
      const range = document.createRange();
      range.selectNodeContents(n);
      boxes.push(...range.getClientRects());
    }
    const found = [];
    for (const b of boxes.filter(r => r.width > 0.5 && r.height > 0.5)) {
      const apart = a => { const ma = (a.top + a.bottom) / 2, mb = (b.top + b.bottom) / 2;
                           return (ma < b.top || ma > b.bottom) && (mb < a.top || mb > a.bottom); };
      if (found.every(apart)) found.push(b);
    }
    return found.length;
  };
  const result = {column: Math.round(right - left), code: [], codeScroll: [], outputs: [], outputsScroll: [],
                  outputsWide: [], tables: [], equations: [], numbers: [], page: 0, figures: [],
                  narrowFigures: [], tablesWide: [], equationsWide: [], figureScales: [], images: [],
                  wrappedCells: []};
  for (const pre of article.querySelectorAll('.cell_input pre, div.highlight-python pre, div.highlight-bash pre')) {
    if (over(pre)) { result.code.push(describe(pre)); if (!scrolls(pre)) result.codeScroll.push(describe(pre)); }
  }
  for (const pre of article.querySelectorAll('.cell_output pre, .output pre')) {
    if (over(pre)) { result.outputs.push(describe(pre)); if (!scrolls(pre)) result.outputsScroll.push(describe(pre)); }
  }
  // an output's own box (an HTML output, an animation's controls) wider than the column, or running past it
  for (const output of article.querySelectorAll('.cell_output > .output, .cell_output > div')) {
    if (!shown(output) || output.closest('figure') || output.querySelector('table')) continue;  // tables: below
    if (over(output) || output.getBoundingClientRect().right > right + 1) result.outputsWide.push(describe(output));
  }
  const tableName = table => {
    const caption = table.querySelector('caption');
    return caption ? describe(caption) : describe(table).replace(/\t/g, ' | ');
  };
  for (const table of article.querySelectorAll('table')) {
    if (!shown(table)) continue;
    const edges = table.getBoundingClientRect();
    const wide = edges.width > right - left + 1 || edges.right > right + 1;
    if (wide) result.tablesWide.push(tableName(table));
    if (wide && !scrolls(table)) result.tables.push(tableName(table));
    for (const row of table.rows) {
      // header cells are labels and may wrap between words; the values below them may not
      if (row.parentElement.tagName === 'THEAD'
          || (row === table.rows[0] && Array.from(row.cells).every(c => c.tagName === 'TH'))) continue;
      for (const cell of row.cells) {
        const text = (cell.innerText || '').replace(/\s+/g, ' ').trim();
        if (!text || text.length > shortCell || !shown(cell)) continue;
        if (lines(cell) > 1) result.wrappedCells.push(`${text} (in: ${tableName(table)})`);
      }
    }
  }
  for (const math of article.querySelectorAll('div.math')) {
    const formula = math.querySelector('mjx-container');
    if (!formula) continue;
    const inner = formula.querySelector('mjx-math') || formula;
    // the formula itself (mjx-math) wider than its box, or its box wider than the column or scrolling
    const wide = inner.getBoundingClientRect().width > math.getBoundingClientRect().width + 1
                 || formula.scrollWidth > formula.clientWidth + 1
                 || math.getBoundingClientRect().right > article.getBoundingClientRect().right + 1;
    if (wide) result.equationsWide.push(describe(math));
    if (wide && !scrolls(formula)) result.equations.push(describe(math));
    const number = math.querySelector('.eqno');
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
      const caption = figure && figure.querySelector('figcaption');
      if (!caption) result.figures.push(img.getAttribute('src'));
      const rect = img.getBoundingClientRect();
      if (rect.width < 300) result.narrowFigures.push(img.getAttribute('src'));
      if (!img.naturalWidth || !shown(img)) continue;
      result.figureScales.push([img.getAttribute('src'), rect.width / img.naturalWidth]);
      // fits: inside the column, and no box between the image and the column scrolls or overflows
      let fits = rect.left >= left - 1 && rect.right <= right + 1;
      for (let e = img.parentElement; e && e !== article; e = e.parentElement) if (over(e)) fits = false;
      // "Fig. 9 (fig-unit-circle)": the figure's number and its label (mystnb figure name), or the image's file
      const number = caption && caption.querySelector('.caption-number');
      const src = img.getAttribute('src') || '';
      const file = src.startsWith('data:') ? 'an inline image' : src.split('/').pop();
      const name = (number ? number.innerText.trim() + ' ' : '') + `(${figure && figure.id ? figure.id : file})`;
      // room: the content width of the figure (or output) holding the image, the most it can be shown at
      const holder = figure || img.closest('.cell_output'), hs = getComputedStyle(holder);
      const room = holder.clientWidth - parseFloat(hs.paddingLeft) - parseFloat(hs.paddingRight);
      result.images.push({name, shown: rect.width, natural: img.naturalWidth, fits, room, inFigure: !!figure});
    }
  }
  return result;
}"""


def visitor(context: Any, base_url: str, book_dir: Path) -> Callable[..., Visit]:
    """``visit(path, ready=None)``: open ``base_url + path`` once (cached) in ``context`` (desktop-sized), wait
    for MathJax and for the CSS selector ``ready`` if given, then collect what the page shows (``dom``;
    ``dom["ready"]``: the hrefs ``ready`` matched) and measure its layout (``layout``: ``MEASURE`` at the desktop
    width, then with the same page resized to the phone width). One load per page serves every browser test."""
    cache: dict[str, Visit] = {}

    def do_visit(path: str, ready: str | None = None) -> Visit:
        if path in cache:
            return cache[path]
        file = book_dir / urlsplit(path).path
        if not file.is_file():
            unavailable(
                f"{file} is not built (the table of contents is newer than the book: run `make book`)"
            )
        result = Visit(url=urljoin(base_url, path))
        page = context.new_page()

        # recorded, not intercepted: Chromium's proxy setting makes any request beyond this machine fail
        # (tests/book/browser_helpers.py, CHROMIUM_ARGS)
        page.on(
            "request",
            lambda r: not is_local(r.url) and result.external_requests.append(r.url),
        )
        page.on(
            "console",
            lambda m: (
                m.type == "error"
                and result.console_errors.append(f"{m.text} ({m.location})")
            ),
        )
        page.on("pageerror", lambda e: result.console_errors.append(f"uncaught: {e}"))
        page.on(
            "requestfailed",
            lambda r: (
                is_local(r.url)
                and result.failed_requests.append(f"{r.url} ({r.failure})")
            ),
        )
        page.on(
            "response",
            lambda r: (
                r.status >= 400 and result.bad_responses.append(f"{r.status} {r.url}")
            ),
        )
        try:
            response = page.goto(result.url, wait_until="load")
            result.status = response.status if response else None
            page.evaluate(WAIT_FOR_MATHJAX)
            if ready:
                page.wait_for_selector(ready, state="attached")
            # no wait for the network here: COLLECT awaits the images and fonts it reads, and the wait below (no
            # request for 500 ms) is passed before the visit's requests are read (0.5 s less per page)
            result.title = page.title()
            result.h1 = (
                page.locator("h1").first.inner_text()
                if page.locator("h1").count()
                else ""
            )
            result.dom = page.evaluate(COLLECT)
            if ready:
                result.dom["ready"] = page.eval_on_selector_all(
                    ready, "els => els.map(a => a.href)"
                )
            result.layout["desktop"] = page.evaluate(MEASURE, SHORT_CELL)
            page.set_viewport_size(PHONE)
            result.layout["phone"] = page.evaluate(MEASURE, SHORT_CELL)
            # every request made, the phone layout's too
            page.wait_for_load_state("networkidle")
        finally:
            page.close()
        cache[path] = result
        return result

    return do_visit

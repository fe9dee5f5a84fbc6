"""What every page of the built book shows a reader, read from its HTML (and once in the browser for the math).

- No TeX escape shows as text: no ``\\_`` in a page's text, and none in its formulas as MathJax typeset them
  (``\\text{max\\_len}`` reads as max_len because the book's MathJax loads ``textmacros``, _config.yml).
- Figures, tables and equations are numbered per chapter: chapter 06's first figure is Fig. 6.1 and its first
  equation (6.1), and no chapter counts past 20 of any of them.
- No project-internal wording in the pages or the README: the reader meets what the page is ("Show code cell
  source", the button they see), not how the project talks about it ("the folded cell", "issue 10", "an earlier
  version", "used to").

The built book is ``POSENC_BOOK_HTML`` (default ``_build/html``, ``make book``); without it these tests skip.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

import pytest

from tests.book.browser_helpers import (
    ROOT,
    book_html_dir,
    book_missing_reason,
    html_path,
    toc_pages,
    unavailable,
)
from tests.book.browser_pages import Visit

PAGES = toc_pages()
MAX_PER_CHAPTER = 20
#: Wording about the project rather than the page: a cell's state in the notebook, the tracker, past versions.
#: "used to" only in its past-habit sense (not "is used to compute").
INTERNAL = re.compile(
    r"\bfolded cells?\b|\bissues? \d+|\ban earlier version\b|\ba previous version\b|\bthe old version\b"
    r"|(?<!\bis )(?<!\bare )(?<!\bwas )(?<!\bwere )(?<!\bbe )(?<!\bbeen )(?<!\bbeing )\bused to\b",
    re.IGNORECASE,
)
CAPTION_NUMBER = re.compile(r'<span class="caption-number">[^<0-9]*([0-9.]+)')
EQUATION_NUMBER = re.compile(r'<span class="eqno">\(([0-9.]+)\)')
CHAPTER = re.compile(r"(?:^|/)(\d+)_[^/]*$")


def page_html(docname: str) -> str:
    reason = book_missing_reason()
    if reason:
        unavailable(reason)
    path = book_html_dir() / html_path(docname)
    if not path.is_file():
        unavailable(f"{path} is not built: run `make book`")
    return path.read_text(encoding="utf-8")


def article(page: str) -> str:
    """The page's article, without scripts and styles."""
    found = re.search(r"<article\b.*?</article>", page, re.DOTALL)
    body = found.group(0) if found else page
    return re.sub(r"<(script|style)\b.*?</\1>", "", body, flags=re.DOTALL)


def visible_text(fragment: str, *, code: bool = True) -> str:
    """The text of an HTML fragment, spaces collapsed; with ``code=False`` code blocks and formulas are dropped."""
    if not code:
        fragment = re.sub(r"<pre\b.*?</pre>", " ", fragment, flags=re.DOTALL)
        fragment = re.sub(
            r'<(span|div) class="math[^"]*">.*?</\1>', " ", fragment, flags=re.DOTALL
        )
    text = html.unescape(re.sub(r"<[^>]+>", " ", fragment))
    return re.sub(r"\s+", " ", text)


def internal_phrases(text: str) -> list[str]:
    return [
        text[max(0, m.start() - 50) : m.end() + 30] for m in INTERNAL.finditer(text)
    ]


def markdown_prose(text: str) -> str:
    """A Markdown file without its fenced code blocks."""
    return re.sub(r"^```.*?^```", " ", text, flags=re.DOTALL | re.MULTILINE)


def numbering_problems(docname: str, page: str) -> list[str]:
    """Numbers that are not per chapter: a wrong chapter prefix, or a count past MAX_PER_CHAPTER."""
    found = re.search(CHAPTER, docname)
    chapter = found.group(1).lstrip("0") or "0" if found else None
    problems = []
    for kind, pattern in (("figure", CAPTION_NUMBER), ("equation", EQUATION_NUMBER)):
        for number in pattern.findall(page):
            parts = number.rstrip(".").split(".")
            if chapter is not None and (len(parts) != 2 or parts[0] != chapter):
                problems.append(
                    f"{kind} {number} (chapter {chapter} numbers {chapter}.n)"
                )
            elif int(parts[-1]) > MAX_PER_CHAPTER:
                problems.append(f"{kind} {number} (more than {MAX_PER_CHAPTER})")
    return problems


def test_checks_catch_what_they_look_for() -> None:
    assert internal_phrases("The folded cell measures it.")
    assert internal_phrases("reported by a user (issue 10)")
    assert internal_phrases("the pages used to route every request")
    assert not internal_phrases("the function is used to compute the table")
    assert not internal_phrases("Show code cell source")
    chapter_06 = (
        '<span class="caption-number">Fig. 6.21 </span><span class="eqno">(28)</span>'
    )
    assert numbering_problems("book/06_rotary", chapter_06) == [
        "figure 6.21 (more than 20)",
        "equation 28 (chapter 6 numbers 6.n)",
    ]
    assert not numbering_problems(
        "book/06_rotary", '<span class="caption-number">Fig. 6.1 </span>'
    )
    assert "\\_" not in visible_text(
        '<p>a <span class="math">\\(\\text{a\\_b}\\)</span></p>', code=False
    )


@pytest.mark.parametrize("docname", PAGES)
def test_no_escaped_underscore_in_the_text(docname: str) -> None:
    text = visible_text(article(page_html(docname)), code=False)
    shown = [
        text[max(0, i - 40) : i + 30]
        for i in range(len(text))
        if text.startswith("\\_", i)
    ]
    assert not shown, f"{docname}: a backslash shows before an underscore: {shown}"


def test_mathjax_reads_tex_escapes_in_text() -> None:
    """The formulas hold \\text{max\\_len}; MathJax shows it as max_len only with its textmacros package."""
    page = page_html("book/06_rotary")
    assert "textmacros" in page, (
        "MathJax is configured without textmacros (_config.yml, mathjax3_config)"
    )


@pytest.mark.browser
@pytest.mark.parametrize("docname", PAGES)
def test_no_escaped_underscore_in_typeset_math(
    visit: Callable[..., Visit], docname: str
) -> None:
    shown = [t for t in visit(html_path(docname)).dom["mathText"] if "\\_" in t]
    assert not shown, (
        f"{docname}: a formula shows a backslash before an underscore: {shown}"
    )


@pytest.mark.parametrize("docname", PAGES)
def test_figures_and_equations_are_numbered_per_chapter(docname: str) -> None:
    problems = numbering_problems(docname, page_html(docname))
    assert not problems, f"{docname}: {problems} (book/_ext/chapter_numbers.py)"


@pytest.mark.parametrize("docname", PAGES)
def test_no_project_internal_wording_in_the_page(docname: str) -> None:
    found = internal_phrases(visible_text(article(page_html(docname)), code=False))
    assert not found, (
        f"{docname} speaks of the project, not the page (name what the reader sees, e.g. the "
        f"'Show code cell source' button): {found}"
    )


def test_no_project_internal_wording_in_the_readme() -> None:
    found = internal_phrases(markdown_prose((ROOT / "README.md").read_text("utf-8")))
    assert not found, f"README.md speaks of the project's history or tracker: {found}"

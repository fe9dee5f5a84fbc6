"""The rendered book, checked in a real browser: every page of the table of contents, as a reader gets it.

The built HTML (``POSENC_BOOK_HTML``, default ``_build/html``) is served on 127.0.0.1 and opened in Debian's
Chromium through Playwright. Each page is visited once; what the visit saw is then checked page by page: it
loads, every request succeeds and stays on localhost, the console has no error, the math is typeset, every image
loads, every internal link (and its #fragment) resolves, display equations are labelled, captions show no raw
label or markup syntax (a caption's "(eq-rope-decay)" instead of the equation's number), no exporter directive
shows in the code, and notebook pages (the chapters) offer their ``.ipynb``, open with their claim and end with
a summary naming ``tests/``. Then the search page finds a word of the body text and the API page documents
``PositionalEncoding`` with each of its parameters.

Without Chromium or a built book these tests skip, saying why; with ``CI`` set they fail instead (``.ci/run``
installs Chromium and builds the book first).
"""

from __future__ import annotations

import inspect
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin, urlsplit

import pytest

from tests.book.browser_helpers import (
    ROOT,
    book_html_dir,
    book_missing_reason,
    html_path,
    is_local,
    toc_pages,
    unavailable,
)
from tests.book.browser_pages import Visit

pytestmark = pytest.mark.browser

PAGES = toc_pages()
NOTEBOOK_PAGES = [page for page in PAGES if (ROOT / f"{page}.ipynb").is_file()]
API_PAGE = "book/api"
SEARCH_WORD = "sinusoidal"  # in the intro's first sentence, and in every chapter


@pytest.fixture(scope="module")
def book_dir() -> Path:
    reason = book_missing_reason()
    if reason:
        unavailable(reason)
    return book_html_dir()


@pytest.fixture(scope="module")
def base_url(book_dir: Path, book_server: str) -> str:
    return book_server


@pytest.fixture(scope="module")
def fetch(base_url: str) -> Callable[[str], tuple[int, str]]:
    """``fetch(url)``: (status, body) of a local URL without its fragment, cached."""
    cache: dict[str, tuple[int, str]] = {}

    def do_fetch(url: str) -> tuple[int, str]:
        if url not in cache:
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    cache[url] = (
                        response.status,
                        response.read().decode("utf-8", errors="replace"),
                    )
            except urllib.error.HTTPError as error:
                cache[url] = (error.code, "")
        return cache[url]

    return do_fetch


# ---- every page of the table of contents -------------------------------------------------------------------


@pytest.mark.parametrize("docname", PAGES)
def test_page_loads(visit: Callable[..., Visit], docname: str) -> None:
    seen = visit(html_path(docname))
    assert seen.status == 200, f"{seen.url} answered {seen.status}"
    assert seen.h1.strip(), f"{seen.url} has no heading"
    assert seen.title.strip(), f"{seen.url} has no <title>"


@pytest.mark.parametrize("docname", PAGES)
def test_every_request_succeeds_on_localhost(
    visit: Callable[..., Visit], docname: str
) -> None:
    seen = visit(html_path(docname))
    assert not seen.external_requests, (
        f"{docname} requests beyond localhost: {seen.external_requests}"
    )
    assert not seen.failed_requests, (
        f"{docname} has failed requests: {seen.failed_requests}"
    )
    assert not seen.bad_responses, (
        f"{docname} has responses >= 400: {seen.bad_responses}"
    )


def test_a_request_beyond_this_machine_fails_in_the_browser(
    browser_context: Any, book_server: str
) -> None:
    # Chromium's proxy (a closed local port, tests/book/browser_helpers.py) fails every request beyond this machine
    # (a name or an address, http or https) while the book's server on 127.0.0.1 answers; a visit records them
    page = browser_context.new_page()
    failed: dict[str, str] = {}
    page.on("requestfailed", lambda r: failed.update({r.url: r.failure or ""}))
    try:
        page.goto(book_server + "book/intro.html", wait_until="load")
        page.set_content(
            '<img src="http://203.0.113.7/a.png"><img src="https://example.com/b.png">'
        )
        page.wait_for_load_state("load")
    finally:
        page.close()
    assert failed == {
        "http://203.0.113.7/a.png": "net::ERR_PROXY_CONNECTION_FAILED",
        "https://example.com/b.png": "net::ERR_PROXY_CONNECTION_FAILED",
    }


@pytest.mark.parametrize("docname", PAGES)
def test_no_console_error(visit: Callable[..., Visit], docname: str) -> None:
    seen = visit(html_path(docname))
    assert not seen.console_errors, (
        f"{docname} logs console errors: {seen.console_errors}"
    )


@pytest.mark.parametrize("docname", PAGES)
def test_math_is_typeset(visit: Callable[..., Visit], docname: str) -> None:
    dom = visit(html_path(docname)).dom
    assert not dom["untypeset"], (
        f"{docname}: math left untypeset by MathJax: {dom['untypeset']}"
    )
    assert not dom["mathErrors"], (
        f"{docname}: MathJax could not parse: {dom['mathErrors']}"
    )
    assert not dom["rawTex"], f"{docname}: raw TeX shows as text: {dom['rawTex']}"


@pytest.mark.parametrize("docname", PAGES)
def test_display_equations_are_labelled(
    visit: Callable[..., Visit], docname: str
) -> None:
    unlabelled = visit(html_path(docname)).dom["unlabelled"]
    assert not unlabelled, (
        f"{docname}: display equations without a label (write $$ ... $$ (eq-name)): {unlabelled}"
    )


@pytest.mark.parametrize("docname", NOTEBOOK_PAGES)
def test_chapter_opens_with_claim_and_ends_with_summary(
    visit: Callable[..., Visit], docname: str
) -> None:
    dom = visit(html_path(docname)).dom
    assert dom["firstParagraph"].startswith("Claim."), (
        f"{docname} does not open with its claim: {dom['firstParagraph']!r}"
    )
    assert dom["lastHeading"].rstrip("#").strip() == "Summary", (
        f"{docname} ends with {dom['lastHeading']!r}"
    )
    assert "tests/" in dom["lastSectionText"], (
        f"{docname}'s summary does not say where tests/ checks it"
    )


#: What a caption must not show: a MyST role (``{eq}`...` ``), Markdown link or directive syntax, a label's
#: definition, or a bare label name (``eq-rope-decay``, ``(fig-bits)``: the book's labels start eq-, fig-, sec-).
CAPTION_MARKUP = {
    "a MyST role": re.compile(r"\{[a-zA-Z][\w:-]*\}`"),
    "a backtick": re.compile(r"`"),
    "Markdown link syntax": re.compile(r"\]\(|\]\[|<#"),
    "a directive fence": re.compile(r":::|```"),
    "a label definition": re.compile(r"\([\w-]+\)="),
    "a raw label": re.compile(
        r"\b(?:eq|fig|sec|tab|tbl)-[a-z0-9][\w-]*", re.IGNORECASE
    ),
}


def caption_problems(captions: list[str]) -> list[str]:
    """``caption: what raw syntax it shows`` for each caption that shows reference or markup syntax as text."""
    found = []
    for caption in captions:
        for what, pattern in CAPTION_MARKUP.items():
            hit = pattern.search(caption)
            if hit:
                start = max(0, hit.start() - 30)
                found.append(
                    f"{what} {hit.group(0)!r} in {caption[:20]!r}...{caption[start : hit.end() + 20]!r}"
                )
    return found


def test_caption_check_catches_raw_labels() -> None:
    # the kinds of caption that rendered wrong, and ones that are fine
    bad = [
        "Fig. 17 Left: RoFormer's relative upper bound (eq-rope-decay) and the score.",
        "Fig. 2 the smooth bits s_j(p) of eq-bits (blue)",
        "Fig. 3 as in {numref}`fig-bits`",
        "Fig. 4 see [the table](#sec-table)",
    ]
    good = [
        "Fig. 17 Left: RoFormer's relative upper bound (12) and the score, d_model = 64.",
        "Fig. 5 Scores of query p = 50 (float32, seq-len 8) against every key q.",
    ]
    assert [bool(caption_problems([c])) for c in bad + good] == [True] * 4 + [False] * 2


@pytest.mark.parametrize("docname", PAGES)
def test_captions_show_no_raw_labels(visit: Callable[..., Visit], docname: str) -> None:
    """Figure, table and code captions show no cross-reference or markup syntax as text: a caption refers to an
    equation with the {eq} role (rendered as its number), never by writing the label."""
    problems = caption_problems(visit(html_path(docname)).dom["captions"])
    assert not problems, f"{docname}: captions showing raw syntax: {problems}"


@pytest.mark.parametrize("docname", PAGES)
def test_every_image_loads(visit: Callable[..., Visit], docname: str) -> None:
    images = visit(html_path(docname)).dom["images"]
    broken = [image["src"] for image in images if not image["ok"]]
    assert not broken, f"{docname}: images that did not load (naturalWidth 0): {broken}"


@pytest.mark.parametrize("docname", PAGES)
def test_code_is_set_in_the_font_served_with_the_book(
    visit: Callable[..., Visit], docname: str
) -> None:
    """Code blocks use book/_static/fonts (DejaVu Sans Mono), not the machine's own monospace font, so the
    widths tests/book/test_layout.py measures are the widths every reader sees."""
    font = visit(html_path(docname)).dom["codeFont"]
    if not font["used"]:
        pytest.skip(f"{docname} has no code block")
    assert font["used"][0].startswith('"posenc mono"'), (
        f"{docname}: code blocks use {font['used'][0]!r}, not the served font (book/_static/posenc.css)"
    )
    assert "loaded" in font["loaded"] and "error" not in font["loaded"], (
        f"{docname}: the served code font did not load ({font['loaded']}): book/_static/fonts"
    )


def broken_links(seen: Visit, fetch: Callable[[str], tuple[int, str]]) -> list[str]:
    """The local links of a visited page whose target (or #fragment) does not exist."""
    broken = []
    for link in sorted(set(seen.dom["links"])):
        if urlsplit(link).scheme not in ("http", "https") or not is_local(link):
            continue
        target, fragment = urldefrag(link)
        status, body = fetch(target)
        if status != 200:
            broken.append(f"{link} ({status})")
        elif fragment and not re.search(
            rf'\b(?:id|name)="{re.escape(unquote(fragment))}"', body
        ):
            broken.append(f"{link} (no element with id {unquote(fragment)!r})")
    return broken


@pytest.mark.parametrize("docname", PAGES)
def test_every_internal_link_resolves(
    visit: Callable[..., Visit], fetch: Callable[[str], tuple[int, str]], docname: str
) -> None:
    broken = broken_links(visit(html_path(docname)), fetch)
    assert not broken, f"{docname} links to what does not exist: {broken}"


def test_root_page_is_the_introduction_not_a_redirect(
    visit: Callable[..., Visit], fetch: Callable[[str], tuple[int, str]], book_dir: Path
) -> None:
    """``index.html`` (what a browser, a screenshot tool or a host opens first) is the introduction itself, with
    every stylesheet, script, image and link working from the site's root (book/_ext/root_page.py)."""
    html = (book_dir / "index.html").read_text(encoding="utf-8")
    assert 'http-equiv="Refresh"' not in html, (
        "index.html is still a meta-refresh redirect"
    )
    root, intro = visit("index.html"), visit(html_path(PAGES[0]))
    assert root.status == 200 and root.h1 and root.h1 == intro.h1, (root.h1, intro.h1)
    problems = (
        root.external_requests
        + root.failed_requests
        + root.bad_responses
        + root.console_errors
        + [image["src"] for image in root.dom["images"] if not image["ok"]]
        + root.dom["untypeset"]
        + broken_links(root, fetch)
    )
    assert not problems, f"index.html: {problems}"
    assert root.dom["text"] == intro.dom["text"], (
        "index.html does not show the introduction"
    )


@pytest.mark.parametrize("docname", PAGES)
def test_no_directive_line_in_rendered_code(
    visit: Callable[..., Visit], docname: str
) -> None:
    shown = [
        line
        for block in visit(html_path(docname)).dom["code"]
        for line in block.splitlines()
    ]
    directives = [line for line in shown if line.lstrip().startswith("#|")]
    assert not directives, (
        f"{docname} shows exporter directives in its code: {directives}"
    )


@pytest.mark.parametrize("docname", NOTEBOOK_PAGES)
def test_notebook_page_offers_its_ipynb(
    visit: Callable[..., Visit], fetch: Callable[[str], tuple[int, str]], docname: str
) -> None:
    downloads = [
        url
        for url in visit(html_path(docname)).dom["downloads"]
        if url.endswith(".ipynb")
    ]
    assert downloads, f"{docname} has no .ipynb download button"
    status, body = fetch(downloads[0])
    assert status == 200, f"{downloads[0]} answered {status}"
    assert '"cells"' in body and '"nbformat"' in body, (
        f"{downloads[0]} is not a notebook"
    )


# ---- the built files, without a browser ----------------------------------------------------------------------


@pytest.mark.parametrize("docname", PAGES)
def test_no_directive_line_in_html(book_dir: Path, docname: str) -> None:
    file = book_dir / html_path(docname)
    if not file.is_file():
        unavailable(f"{file} is not built (run `make book`)")
    html = file.read_text(encoding="utf-8")
    lines = [
        line
        for line in re.sub(r"<[^>]+>", "", html).splitlines()
        if line.lstrip().startswith("#|")
    ]
    assert not lines, f"{file} contains exporter directive lines: {lines}"


def test_figures_are_opaque(book_dir: Path) -> None:
    """A transparent figure shows black axis text on the dark theme's background; ours are drawn on white."""
    import matplotlib.image

    transparent = []
    for png in sorted((book_dir / "_images").glob("*.png")):
        pixels = matplotlib.image.imread(png)
        if (
            pixels.ndim == 3
            and pixels.shape[2] == 4
            and float(pixels[..., 3].min()) < 1.0
        ):
            transparent.append(png.name)
    assert not transparent, (
        f"figures with a transparent background (unreadable in dark mode): {transparent}"
    )


# ---- the search page and the API page -------------------------------------------------------------------------


def test_search_finds_a_word_of_the_body_text(visit: Callable[..., Visit]) -> None:
    intro = visit(html_path(PAGES[0]))
    assert SEARCH_WORD in intro.dom["text"].lower(), (
        f"{SEARCH_WORD!r} is no longer in the intro's text"
    )
    search = visit(
        f"search.html?q={SEARCH_WORD}", ready="#search-results ul.search li a"
    )
    assert not search.external_requests, (
        f"the search page requests beyond localhost: {search.external_requests}"
    )
    assert not search.failed_requests + search.bad_responses, (
        f"the search page has failed requests: {search.failed_requests + search.bad_responses}"
    )
    assert not search.console_errors, (
        f"the search page logs console errors: {search.console_errors}"
    )
    hit_pages = {urlsplit(hit).path.lstrip("/") for hit in search.dom["ready"]}
    assert html_path(PAGES[0]) in hit_pages, (
        f"searching {SEARCH_WORD!r} did not find the intro: {hit_pages}"
    )


def test_api_page_documents_positional_encoding(
    browser_context: Any, base_url: str, book_dir: Path
) -> None:
    import posenc

    if API_PAGE not in PAGES:
        pytest.fail(f"{API_PAGE} is not in _toc.yml")
    page = browser_context.new_page()
    try:
        page.goto(urljoin(base_url, html_path(API_PAGE)), wait_until="load")
        documented = {}
        for name, obj in [
            ("posenc.PositionalEncoding", posenc.PositionalEncoding),
            ("posenc.PositionalEncoding.forward", posenc.PositionalEncoding.forward),
        ]:
            entry = page.locator(f'dl:has(> dt[id="{name}"])').first
            assert entry.count(), f"the API page has no entry for {name}"
            signature = entry.locator(f'dt[id="{name}"] em.sig-param').all_inner_texts()
            described = entry.locator("> dd > dl.field-list strong").all_inner_texts()
            wanted = [p for p in inspect.signature(obj).parameters if p != "self"]
            documented[name] = (wanted, signature, described)
    finally:
        page.close()
    for name, (wanted, signature, described) in documented.items():
        in_signature = {re.split(r"[=:]", s, maxsplit=1)[0].strip() for s in signature}
        missing = [p for p in wanted if p not in in_signature]
        assert not missing, f"{name}'s rendered signature lacks {missing}: {signature}"
        undescribed = [p for p in wanted if p not in described]
        assert not undescribed, (
            f"{name}'s parameters without a description on the API page: {undescribed}"
        )

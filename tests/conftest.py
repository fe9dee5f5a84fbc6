"""Shared test configuration.

- CUDA-only tests are marked ``gpu`` and skipped cleanly without CUDA.
- **Parallel runs** (``make test`` runs ``pytest -n <cores> --dist loadgroup``, pytest-xdist): scheduled by
  ``GroupedScheduling`` in tests/plugin.py, which every run loads (``pytest book`` too, which never reads
  this file). Each notebook's cells form one unit (nbval runs them in order, in one kernel, on one worker), and
  every browser test is in the unit ``browser``, so that one Chromium, started once, serves them all
  (:func:`chromium`), and the tests that import the installed peers are the unit ``peers``, so that one worker
  imports them. Other tests are spread one by one. Items are ordered longest-first (notebooks and the
  browser group, then the slow files), so that no long unit starts last and leaves a worker idle.
  A serial run (``pytest``, ``-p no:xdist``) runs the same items.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.plugin import SLOW_FILES, scope_of


def _weight(item: pytest.Item) -> int:
    """Rough cost class: notebooks and the browser group first, then slow files, then the rest (stable)."""
    if scope_of(item.nodeid) != item.nodeid:
        return 0
    if item.path.name in SLOW_FILES:
        return 1
    return 2


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    items.sort(key=_weight)  # stable: each notebook's cells keep their order
    # imported here, not at the top: pytest-xdist's controller reads this file but collects nothing, and need not
    # spend 2-3 s importing torch before it starts the workers
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """One headless Chromium for every browser test of this process (started on first use), or a skip/fail
    saying why there is none (see ``tests/book/browser_helpers.py``)."""
    from tests.book.browser_helpers import (
        browser_missing_reason,
        launch_chromium,
        unavailable,
    )

    reason = browser_missing_reason()
    if reason:
        unavailable(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="session")
def book_server() -> Iterator[str]:
    """The built book served on 127.0.0.1 for this process: its base URL (skip/fail when it is not built)."""
    from tests.book.browser_helpers import (
        book_html_dir,
        book_missing_reason,
        serve,
        unavailable,
    )

    reason = book_missing_reason()
    if reason:
        unavailable(reason)
    with serve(book_html_dir()) as url:
        yield url


@pytest.fixture(scope="session")
def browser_context(chromium: Any) -> Iterator[Any]:
    """A desktop-sized (1280 x 900) context of the session's Chromium."""
    from tests.book.browser_helpers import DESKTOP

    context = chromium.new_context(viewport=DESKTOP)
    context.set_default_timeout(20_000)
    # A blank page left open for the context's life. Each visit opens and closes its own page; with no other page
    # of this context open, Chromium spent about 1.4 times the CPU on the same visits (tools/browser_cost.py, all
    # 16 pages twice each way: 71-77 busy CPU-seconds of the machine without it, 50-53 with it; a page open in
    # another context did not help; every page made the same requests either way).
    context.new_page()
    yield context
    context.close()


@pytest.fixture(scope="session")
def visit(browser_context: Any, book_server: str) -> Any:
    """``visit(path)``: the session's one visit of a page of the built book (tests/book/browser_pages.py)."""
    from tests.book.browser_helpers import book_html_dir
    from tests.book.browser_pages import visitor

    return visitor(browser_context, book_server, book_html_dir())

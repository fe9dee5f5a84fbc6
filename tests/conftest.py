"""Shared test configuration.

- CUDA-only tests are marked ``gpu`` and skipped cleanly without CUDA.
- **Parallel runs** (``make test`` runs ``pytest -n 2 --dist loadgroup``, pytest-xdist): each notebook's cells
  form one group (nbval runs them in order, in one kernel, on one worker), and every browser test is in the
  group ``browser``, so that one Chromium, started once, serves them all (:func:`chromium`). Other tests are
  spread one by one. Items are ordered longest-first (notebooks and the browser group), so that no long group
  starts last and leaves the other worker idle. A serial run (``pytest``, ``-p no:xdist``) runs the same items.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

#: Test files that drive the browser: one group, one Chromium.
BROWSER_FILES = ("test_browser.py", "test_layout.py")
#: Tests that take many seconds each; started early, like the groups (seconds measured on 2 cores, serial run).
SLOW_FILES = ("test_ddp.py", "test_package.py", "test_compile.py", "test_export.py")


def _group(item: pytest.Item) -> str | None:
    path = item.path
    if path.suffix == ".ipynb":
        return f"notebook-{path.stem}"
    if path.name in BROWSER_FILES:
        return "browser"
    return None


def _weight(item: pytest.Item) -> int:
    """Rough cost class: groups first, then slow files, then the rest (stable within each class)."""
    group = _group(item)
    if group == "browser" or group is not None:
        return 0
    if item.path.name in SLOW_FILES:
        return 1
    return 2


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    for item in items:
        group = _group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=_weight)  # stable: each notebook's cells keep their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """One headless Chromium for every browser test of this process (started on first use), or a skip/fail
    saying why there is none (see ``tests/browser_helpers.py``)."""
    from tests.browser_helpers import (
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
    from tests.browser_helpers import (
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

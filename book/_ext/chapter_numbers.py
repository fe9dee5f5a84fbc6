"""Sphinx extension: figures, tables, code listings and equations numbered per chapter (Fig. 6.1, eq. (6.2)).

Sphinx numbers them across the whole book unless the table of contents is a numbered toctree, and a numbered
toctree would also number the chapters 1, 2, ... in the sidebar and titles, one off from the files' own numbers
(``book/00_first_read`` is chapter 0, ``book/06_rotary`` chapter 6). This extension keeps Sphinx's order and
renumbers within each page: the chapter is the number its file name starts with, the second number counts that
kind of item (figure, table, code block, equation) on that page. A page whose name starts with no number (the
introduction, the API page) counts from 1 without a prefix.

Sphinx compares the numbers of one build with those of the previous build to decide which pages to write again; it
is given its own whole-book numbers for that comparison (kept in the environment), so a changed page is rewritten
exactly when it would be without this extension.
"""

from __future__ import annotations

import re
from typing import Any

from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment

CHAPTER = re.compile(r"(?:^|/)(\d+)_[^/]*$")
SAVED = "posenc_book_wide_fignumbers"


def chapter_of(docname: str) -> tuple[int, ...]:
    """The chapter number a page's file name starts with (``book/06_rotary`` -> ``(6,)``), else ``()``."""
    match = CHAPTER.search(docname)
    return (int(match.group(1)),) if match else ()


def restore_book_wide(app: Sphinx, env: BuildEnvironment) -> list[str]:
    """Before Sphinx numbers: give it last build's whole-book numbers to compare against."""
    saved = getattr(env, SAVED, None)
    if saved is not None:
        env.toc_fignumbers = saved
    return []


def number_per_chapter(app: Sphinx, env: BuildEnvironment) -> list[str]:
    """After Sphinx numbers: keep its numbers for the next comparison, then renumber each page from 1."""
    setattr(
        env,
        SAVED,
        {
            doc: {kind: dict(ids) for kind, ids in kinds.items()}
            for doc, kinds in env.toc_fignumbers.items()
        },
    )
    for docname, kinds in env.toc_fignumbers.items():
        prefix = chapter_of(docname)
        for kind, numbers in kinds.items():
            in_order = sorted(numbers, key=numbers.__getitem__)
            kinds[kind] = {
                ident: (*prefix, index) for index, ident in enumerate(in_order, start=1)
            }
    return []


def setup(app: Sphinx) -> dict[str, Any]:
    # Sphinx's own numbering is an env-get-updated handler at the default priority, 500.
    app.connect("env-get-updated", restore_book_wide, priority=400)
    app.connect("env-get-updated", number_per_chapter, priority=600)
    return {
        "version": "1.0",
        "parallel_read_safe": True,
        "parallel_write_safe": True,
        "env_version": 1,
    }

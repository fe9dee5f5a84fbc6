"""Sphinx extension: the site's ``index.html`` is the introduction itself, not a redirect.

The book's root document is ``book/intro``, so Sphinx writes ``book/intro.html`` and sphinx-external-toc fills
``index.html`` with a ``<meta http-equiv="Refresh">`` redirect. Tools that open the folder's ``index.html``
(a headless screenshot, a link checker, some static hosts' previews) see a blank page. After every HTML build
this writes ``index.html`` as a copy of ``book/intro.html`` whose relative addresses are rewritten for the
site's root (``../_static/x`` -> ``_static/x``, ``01_derivation.html`` -> ``book/01_derivation.html``); in-page
anchors (``#notation``) are kept, since the copy has the same content. It runs before sphinx-external-toc's
hook, which then leaves the existing file alone.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx

#: The attributes that hold one address each (href, src, action).
ADDRESS = re.compile(r'(?P<attr>\b(?:href|src|action)=)"(?P<url>[^"]*)"')
ABSOLUTE = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|/|#|$)")


def relocate(url: str, folder: str) -> str:
    """``url``, relative to a page in ``folder`` (e.g. ``"book"``), made relative to the site's root."""
    if ABSOLUTE.match(url):
        return url
    parts = folder.split("/") if folder else []
    while url.startswith("../") and parts:
        url = url[3:]
        parts.pop()
    if url.startswith("./"):
        url = url[2:]
    return "/".join([*parts, url]) if parts else url


def root_copy(html: str, folder: str) -> str:
    """The HTML of a page in ``folder``, with every relative address rewritten for the site's root."""
    html = ADDRESS.sub(
        lambda m: f'{m.group("attr")}"{relocate(m.group("url"), folder)}"', html
    )
    depth = len(folder.split("/")) if folder else 0
    return html.replace(
        f'data-content_root="{"../" * depth}"', 'data-content_root="./"'
    )


def write_root_page(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    root = app.config.root_doc
    if root == "index":
        return
    outdir = Path(app.outdir)
    page = outdir / f"{root}.html"
    if not page.is_file():
        return
    folder = str(Path(root).parent).replace("\\", "/").strip(".")
    text = root_copy(page.read_text(encoding="utf-8"), folder)
    (outdir / "index.html").write_text(text, encoding="utf-8")


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("build-finished", write_root_page, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

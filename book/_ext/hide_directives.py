"""Sphinx extension: hide the exporter's ``#| ...`` directive lines in rendered code cells.

The notebooks keep them (they drive ``tools/nbexport.py``); readers of the book do not need them.
"""

from __future__ import annotations

import re
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx

DIRECTIVE_LINE = re.compile(r"^#\|[^\n]*(\n|$)", re.MULTILINE)


def strip_directives(app: Sphinx, doctree: nodes.document) -> None:
    """Remove directive lines from every literal block that has them (code cells' sources)."""
    for block in doctree.findall(nodes.literal_block):
        text = block.astext()
        if "#|" not in text:
            continue
        cleaned = DIRECTIVE_LINE.sub("", text)
        if cleaned != text:
            block.children = [nodes.Text(cleaned)]
            block.rawsource = cleaned


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("doctree-read", strip_directives)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}

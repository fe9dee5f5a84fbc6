"""Sphinx extension: ``$...$`` in the package's docstrings renders as math on the API page.

The docstrings are written in the notebooks, in the book's notation, with Markdown-style ``$...$`` math (they
are read in the notebook, in ``help()`` and on the API page alike). autodoc parses docstrings as reStructuredText,
where ``$`` means nothing, and MathJax is configured for ``\\(...\\)`` only, so ``$d$`` would show raw. This hook
rewrites each ``$...$`` outside ````literals```` into the ``:math:`` role before the docstring is parsed.
"""

from __future__ import annotations

import re
from typing import Any

from sphinx.application import Sphinx

LITERAL = re.compile(r"(``.+?``)", re.DOTALL)
# $...$ with no $ inside, not $$, not an escaped \$, and not touching a word character on the outside.
INLINE_MATH = re.compile(r"(?<![\w$\\])\$(?!\$)([^$]+?)(?<![\\\s])\$(?![\w$])")


def dollars_to_math_role(text: str) -> str:
    """Rewrite ``$x$`` as ``:math:`x``` outside double-backquoted literals."""
    parts = LITERAL.split(text)
    for index in range(0, len(parts), 2):
        parts[index] = INLINE_MATH.sub(lambda m: f":math:`{m.group(1)}`", parts[index])
    return "".join(parts)


def convert_docstring(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """autodoc-process-docstring handler: rewrite the docstring's lines in place."""
    text = "\n".join(lines)
    if "$" not in text:
        return
    lines[:] = dollars_to_math_role(text).split("\n")


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("sphinx.ext.autodoc")
    app.connect("autodoc-process-docstring", convert_docstring)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}

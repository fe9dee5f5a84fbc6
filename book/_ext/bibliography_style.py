"""Sphinx extension: the bibliography style ``posenc``, pybtex's ``plain`` sorted by author with braces ignored.

``plain`` sorts by author, year and title, but compares names as written, so an organisation written in braces to
keep it whole (``author = {{PyTorch Contributors}}``) sorts after every person (``{`` follows ``z``). This style
drops the braces from the sort key; entries read as in ``plain``. Select it with ``bibtex_default_style: posenc``.
"""

from __future__ import annotations

from typing import Any

from pybtex.plugin import register_plugin
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.sorting.author_year_title import SortingStyle as AuthorYearTitle
from sphinx.application import Sphinx


class BraceBlindSorting(AuthorYearTitle):
    """Author, year, title; ``{PyTorch Contributors}`` sorts under P."""

    def person_key(self, person: Any) -> str:
        return super().person_key(person).replace("{", "").replace("}", "")


class PosencStyle(PlainStyle):
    """pybtex's ``plain``, sorted with :class:`BraceBlindSorting`."""

    default_sorting_style = "posenc_author_year_title"


def setup(app: Sphinx) -> dict[str, Any]:
    register_plugin(
        "pybtex.style.sorting", "posenc_author_year_title", BraceBlindSorting
    )
    register_plugin("pybtex.style.formatting", "posenc", PosencStyle)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}

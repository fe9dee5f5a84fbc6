"""Sphinx extension: the repository buttons appear exactly when ``_config.yml`` names the repository.

``repository: url:`` in ``_config.yml`` is the one place the repository's address is written. While it is empty
(the repository is not published yet) the book has no repository, issues or "edit this page" button; once it is
set, this hook turns the three on. jupyter-book itself refuses ``use_*_button: true`` without a url, which is why
they are switched here rather than in ``_config.yml``: the build works either way.
"""

from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx
from sphinx.config import Config

BUTTONS = ("use_repository_button", "use_issues_button", "use_edit_page_button")


def set_repository_buttons(app: Sphinx, config: Config) -> None:
    """Switch the repository buttons on when ``repository_url`` is set, off otherwise."""
    options = config.html_theme_options
    has_url = bool((options.get("repository_url") or "").strip())
    for button in BUTTONS:
        options[button] = has_url


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", set_repository_buttons)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}

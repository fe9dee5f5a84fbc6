"""The plumbing's own tests start kernels as a notebook run does: they load the same plugin as book/conftest.py."""

from tests.notebooks.plugin import pytest_configure

__all__ = ["pytest_configure"]

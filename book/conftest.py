"""pytest reads this file only where it collects the notebooks: their run's plumbing (tests/notebooks/README.md)."""

from tests.notebooks.plugin import pytest_configure

__all__ = ["pytest_configure"]

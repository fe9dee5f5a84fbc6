"""The README's Python examples run as written (in order, in one namespace), so a newcomer's first paste works."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_readme_python_examples_run() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 3, "the README's usage examples are gone"
    namespace: dict[str, object] = {}
    for index, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {index + 1}", "exec"), namespace)

"""``python -m tests.census [FAMILY ...]``: run the census, print its table, write its JSON (all families only)."""

from __future__ import annotations

import sys

from tests.census.runner import run, table, write


def main(argv: list[str]) -> int:
    census = run(argv or None)
    print(table(census))
    if not argv:
        print(f"written: {write(census)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

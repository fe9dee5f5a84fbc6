"""Sphinx extension: short table values stay on one line, and wide tables reflow on a phone, one card per row.

A table wider than a phone's column (358 px at a 390 px window) either scrolls sideways, hiding columns, or lets
the browser squeeze every column to its longest word, so that a short value such as "5 of 5" wraps over three
lines. Neither reads. This hook rewrites the tables of every page (Markdown tables and the HTML tables that
notebook cells print alike):

- each body cell of at most ``SHORT_CELL`` characters gets the class ``posenc-short``, which
  book/_static/posenc.css keeps on one line at every width;
- a table that would not fit the phone's column gets the class ``posenc-reflow``, and each of its body cells its
  column's header as ``data-label``; below 576 px posenc.css shows such a table as one card per row, every cell a
  line "header  value" (the header row itself hidden). On wider screens it stays a table.

Whether a table fits is estimated from its text (``estimated_width``), before any browser sees it:
tests/book/test_layout.py measures the result at 390 and 1280 px, and a table the estimate lets through that does not
fit fails there. A table can ask for either layout with the class ``posenc-reflow`` or ``posenc-no-reflow`` (in a
cell's HTML, or ``:class:`` of a MyST ``{table}``/``{list-table}``). Tables without a header, or with ``rowspan``,
never reflow: their cells have no single column name.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any

from sphinx.application import Sphinx

#: The phone's column (a 390 px window less the theme's 16 px side padding), measured by tests/book/test_layout.py.
PHONE_COLUMN_PX = 358
#: Rough widths, in px, of one character of body text and of code in a table (0.9 em of the 16 px body font),
#: and of a cell's left and right padding together.
CHAR_PX = 8.0
CODE_CHAR_PX = 8.5
CELL_PADDING_PX = 16.0
#: A cell of at most this many characters must stay on one line ("5 of 5", "0.51× (0.45–0.54)"); longer text
#: may wrap between words.
SHORT_CELL = 20

TABLE = re.compile(r"<table\b.*?</table>", re.DOTALL | re.IGNORECASE)
TAG = re.compile(
    r"<(?P<end>/?)(?P<name>[a-zA-Z][\w-]*)(?P<attrs>(?:[^>\"']|\"[^\"]*\"|'[^']*')*)>"
)
CLASS_ATTR = re.compile(r"""\bclass\s*=\s*(?:"([^"]*)"|'([^']*)')""", re.IGNORECASE)
MATH = re.compile(r"\\\((.*?)\\\)")
COLSPAN = re.compile(r"""\bcolspan\s*=\s*["']?(\d+)""", re.IGNORECASE)
ROWSPAN = re.compile(r"""\browspan\s*=\s*["']?(\d+)""", re.IGNORECASE)


@dataclass
class Cell:
    tag: tuple[int, int]  # where the cell's start tag is in the table's HTML
    colspan: int
    header: bool
    text: str = ""
    code: bool = False


@dataclass
class Row:
    in_head: bool
    cells: list[Cell] = field(default_factory=list)


def _classes(attrs: str) -> list[str]:
    found = CLASS_ATTR.search(attrs)
    return (found.group(1) or found.group(2) or "").split() if found else []


def parse_rows(table: str) -> tuple[list[Row], bool]:
    """The rows of one table's HTML (no nested tables) and whether any cell spans rows."""
    rows: list[Row] = []
    cell: Cell | None = None
    in_head = spans_rows = False
    code_depth = 0
    position = 0
    for tag in TAG.finditer(table):
        if cell is not None:
            cell.text += table[position : tag.start()]
            cell.code = cell.code or code_depth > 0
        position = tag.end()
        name, end, attrs = (
            tag.group("name").lower(),
            bool(tag.group("end")),
            tag.group("attrs"),
        )
        if name == "thead":
            in_head = not end
        elif name == "tr" and not end:
            rows.append(Row(in_head))
            cell = None
        elif name in ("td", "th") and not end:
            if not rows:
                rows.append(Row(in_head))
            spans_rows = spans_rows or ROWSPAN.search(attrs) is not None
            colspan = COLSPAN.search(attrs)
            cell = Cell(
                tag.span(), int(colspan.group(1)) if colspan else 1, name == "th"
            )
            rows[-1].cells.append(cell)
        elif name in ("td", "th", "tr") and end:
            cell = None
        elif name == "code":
            code_depth += -1 if end else 1
    for row in rows:
        for c in row.cells:
            c.text = " ".join(html.unescape(re.sub(r"<[^>]*>", "", c.text)).split())
    return rows, spans_rows


def reading(text: str) -> str:
    """A cell's text as it reads: inline math ``\\(u\\,p\\)`` without its TeX markup, about two characters."""
    return MATH.sub(lambda m: re.sub(r"\\[a-zA-Z]+|\\.|[{}^_]", "", m.group(1)), text)


def header_rows(rows: list[Row]) -> list[Row]:
    """The header rows: those in ``<thead>``, or else a first row made only of ``<th>``."""
    head = [row for row in rows if row.in_head]
    if not head and rows and rows[0].cells and all(c.header for c in rows[0].cells):
        head = rows[:1]
    return head


def column_labels(head: list[Row]) -> list[str]:
    """One label per column, from the last header row (a cell spanning columns labels each of them)."""
    labels: list[str] = []
    for c in head[-1].cells if head else []:
        labels += [c.text] * c.colspan
    return labels


def estimated_width(rows: list[Row], head: list[Row]) -> float:
    """A rough width in px of the table laid out with no short cell wrapped: per column, the widest short cell
    (at most ``SHORT_CELL`` characters, kept on one line) or longest word of a longer cell, header words
    included, plus the cells' padding."""
    widths: dict[int, float] = {}
    for row in rows:
        column = 0
        for c in row.cells:
            text = reading(c.text)
            words = text.split() or [""]
            chars = (
                len(text)
                if len(text) <= SHORT_CELL and row not in head
                else max(map(len, words))
            )
            px = (
                chars * (CODE_CHAR_PX if c.code else CHAR_PX) / c.colspan
                + CELL_PADDING_PX
            )
            for j in range(column, column + c.colspan):
                widths[j] = max(widths.get(j, 0.0), px)
            column += c.colspan
    return sum(widths.values())


def with_attributes(tag: str, classes: list[str], extra: str = "") -> str:
    """A start tag (``<td ...>``) with ``classes`` added to its class attribute and ``extra`` attributes."""
    found = TAG.match(tag)
    if found is None or (not classes and not extra):
        return tag
    attrs = found.group("attrs").rstrip("/")
    if classes:
        current = CLASS_ATTR.search(attrs)
        merged = " ".join(dict.fromkeys([*_classes(attrs), *classes]))
        attrs = (
            f'{attrs[: current.start()]}class="{merged}"{attrs[current.end() :]}'
            if current
            else f'{attrs} class="{merged}"'
        )
    return f"<{found.group('name')}{attrs}{extra}>"


def reflow_table(table: str) -> str:
    """One table's HTML, its short body cells marked ``posenc-short`` (kept on one line by posenc.css), and the
    whole table marked to reflow on a phone (class and ``data-label`` attributes) when it would not fit."""
    opening = TAG.match(table)
    if opening is None or re.search(r"<table\b", table[opening.end() :], re.IGNORECASE):
        return table
    classes = _classes(opening.group("attrs"))
    rows, spans_rows = parse_rows(table)
    head = header_rows(rows)
    labels = column_labels(head)
    reflow = (
        not spans_rows
        and any(labels)
        and "posenc-no-reflow" not in classes
        and (
            "posenc-reflow" in classes or estimated_width(rows, head) > PHONE_COLUMN_PX
        )
    )
    edits: list[tuple[tuple[int, int], str]] = []
    for row in rows:
        if row in head:
            continue
        column = 0
        for c in row.cells:
            label = " / ".join(
                dict.fromkeys(x for x in labels[column : column + c.colspan] if x)
            )
            column += c.colspan
            short = ["posenc-short"] if 0 < len(reading(c.text)) <= SHORT_CELL else []
            extra = (  # CSS shows the label as plain text: inline math without its TeX
                f' data-label="{html.escape(reading(label), quote=True)}"'
                if reflow and label
                else ""
            )
            tag = table[c.tag[0] : c.tag[1]]
            if short or extra:
                edits.append((c.tag, with_attributes(tag, short, extra)))
    if reflow:
        # a header row in <tbody>: posenc.css hides it on a phone, as it hides a <thead>
        extra = " data-header-row" if head and not head[0].in_head else ""
        edits.append(
            (
                opening.span(),
                with_attributes(opening.group(0), ["posenc-reflow"], extra),
            )
        )
    out = table
    for (begin, finish), text in sorted(edits, reverse=True):
        out = out[:begin] + text + out[finish:]
    return out


def reflow_tables(body: str) -> str:
    """Every table of a page's body, its short cells kept on one line, reflowing on a phone where it would not
    fit."""
    return TABLE.sub(lambda m: reflow_table(m.group(0)), body)


def on_page_context(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    if "body" in context and "<table" in context["body"]:
        context["body"] = reflow_tables(context["body"])


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("html-page-context", on_page_context)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}

"""The table renderer of the reports, text and HTML.

`nbjit.stats()`, `nbjit.ranked_misses()`, `nbjit.profile()`, the run report
(``python -m nbjit run``) and the lab's compare table (`nbjit.bench.report`)
each build a `Table` of text cells and print it here: fixed-width text for
a terminal, and HTML for a notebook (what `_repr_html_` returns). A few
plain listings format their own columns (`nbjit.multiprocess.simulate`,
the command line's, scripts/).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Table"]


@dataclass(frozen=True)
class Table:
    """A header and rows of text cells, and how each column is shown.

    `right`: the text columns aligned right (numbers), the others left;
    `rule`: a dashed line under the header in text; `left`: the HTML columns
    aligned left (a notebook centres or right-aligns cells by default);
    `code`: the HTML columns shown as code (names, sites, paths).
    """

    header: Sequence[str]
    rows: Sequence[Sequence[str]]
    right: frozenset[int] = frozenset()
    rule: bool = False
    left: frozenset[int] = frozenset()
    code: frozenset[int] = frozenset()

    def lines(self) -> list[str]:
        """The fixed-width text, a line per row (columns two spaces apart)."""
        columns = len(self.header)
        widths = [max(len(row[i]) for row in [self.header, *self.rows]) for i in range(columns)]
        rows = [self.header, *([["-" * w for w in widths]] if self.rule else []), *self.rows]
        return ["  ".join(c.rjust(w) if i in self.right else c.ljust(w)
                          for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
                for row in rows]

    def text(self) -> str:
        return "\n".join(self.lines())

    def html(self, notes: Iterable[str] = ()) -> str:
        """The table as HTML, each of `notes` a paragraph after it (all escaped)."""
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.header)
        body = "".join("<tr>" + "".join(self._cell(i, c) for i, c in enumerate(row)) + "</tr>"
                       for row in self.rows)
        after = "".join(f"<p>{html.escape(note)}</p>" for note in notes)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{after}"

    def _cell(self, i: int, text: str) -> str:
        inner = html.escape(text)
        if i in self.code:
            inner = f"<code>{inner}</code>"
        style = " style='text-align:left'" if i in self.left else ""
        return f"<td{style}>{inner}</td>"

"""The one table renderer (nbjit/observe/table.py) every printed table uses."""

from nbjit.observe.table import Table


def test_text_aligns_columns_and_strips_trailing_space():
    table = Table(("name", "n", "note"), [("a", "1", ""), ("long", "12", "x")],
                  right=frozenset({1}))
    assert table.lines() == ["name   n  note", "a      1", "long  12  x"]


def test_text_rule_is_as_wide_as_each_column():
    table = Table(("col", "n"), [("abcde", "7")], right=frozenset({1}), rule=True)
    assert table.lines() == ["col    n", "-----  -", "abcde  7"]


def test_empty_table_is_its_header():
    assert Table(("a", "bb"), []).text() == "a  bb"


def test_html_escapes_cells_and_notes_and_marks_columns():
    table = Table(("f<x>", "n"), [("<lambda>", "3")], left=frozenset({0}),
                  code=frozenset({0}))
    page = table.html(["a < b"])
    assert page == ("<table><thead><tr><th>f&lt;x&gt;</th><th>n</th></tr></thead><tbody>"
                    "<tr><td style='text-align:left'><code>&lt;lambda&gt;</code></td>"
                    "<td>3</td></tr></tbody></table><p>a &lt; b</p>")

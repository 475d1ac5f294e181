"""How the ``kappa`` verbs print: messages, exceptions and data (paths, ids, commands) as text,
never as rich markup (``[/data/in]`` in a message is text, not a closing tag), and tables that fit
any width outside a terminal.

Only kappa's own words are styled, as ``(text, style)`` parts of :func:`say`.
"""

from __future__ import annotations

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text


def new_console() -> Console:
    """The console of a verb, on stdout. Outside a terminal (a pipe, a file, a CI log) long lines
    are not wrapped: a path or a command stays on one line, whole."""
    console = Console()
    if not console.is_terminal:
        console.soft_wrap = True
    return console


def say(console: Console, *parts: str | tuple[str, str]) -> None:
    """Print one message: each string part as it is (no markup, no emoji codes), each
    ``(text, style)`` part styled (kappa's own words only)."""
    console.print(Text.assemble(*parts))


def plain(cell: RenderableType | None) -> str:
    """The text of a table cell or header, on one line."""
    if cell is None:
        return ""
    text = cell.plain if isinstance(cell, Text) else str(cell)
    return " ".join(text.split())


def print_table(console: Console, table: Table) -> None:
    """``table`` in a terminal. Elsewhere nothing is cut or folded: its title, then one line per
    row, its first cell then ``header: cell`` for the others (empty cells left out)."""
    if console.is_terminal:
        console.print(table)
        return
    if table.title:
        console.print(Text(plain(table.title)))
    first, *others = table.columns
    for i, key in enumerate(first.cells):
        fields = ((plain(c.header), plain(list(c.cells)[i])) for c in others)
        line = "; ".join(f"{header}: {value}" for header, value in fields if value)
        console.print(Text(f"  {plain(key)}  {line}"))

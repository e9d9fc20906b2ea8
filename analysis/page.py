"""The report's page as a list of blocks, and its two renderings of that list: `markdown` (report.md: figures by file
name, collapsed parts in <details>, which GitHub and MLflow render) and `html` (report.html: one self-contained file,
its figures inlined as data: URLs, its style report.css beside this module, read when the page is rendered).

A block is one of Title, Paragraphs, Bullets, Table, Figure, Figures and Details (a summary over blocks of its own,
collapsed). What the page says, and in which order, is analysis/text.py's (`report_blocks`); how each kind of block
is written in each format is this module's, once. A table's hints (numeric columns, failed rows, a heading per
group of rows, the claim a cell states) are the HTML's; Markdown has no way to show them and writes the cells alone.
"""

from __future__ import annotations

import base64
import html as html_
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Sequence

STYLE = "report.css"  # beside this module, in the package's data (pyproject.toml's package-data)


# --- the blocks --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Title:
    text: str
    level: int = 2  # 1: the page's own title (the HTML's <title> too)


@dataclass(frozen=True)
class Paragraphs:
    lines: Sequence[str]  # one paragraph each; empty ones are left out
    style: str = ""  # the HTML's class: "finding", "small"
    id: str = ""  # the HTML id of the first paragraph


@dataclass(frozen=True)
class Bullets:
    items: Sequence[str]


@dataclass(frozen=True)
class Table:
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    numeric: range = range(0)  # columns of numbers: tabular figures, an interval under its estimate (`stacked`)
    stacked: bool = True
    failed: Sequence[bool] = ()  # per row: a failed fit or incomplete runs, in another colour
    groups: Sequence[str] = ()  # per row, a heading: a heading row where it changes
    marks: Sequence[Sequence[str]] = ()  # per cell, the claim it states ("moves A"), coloured; "" for none


@dataclass(frozen=True)
class Figure:
    path: Path
    alt: str
    caption: str = ""
    id: str = ""


@dataclass(frozen=True)
class Figures:
    """Figures side by side: (path, alt) each."""

    items: Sequence[tuple[Path, str]]


@dataclass(frozen=True)
class Details:
    """A summary line over blocks that stay collapsed until it is opened."""

    summary: str
    blocks: Sequence[object]


# --- Markdown ----------------------------------------------------------------------------------------------------


def md_line(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def md_table(headers: Sequence[str], rows_cells: Sequence[Sequence[str]]) -> str:
    return "\n".join([md_line(headers), "|" + "---|" * len(headers)] + [md_line(c) for c in rows_cells])


def markdown(blocks: Sequence[object]) -> str:
    """report.md: the blocks in order, a blank line between them."""
    return "\n\n".join(_md_blocks(blocks)) + "\n"


def _md_blocks(blocks: Sequence[object]) -> list[str]:
    return [text for text in (_md(block) for block in blocks) if text]


def _md(block) -> str:
    if isinstance(block, Title):
        return f"{'#' * block.level} {block.text}"
    if isinstance(block, Paragraphs):
        return "\n\n".join(line for line in block.lines if line)
    if isinstance(block, Bullets):
        return "\n".join(f"- {item}" for item in block.items)
    if isinstance(block, Table):
        return md_table(block.headers, block.rows)
    if isinstance(block, Figure):
        return f"![{block.alt}]({block.path.name})" + (f"\n\n{block.caption}" if block.caption else "")
    if isinstance(block, Figures):
        return "\n".join(f"![{alt}]({path.name})" for path, alt in block.items)
    if isinstance(block, Details):
        inner = "\n\n".join(_md_blocks(block.blocks))
        return f"<details><summary>{block.summary}</summary>\n\n{inner}\n\n</details>"
    raise TypeError(f"no Markdown for {block!r}")


# --- HTML --------------------------------------------------------------------------------------------------------


def html(blocks: Sequence[object]) -> str:
    """report.html, self-contained: the blocks in order, the page's title its first level-1 Title's, the style
    inlined."""
    title = next((b.text for b in blocks if isinstance(b, Title) and b.level == 1), "")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{html_.escape(title)}</title>
<style>{style()}</style></head>
<body>
{_html_blocks(blocks)}
</body></html>
"""


def style() -> str:
    """The page's CSS, report.css."""
    return resources.files(__package__).joinpath(STYLE).read_text(encoding="utf-8")


def _html_blocks(blocks: Sequence[object]) -> str:
    return "\n".join(text for text in (_html(block) for block in blocks) if text)


def _html(block) -> str:
    esc = html_.escape
    if isinstance(block, Title):
        return f"<h{block.level}>{esc(block.text)}</h{block.level}>"
    if isinstance(block, Paragraphs):
        return _paragraphs(block)
    if isinstance(block, Bullets):
        return "<ul>" + "".join(f"<li>{esc(item)}</li>" for item in block.items) + "</ul>"
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Figure):
        caption = f"<figcaption>{esc(block.caption)}</figcaption>" if block.caption else ""
        return f"<figure>{_img(block.path, block.alt, block.id)}{caption}</figure>"
    if isinstance(block, Figures):
        return '<div class="plots">\n' + "\n".join(_img(path, alt) for path, alt in block.items) + "\n</div>"
    if isinstance(block, Details):
        return f"<details><summary>{esc(block.summary)}</summary>\n{_html_blocks(block.blocks)}\n</details>"
    raise TypeError(f"no HTML for {block!r}")


def _attrs(attrs: dict[str, str]) -> str:
    """ ' class="small" id="x"': the attributes given a value."""
    return "".join(f' {name}="{html_.escape(value)}"' for name, value in attrs.items() if value)


def _paragraphs(block: Paragraphs) -> str:
    lines = [line for line in block.lines if line]
    return "\n".join(f"<p{_attrs({'class': block.style, 'id': block.id if k == 0 else ''})}>{html_.escape(line)}</p>"
                     for k, line in enumerate(lines))


def _img(path: Path, alt: str, id_: str = "") -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    ident = _attrs({"id": id_})
    return f'<img{ident} alt="{html_.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(table: Table) -> str:
    """A table; with `groups`, a heading row where the heading changes."""
    head = "".join(f"<th>{html_.escape(h)}</th>" for h in table.headers)
    body, last = [], None
    for k, cells in enumerate(table.rows):
        if table.groups and table.groups[k] != last:
            last = table.groups[k]
            body.append(f'<tr class="group"><td colspan="{len(table.headers)}">{html_.escape(last)}</td></tr>')
        failed = bool(table.failed) and table.failed[k]
        marks = table.marks[k] if table.marks else [""] * len(cells)
        tds = "".join(_cell(table, i, cell, mark) for i, (cell, mark) in enumerate(zip(cells, marks)))
        body.append(f"<tr{_attrs({'class': 'failed' if failed else ''})}>{tds}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n" + "\n".join(body) + "\n</tbody></table>"


def _cell(table: Table, i: int, cell: str, mark: str) -> str:
    """A cell: a claim's in its colour, a number in tabular figures (an interval below it where `stacked`)."""
    number = i in table.numeric
    klass = f"v-{mark.replace(' ', '')}" if mark else "num" if number else ""
    text = html_.escape(cell)
    if number and table.stacked:
        text = text.replace(" [", "<br>[")
    return f"<td{_attrs({'class': klass})}>{text}</td>"

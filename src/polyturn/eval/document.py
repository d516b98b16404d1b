"""A tiny document model rendered to Markdown and to self-contained HTML.

Reports are built once as a list of blocks, then rendered twice, so the
Markdown and the HTML always carry the same text and numbers. HTML embeds
every image as a base64 PNG data URI and uses no external asset.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Heading:
    """A section title (level 1-3)."""

    text: str
    level: int = 2


@dataclass(frozen=True)
class Para:
    """A paragraph of plain text."""

    text: str


@dataclass(frozen=True)
class Bullets:
    """A list of plain-text items."""

    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    """A table of plain-text cells."""

    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Code:
    """Preformatted text (transcripts, tree rules)."""

    text: str


@dataclass(frozen=True)
class Image:
    """A PNG figure; ``name`` is its file stem under the figure directory."""

    name: str
    caption: str
    png: bytes


Block = Heading | Para | Bullets | Table | Code | Image


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: Sequence[Block], *, image_dir: str = "figures") -> str:
    """Markdown; images link to ``<image_dir>/<name>.png`` (written by :func:`write_images`)."""
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append("#" * b.level + " " + b.text)
        elif isinstance(b, Para):
            out.append(b.text)
        elif isinstance(b, Bullets):
            out.append("\n".join(f"- {i}".replace("\n", " ") for i in b.items))
        elif isinstance(b, Table):
            lines = ["| " + " | ".join(_md_cell(h) for h in b.headers) + " |",
                     "|" + "|".join("---" for _ in b.headers) + "|"]
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("\n".join(lines))
        elif isinstance(b, Code):
            fence = "````" if "```" in b.text else "```"
            out.append(f"{fence}text\n{b.text}\n{fence}")
        elif isinstance(b, Image):
            out.append(f"![]({image_dir}/{b.name}.png)\n\n{b.caption}")
    return "\n\n".join(out) + "\n"


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1180px;margin:24px auto;padding:0 16px;color:#222}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f2f2f2}
pre{background:#f7f7f7;border:1px solid #e2e2e2;padding:8px;overflow-x:auto;font-size:12px;white-space:pre-wrap}
figure{margin:12px 0 20px}
figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:13px;color:#555}
"""


def to_html(blocks: Sequence[Block], *, title: str) -> str:
    """A standalone HTML page: inline CSS, images as ``data:image/png;base64`` URIs, no scripts."""
    e = html.escape
    body: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{e(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            body.append(f"<p>{e(b.text)}</p>")
        elif isinstance(b, Bullets):
            body.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{e(h)}</th>" for h in b.headers)
            rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in b.rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif isinstance(b, Code):
            body.append(f"<pre>{e(b.text)}</pre>")
        elif isinstance(b, Image):
            data = base64.b64encode(b.png).decode("ascii")
            body.append(f'<figure><img src="data:image/png;base64,{data}" alt="{e(b.name)}">'
                        f"<figcaption>{e(b.caption)}</figcaption></figure>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{e(title)}</title><style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_images(blocks: Sequence[Block], directory: str | Path) -> list[Path]:
    """Write every :class:`Image` block to ``directory/<name>.png``."""
    directory = Path(directory)
    paths = []
    for b in blocks:
        if isinstance(b, Image):
            directory.mkdir(parents=True, exist_ok=True)
            p = directory / f"{b.name}.png"
            p.write_bytes(b.png)
            paths.append(p)
    return paths

"""The ``plot`` tool: render a bar or line chart to a PNG file.

Spec (the tool's JSON args)::

    {"kind": "bar" | "line", "title": str, "x": [labels], "y": [numbers]}
    {"kind": "line", "title": str, "from_last_result": true}

``from_last_result`` takes x from the first column and y from the last column
of the last successful query. matplotlib is imported only when a chart is
drawn, through its object API (no pyplot, no global backend switch), so the
env stays light and never opens a window.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MAX_POINTS = 200
_KEYS = {"kind", "title", "x", "y", "from_last_result"}
_RENDER_LOCK = threading.Lock()  # matplotlib's font cache is not thread-safe (collectors step envs in threads)


class ChartSpecError(ValueError):
    """The chart spec is invalid; the message says what was expected."""


def chart_data(
    spec: Mapping[str, Any], last_result: tuple[Sequence[str], Sequence[Sequence[Any]]] | None
) -> tuple[str, str, list[str], list[float]]:
    """Validate a spec and return ``(kind, title, x, y)``; raises :class:`ChartSpecError`."""
    unknown = set(spec) - _KEYS
    if unknown:
        raise ChartSpecError(f"Expected chart keys among {sorted(_KEYS)}, got unknown {sorted(unknown)}")
    kind = spec.get("kind", "bar")
    if kind not in ("bar", "line"):
        raise ChartSpecError(f"Expected kind 'bar' or 'line', got {kind!r}")
    title = spec.get("title", "")
    if not isinstance(title, str) or len(title) > 200:
        raise ChartSpecError(f"Expected title as a string of at most 200 characters, got {title!r:.60}")
    if spec.get("from_last_result") is True:
        if "x" in spec or "y" in spec:
            raise ChartSpecError("Expected either from_last_result or x and y, got both")
        if last_result is None:
            raise ChartSpecError("Expected a previous query for from_last_result, got none")
        if not last_result[1]:
            raise ChartSpecError("Expected rows to plot from the last query, but it returned none")
        columns, rows = last_result
        x_raw, y_raw = [r[0] for r in rows], [r[-1] for r in rows]
        title = title or " by ".join(reversed([columns[-1], columns[0]]))
    else:
        x_raw, y_raw = spec.get("x"), spec.get("y")
    if not isinstance(x_raw, list) or not isinstance(y_raw, list):
        raise ChartSpecError("Expected lists 'x' and 'y' (or \"from_last_result\": true)")
    if not 1 <= len(x_raw) <= MAX_POINTS or len(x_raw) != len(y_raw):
        raise ChartSpecError(f"Expected x and y of equal length 1..{MAX_POINTS}, got {len(x_raw)} and {len(y_raw)}")
    y: list[float] = []
    for v in y_raw:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ChartSpecError(f"Expected numbers in y, got {v!r:.40}")
        y.append(float(v))
    return kind, title, [str(v)[:40] for v in x_raw], y


def render_chart(*, kind: str, title: str, x: list[str], y: list[float], path: Path) -> Path:
    """Draw the chart into ``path`` (PNG) and return it."""
    with _RENDER_LOCK:
        return _render(kind=kind, title=title, x=x, y=y, path=path)


def _render(*, kind: str, title: str, x: list[str], y: list[float], path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.5), dpi=72)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if kind == "bar":
        ax.bar(x, y)
    else:
        ax.plot(x, y, marker="o")
    ax.set_title(title)
    if len(x) > 6:
        ax.tick_params(axis="x", labelrotation=45)
    # A fixed layout instead of tight_layout(), which would double the render time.
    fig.subplots_adjust(left=0.14, right=0.97, top=0.9, bottom=0.25 if len(x) > 6 else 0.12)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # The bundled font has no CJK glyphs; a title in Chinese draws boxes, which is fine for a chart file.
        warnings.filterwarnings("ignore", message="Glyph .* missing")
        fig.savefig(path, format="png")
    return path

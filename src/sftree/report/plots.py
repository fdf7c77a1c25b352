"""A tiny dependency-free SVG plot: axes with ticks, lines, points, shaded x-bands, a title and a legend.

    from sftree.report.plots import Band, Series, svg_plot, save_svg
    svg = svg_plot(
        [Series([1, 2, 3], [0.5, None, 0.9], kind="line", label="smoothed"),
         Series([2], [0.7], kind="points", marker="diamond", color="#d62728", label="chosen")],
        title="Score", xlabel="eval", ylabel="score",
        bands=[Band(0.5, 1.5, "#1f77b4", "early")])
    save_svg("plot.svg", svg)

`None` values are skipped (a line breaks there). Lines and points with more than `max_points` values are thinned
evenly so a 100k-point run still gives a small file. Text is escaped; the result is a standalone SVG string.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from sftree.fileio import write_text_atomic

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
MARKERS = ("circle", "square", "diamond", "cross", "ring")


@dataclass
class Series:
    x: Sequence[float]
    y: Sequence[float | None]
    kind: str = "line"  # line | points
    label: str | None = None
    color: str | None = None  # default: next palette colour
    marker: str = "circle"  # for points: circle | square | diamond | cross | ring
    size: float = 3.0  # marker radius in px
    width: float = 1.5  # line width in px
    dash: str | None = None  # e.g. "4 3"
    opacity: float = 1.0


@dataclass
class Band:
    """A shaded vertical strip from x0 to x1 (data units), labelled in the legend."""

    x0: float
    x1: float
    color: str
    label: str | None = None
    opacity: float = 0.12


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About `count` round tick values (steps of 1, 2, 2.5 or 5 times a power of ten) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        return [lo]
    raw = (hi - lo) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    v = first
    while v <= hi + step * 1e-9:
        ticks.append(0.0 if abs(v) < step * 1e-9 else v)
        v = first + len(ticks) * step
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-3:
        return f"{v:.2g}"
    return f"{v:.6g}"


def _thin(x: Sequence, y: Sequence, max_points: int) -> list[tuple[float, float | None]]:
    pairs = list(zip(x, y, strict=True))
    if len(pairs) <= max_points:
        return pairs
    step = len(pairs) / max_points
    return [pairs[int(i * step)] for i in range(max_points)] + [pairs[-1]]


def _marker(shape: str, cx: float, cy: float, r: float, color: str, opacity: float) -> str:
    a = f'fill="{color}" fill-opacity="{opacity}"'
    if shape == "square":
        return f'<rect x="{cx - r:.1f}" y="{cy - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" {a}/>'
    if shape == "diamond":
        pts = f"{cx:.1f},{cy - r * 1.3:.1f} {cx + r * 1.3:.1f},{cy:.1f} {cx:.1f},{cy + r * 1.3:.1f} {cx - r * 1.3:.1f},{cy:.1f}"
        return f'<polygon points="{pts}" {a}/>'
    if shape == "cross":
        return (
            f'<path d="M{cx - r:.1f},{cy - r:.1f}L{cx + r:.1f},{cy + r:.1f}M{cx - r:.1f},{cy + r:.1f}'
            f'L{cx + r:.1f},{cy - r:.1f}" stroke="{color}" stroke-width="1.6" stroke-opacity="{opacity}"/>'
        )
    if shape == "ring":
        return (
            f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{r:.1f}" fill="none" stroke="{color}" '
            f'stroke-width="1.6" stroke-opacity="{opacity}"/>'
        )
    return f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{r:.1f}" {a}/>'


def svg_plot(
    series: Sequence[Series],
    *,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    bands: Sequence[Band] = (),
    width: int = 860,
    height: int = 420,
    legend: bool = True,
    max_points: int = 4000,
) -> str:
    """Render the series (and bands) on shared linear axes; returns the SVG document as a string."""
    esc = html.escape
    left, right, top, bottom = 70, 170 if legend else 20, 36, 50
    pw, ph = width - left - right, height - top - bottom
    xs = [float(v) for s in series for v in s.x] + [v for b in bands for v in (b.x0, b.x1)]
    ys = [float(v) for s in series for v in s.y if v is not None and math.isfinite(v)]
    x_lo, x_hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    y_lo, y_hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 0.5, x_hi + 0.5
    if y_hi == y_lo:
        pad = abs(y_lo) * 0.05 or 0.5
        y_lo, y_hi = y_lo - pad, y_hi + pad
    pad = (y_hi - y_lo) * 0.05
    y_lo, y_hi = y_lo - pad, y_hi + pad

    def px(v: float) -> float:
        return left + (v - x_lo) / (x_hi - x_lo) * pw

    def py(v: float) -> float:
        return top + (y_hi - v) / (y_hi - y_lo) * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    if title:
        out.append(
            f'<text x="{left + pw / 2:.1f}" y="20" text-anchor="middle" font-size="14">{esc(title)}</text>'
        )
    for b in bands:
        x0, x1 = px(max(b.x0, x_lo)), px(min(b.x1, x_hi))
        out.append(
            f'<rect x="{x0:.1f}" y="{top}" width="{max(0.0, x1 - x0):.1f}" height="{ph}" '
            f'fill="{b.color}" fill-opacity="{b.opacity}"/>'
        )
    # Axes, grid and ticks.
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
    for t in nice_ticks(x_lo, x_hi, 8):
        x = px(t)
        out.append(f'<line x1="{x:.1f}" y1="{top + ph}" x2="{x:.1f}" y2="{top + ph + 4}" stroke="#444"/>')
        out.append(f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle">{_fmt(t)}</text>')
    for t in nice_ticks(y_lo, y_hi, 6):
        y = py(t)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    if xlabel:
        out.append(
            f'<text x="{left + pw / 2:.1f}" y="{height - 12}" text-anchor="middle">{esc(xlabel)}</text>'
        )
    if ylabel:
        out.append(
            f'<text x="16" y="{top + ph / 2:.1f}" text-anchor="middle" '
            f'transform="rotate(-90 16 {top + ph / 2:.1f})">{esc(ylabel)}</text>'
        )
    # Data.
    legend_rows: list[tuple[str, str, str]] = [(b.label, b.color, "band") for b in bands if b.label]
    for n, s in enumerate(series):
        color = s.color or PALETTE[n % len(PALETTE)]
        pairs = _thin(s.x, s.y, max_points)
        if s.kind == "line":
            runs, run = [], []
            for x, y in pairs:
                if y is None or not math.isfinite(y):
                    if run:
                        runs.append(run)
                    run = []
                else:
                    run.append(f"{px(x):.1f},{py(y):.1f}")
            if run:
                runs.append(run)
            dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
            for r in runs:
                out.append(
                    f'<polyline points="{" ".join(r)}" fill="none" stroke="{color}" '
                    f'stroke-width="{s.width}" stroke-opacity="{s.opacity}"{dash}/>'
                )
        else:
            for x, y in pairs:
                if y is not None and math.isfinite(y):
                    out.append(_marker(s.marker, px(x), py(y), s.size, color, s.opacity))
        if s.label:
            legend_rows.append((s.label, color, s.kind if s.kind == "line" else s.marker))
    if legend and legend_rows:
        lx = left + pw + 12
        for i, (label, color, kind) in enumerate(legend_rows):
            y = top + 10 + i * 18
            if kind == "band":
                out.append(
                    f'<rect x="{lx}" y="{y - 6}" width="16" height="12" fill="{color}" fill-opacity="0.25"/>'
                )
            elif kind == "line":
                out.append(
                    f'<line x1="{lx}" y1="{y}" x2="{lx + 16}" y2="{y}" stroke="{color}" stroke-width="2"/>'
                )
            else:
                out.append(_marker(kind, lx + 8, y, 4, color, 1.0))
            out.append(f'<text x="{lx + 22}" y="{y + 4}">{esc(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def save_svg(path, svg: str) -> None:
    """Write the SVG atomically (parent folders are created)."""
    write_text_atomic(path, svg)

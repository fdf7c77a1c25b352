"""The small SVG plot helper (sftree.report.plots)."""

import re
import xml.etree.ElementTree as ET

import pytest

from sftree.report.plots import Band, Series, nice_ticks, svg_plot


def test_nice_ticks():
    assert nice_ticks(0, 10, 5) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(0.13, 0.91, 4) == pytest.approx([0.2, 0.4, 0.6, 0.8])  # raw step 0.195 -> 0.2
    assert nice_ticks(0, 1, 4) == [0, 0.25, 0.5, 0.75, 1.0]  # 0.25 -> 2.5 x 0.1
    assert nice_ticks(-3, 3, 3) == [-2, 0, 2]
    assert nice_ticks(5, 5) == [5]


def test_svg_is_valid_and_has_every_part():
    svg = svg_plot(
        [
            Series([1, 2, 3, 4], [1.0, None, 3.0, 4.0], "line", "smooth <x>"),
            Series([2, 3], [2.0, 3.0], "points", "chosen", marker="diamond"),
            Series([4], [4.0], "points", "failed", marker="cross"),
        ],
        title="T & t",
        xlabel="index",
        ylabel="score",
        bands=[Band(0.5, 2.5, "#00f", "early"), Band(2.5, 4.5, "#f00", "late")],
    )
    root = ET.fromstring(svg)  # well-formed XML, text escaped
    assert root.tag.endswith("svg")
    assert svg.count("<polyline") == 2  # the None splits the line in two runs
    assert svg.count("<polygon") == 3  # two diamonds in the plot and the legend swatch
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "T & t" in texts and "smooth <x>" in texts and "early" in texts and "late" in texts
    assert len(re.findall(r'fill-opacity="0.12"', svg)) == 2  # two bands


def test_many_points_are_thinned():
    n = 100_000
    svg = svg_plot([Series(list(range(n)), [float(i % 13) for i in range(n)], "points")], max_points=500)
    assert svg.count("<circle") <= 502

"""The HTML report of a run and its dependency-free SVG plots."""

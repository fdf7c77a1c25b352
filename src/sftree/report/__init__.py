"""The HTML report of a run (its SVG plots are drawn by sftree.svg, shared with stage 1)."""

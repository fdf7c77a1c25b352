"""Stages 3 and 4 of the pipeline, the dataset: the best root-to-leaf paths of each tree, SFT JSONL and its card.

Path selection is algorithm.md section 3; the export is the design's (DESIGN.md, "SFT export"). Stages are
numbered in the pipeline's order (1 roots, 2 search, 3 path selection, 4 export: docs/architecture.md); the
method's sections keep algorithm.md's numbers.
"""

"""Stage 1 of the pipeline, root selection: read a Student run, split it into stages, pick and place the roots.

The method is algorithm.md section 2 (snapshot selection). Stages are numbered in the pipeline's order (1 roots,
2 search, 3 path selection, 4 export: docs/architecture.md); the method's sections keep algorithm.md's numbers.
"""

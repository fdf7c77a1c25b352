"""Stage 2 of the pipeline, the search: one tree per root, grown by a token-aware MCTS over two-turn edges.

The method is algorithm.md section 1 (MCTS). Stages are numbered in the pipeline's order (1 roots, 2 search,
3 path selection, 4 export: docs/architecture.md); the method's sections keep algorithm.md's numbers.
"""

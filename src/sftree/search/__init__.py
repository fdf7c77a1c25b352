"""Stage 2, the search (seed section 1): one tree per root, grown by a token-aware MCTS over two-turn edges."""

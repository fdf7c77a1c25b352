"""sftree: turn a Student model's Coral run into agentic SFT data with a token-aware MCTS of Teacher sessions."""

__version__ = "0.1.0"

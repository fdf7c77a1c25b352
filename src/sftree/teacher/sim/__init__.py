"""teacher-sim: a deterministic OpenAI-compatible stand-in for SGLang (server.py) with a seeded policy (policy.py)."""

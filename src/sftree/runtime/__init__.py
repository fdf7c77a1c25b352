"""Where the Teacher's edges run: forkable workspaces, the sandbox, `coral` and the grader, process control."""

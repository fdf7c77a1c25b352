"""Shared test helpers, one module per subject: `from helpers.<module> import ...` (tests/conftest.py puts tests/
on sys.path; a script run in a subprocess gets it through PYTHONPATH). No test module imports another.

cli: the CLI in-process, failing with one line. coral: the real Coral (.venv-coral), its runs and the two grading
worlds. coralrun: synthetic Coral-shaped runs (git fast-import) for import-coral. examples: the example Student run,
generated once per session. explore: a root, a config and a run of `sftree explore`. export: hand-written tree
folders for the export and report tests, their paths.json and report. fleet: the workflow against a router,
workers signalled. mcts: hand-built EdgeResults and trees for search/mcts.py. roots: hand-made Student runs for
select-roots. runtime: tasks, roots and configs for the Teacher runtime tests. scripted: the scripted Teacher of
the security tests. slurm: the localhost Slurm cluster. tree_rules: an independent checker of sections 1 and 3 on
a tree. workflow: `snakemake` on a work folder. world: a World over the example task, hand-made attempt records.
"""

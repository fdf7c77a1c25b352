"""sftree's stand-in for the small part of Coral a task's grader imports (`coral.grader.TaskGrader`,
`coral.types.ScoreBundle`), put on the grader's path only when no Coral is installed. Not Coral: the same
interface, sftree's own code (sftree/world/grading.py)."""

__version__ = "stand-in"

"""The Teacher's world: what Coral shows an agent, rendered by the user's installed Coral or, without one, by
sftree's stand-ins in the same formats (docs/runtime.md, "The Teacher's world"); Coral task folders and their
TaskGraders graded confined (docs/security.md, "Grading a Coral task").

    from sftree.world import open_world, read_root_context, load_task, grade, CoralCounters
"""

from sftree.world.counters import CoralCounters, advance, daemon_status
from sftree.world.grading import GradeResult, grade
from sftree.world.locate import CoralInstall, locate
from sftree.world.root import RootContext, read_root_context
from sftree.world.task import TaskSpec, load_coral_task, load_task
from sftree.world.text import one_line, quoted, safe_attempt
from sftree.world.world import CommandOutput, EvalArgs, TurnPrompt, World, open_world, standin_cli_source

__all__ = [
    "CommandOutput",
    "CoralCounters",
    "CoralInstall",
    "EvalArgs",
    "GradeResult",
    "RootContext",
    "TaskSpec",
    "TurnPrompt",
    "World",
    "advance",
    "daemon_status",
    "grade",
    "load_coral_task",
    "load_task",
    "locate",
    "one_line",
    "open_world",
    "quoted",
    "read_root_context",
    "safe_attempt",
    "standin_cli_source",
]

"""The Teacher's world: what Coral shows an agent, rendered by the user's installed Coral or, without one, by
sftree's stand-ins in the same formats (docs/runtime.md, "The Teacher's world"); Coral task folders and their
TaskGraders graded confined (docs/security.md, "Grading a Coral task").

    world.py (World, open_world), counters.py (CoralCounters), task.py (load_task), grading.py (grade), root.py
"""

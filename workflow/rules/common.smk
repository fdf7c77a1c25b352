import glob
import os

RESULTS = config["results"]
TASKS = list(config["tasks"])
CONFIGFILES = [os.path.abspath(f) for f in workflow.configfiles]


wildcard_constraints:
    task="[^/]+",
    root="eval-[^/]+",


def task_snapshot_dir(task):
    """A task's eval-* folder: its own `snapshots` key, <snapshots>/<task>, or <snapshots> itself for one task."""
    entry = config["tasks"][task]
    if entry.get("snapshots"):
        return entry["snapshots"]
    nested = os.path.join(config["snapshots"], task)
    if os.path.isdir(nested) or len(TASKS) > 1:
        return nested
    return config["snapshots"]


def task_metadata_files(wildcards):
    """Every snapshot's metadata.json, so a new or changed snapshot reruns select_roots."""
    return sorted(
        glob.glob(os.path.join(task_snapshot_dir(wildcards.task), "eval-*", "metadata.json"))
    )


def chosen_roots(task):
    """Root names chosen by the select_roots checkpoint (re-evaluated once it has run)."""
    roots_dir = checkpoints.select_roots.get(task=task).output.roots
    return sorted(
        d
        for d in os.listdir(roots_dir)
        if os.path.isfile(os.path.join(roots_dir, d, "metadata.json"))
    )


def config_args():
    return " ".join(f"--config {f}" for f in CONFIGFILES[-1:])

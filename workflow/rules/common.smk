import glob
import logging
import os
import re
import sys

# Rules call `sftree` (and graders `python3`) by name. Put the bin folder of the interpreter Snakemake runs
# with first on PATH when sftree is installed there, so `.venv/bin/snakemake` uses the venv's tools without
# the venv being activated (jobs inherit it; `--sdm conda` still puts its env's bin before it).
_BIN = os.path.dirname(sys.executable)
if os.path.isfile(os.path.join(_BIN, "sftree")):
    os.environ.update(PATH=_BIN + os.pathsep + os.environ.get("PATH", ""))


class _NoAccountGuessWarnings(logging.Filter):
    """Quiet on a Slurm cluster without accounting: with `slurm-no-account: true` in the profile
    (profiles/slurm-local) no account is wanted, but snakemake-executor-plugin-slurm 2.8.0 does not read that
    option and, given no `slurm_account`, tries to guess one with sacct, warns three times and submits without
    `-A`. That is the run asked for, so its warnings about the guess are dropped (all else passes).
    """

    GUESSING = (
        "No SLURM account given, trying to guess",
        "not able to get a SLURM account via sacct",
        "Unable to guess SLURM account",
    )

    def filter(self, record):
        # executor_settings is set after the Snakefile is read, before the first job is submitted.
        if not getattr(workflow.executor_settings, "no_account", False):
            return True
        return not any(text in record.getMessage() for text in self.GUESSING)


logging.getLogger("snakemake.logging").addFilter(_NoAccountGuessWarnings())

RESULTS = config["results"]
TASKS = list(config["tasks"])

# Resuming is the same command: a lock a killed run left (its recorded owners all dead) is removed and the dead
# runs' temporary folders swept, each said in one line, before Snakemake locks the folder; a live run's lock stays
# (runtime/runowner.py). Only the main process: jobs that read the Snakefile again (Slurm) are part of the run.
if workflow.is_main_process:
    from sftree.runtime.runowner import start_of_run

    start_of_run(".snakemake", lambda line: print(line, file=sys.stderr))


onstart:
    # SIGTERM (Slurm's time limit, scancel, `kill`): Snakemake's own handler only stops scheduling and waits for
    # the running jobs, which would go on for hours; they get the SIGTERM too (each `sftree explore` ends what it
    # started and removes its folders; the rerun resumes the trees), then Snakemake's handler runs as before.
    # Jobs run here (not on a cluster, where they outlive Snakemake by design) watch this process and end when it
    # is gone, even by `kill -9` (runtime/runwatch.py).
    from sftree.runtime import runwatch
    from sftree.runtime.runowner import forward_sigterm

    forward_sigterm()
    if workflow.local_exec:
        runwatch.add_self(os.environ)


wildcard_constraints:
    task="[^/]+",
    root="eval-[^/]+",


EXAMPLE_RUN = config.get("example_run")
# Tasks that start from a standard Coral run folder (`tasks.<task>.coral_run`): the import_coral rule makes
# their eval-* snapshots in <snapshots>/<task> (coral.smk).
CORAL_TASKS = [t for t in TASKS if config["tasks"][t].get("coral_run")]
for _task in CORAL_TASKS:
    if EXAMPLE_RUN:
        raise ValueError(
            f"config: tasks.{_task}.coral_run and example_run exclude each other (both make <snapshots>/<task>)"
        )
    if config["tasks"][_task].get("snapshots"):
        raise ValueError(
            f"config: tasks.{_task} has coral_run and snapshots: the Coral run is imported into "
            f"<snapshots>/{_task}; drop its snapshots key"
        )


def coral_attempt_dirs(task):
    """The attempts folders of a task's Coral run: each island's (`.coral/islands/<id>/attempts`, a multi-island
    run) or `.coral/public/attempts`; a record added or graded changes its folder's mtime.
    """
    coral = os.path.join(config["tasks"][task]["coral_run"], ".coral")
    islands = os.path.join(coral, "islands")
    if os.path.isdir(islands):
        found = sorted(glob.glob(os.path.join(islands, "*", "attempts")))
        if found:
            return found
    return [os.path.join(coral, "public", "attempts")]


def task_direction(task):
    """maximize | minimize: a Coral task folder's task.yaml (grader.direction), else the entry's `direction`."""
    from sftree.settings import settings_of
    from sftree.world.task import task_config

    return task_config(settings_of(config), task)["direction"]


def task_snapshot_dir(task):
    """A task's eval-* folder: its own `snapshots` key, <snapshots>/<task>, or <snapshots> itself for one task.

    With `example_run`, or when the task imports a Coral run, the folder is that rule's output, always
    <snapshots>/<task>.
    """
    entry = config["tasks"][task]
    if entry.get("snapshots") and not EXAMPLE_RUN:
        return entry["snapshots"]
    nested = os.path.join(config["snapshots"], task)
    if EXAMPLE_RUN or task in CORAL_TASKS or os.path.isdir(nested) or len(TASKS) > 1:
        return nested
    return config["snapshots"]


def task_metadata_files(wildcards):
    """Every snapshot's metadata.json, so a new or changed snapshot reruns select_roots.

    With `example_run` the input is the generated folder itself (the example_run rule's output); for a task
    that imports a Coral run, the import's report (import_coral's output, rewritten by every import).
    """
    if EXAMPLE_RUN:
        return [task_snapshot_dir(wildcards.task)]
    if wildcards.task in CORAL_TASKS:
        return [os.path.join(task_snapshot_dir(wildcards.task), "import-coral.json")]
    return sorted(
        glob.glob(
            os.path.join(task_snapshot_dir(wildcards.task), "eval-*", "metadata.json")
        )
    )


def chosen_roots(task):
    """Root names chosen by the select_roots checkpoint (re-evaluated once it has run)."""
    roots_dir = checkpoints.select_roots.get(task=task).output.roots
    return sorted(
        d
        for d in os.listdir(roots_dir)
        if os.path.isfile(os.path.join(roots_dir, d, "metadata.json"))
    )


def task_paths_files(wildcards):
    """paths.json of every chosen root of one task (export_sft's input)."""
    return [
        f"{RESULTS}/{wildcards.task}/trees/{root}/paths.json"
        for root in chosen_roots(wildcards.task)
    ]


def all_paths_files(wildcards):
    """paths.json of every chosen root of every task (the report's input)."""
    return [
        f"{RESULTS}/{task}/trees/{root}/paths.json"
        for task in TASKS
        for root in chosen_roots(task)
    ]


def effective_config_file():
    """The validated, merged config (config.yaml + --configfile + --config) as one file for the CLI.

    Rules pass it as `--config`, so a command run by hand with that file sees exactly what the rule saw.
    It is rewritten only when its content changes, to keep its timestamp stable.
    """
    import yaml

    path = os.path.join(RESULTS, ".sftree", "config.yaml")
    text = yaml.safe_dump(dict(config), sort_keys=True)
    old = open(path).read() if os.path.exists(path) else None
    if old != text:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    return path


EFFECTIVE_CONFIG = effective_config_file()


def config_args():
    return f"--config {EFFECTIVE_CONFIG}"


TREE_PACKED = bool(config["export"]["tree_packed"])
ATIF = bool(config["export"]["atif"])


def atif_outputs(folder):
    """The ATIF trajectory file in `folder` (`export.atif`; none when it is off)."""
    return {"atif": f"{folder}/sft.atif.jsonl"} if ATIF else {}


def tree_outputs(folder):
    """The tree form's file and stats in `folder` (`export.tree_packed`; none when it is off)."""
    if not TREE_PACKED:
        return {}
    return {
        "tree": f"{folder}/sft.tree.jsonl",
        "tree_stats": f"{folder}/sft.tree.stats.json",
    }

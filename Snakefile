# sftree: Student Coral run -> root snapshots -> Teacher MCTS trees -> top paths -> SFT JSONL.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"


if EXAMPLE_RUN:

    include: "workflow/rules/example.smk"


if CORAL_TASKS:

    include: "workflow/rules/coral.smk"


include: "workflow/rules/grader.smk"
include: "workflow/rules/roots.smk"
include: "workflow/rules/explore.smk"
include: "workflow/rules/paths.smk"
include: "workflow/rules/export.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        f"{RESULTS}/sft.jsonl",
        f"{RESULTS}/dataset_info.json",
        f"{RESULTS}/report.html",

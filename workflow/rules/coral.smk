# A task with `coral_run: RUN_DIR` starts from a standard Coral run folder (what `coral start` made):
# `sftree import-coral` writes its eval-* snapshots into <snapshots>/<task> before select_roots reads them
# (docs/import_coral.md). The run's attempts folder (each island's, in a multi-island run) is the input: a record
# added or graded changes its mtime, so the next `snakemake` imports again, incrementally (finished snapshots are kept, new ones added, pending ones
# that were graded rebuilt). The declared output is the import's report; the snapshots it keeps beside it are
# not outputs, so Snakemake never deletes them before a rerun.
rule import_coral:
    input:
        attempts=lambda wc: coral_attempt_dirs(wc.task),
    output:
        report=os.path.join(config["snapshots"], "{task}", "import-coral.json"),
    log:
        f"{RESULTS}/{{task}}/logs/import_coral.log",
    benchmark:
        f"{RESULTS}/{{task}}/benchmarks/import_coral.tsv"
    wildcard_constraints:
        task="|".join(re.escape(t) for t in CORAL_TASKS),
    conda:
        "../../envs/sftree.yaml"
    threads: 2  # snapshot writers (making links is system-call bound)
    params:
        run=lambda wc: config["tasks"][wc.task]["coral_run"],
        out=lambda wc, output: os.path.dirname(output.report),
        direction=lambda wc: task_direction(wc.task),
        shared_items=",".join(config["import_coral"]["shared_items"]),
    shell:
        "sftree import-coral {params.run:q} --out {params.out:q} --task {wildcards.task}"
        " --direction {params.direction} --shared-items {params.shared_items} --jobs {threads}"
        " > {log} 2>&1"

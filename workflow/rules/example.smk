# The demo's Student run (config key `example_run`): a simulated Coral run of each example task, graded by
# the task's real grader, written to <snapshots>/<task> by scripts/make_example_snapshots.py. An ordinary
# target: made once, then select_roots reads it; a rerun has nothing to do.
rule example_run:
    input:
        script=os.path.join(workflow.basedir, "scripts", "make_example_snapshots.py"),
    output:
        snapshots=directory(os.path.join(config["snapshots"], "{task}")),
    log:
        f"{RESULTS}/{{task}}/logs/example_run.log",
    conda:
        "../../envs/sftree.yaml"
    threads: 2  # grader processes
    params:
        out=lambda wc, output: os.path.dirname(output.snapshots),
        snapshots_per_task=EXAMPLE_RUN["count"],
        seed=EXAMPLE_RUN["seed"],
    shell:
        "python3 {input.script} --out {params.out} --tasks {wildcards.task}"
        " --count {params.snapshots_per_task} --seed {params.seed} --workers {threads} > {log} 2>&1"

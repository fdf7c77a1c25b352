# Preflight of each task's grader, before any tree of it starts: a packaged Coral grader (task.yaml
# `grader.entrypoint` + `grader.setup`) gets its grader venv built once (cached outside results/, keyed by the
# task's grader section and files: sftree.world.grader_env) and its entrypoint checked. One line on failure.
rule grader_env:
    output:
        f"{RESULTS}/{{task}}/grader_env.json",
    log:
        f"{RESULTS}/{{task}}/grader_setup.log",
    conda:
        "../../envs/sftree.yaml"
    params:
        config=config_args(),
    message:
        "grader_env {wildcards.task}: the task's grader (a packaged grader's venv built or reused)"
    shell:
        "sftree grader-env --task {wildcards.task} --out {output} --log {log} {params.config}"

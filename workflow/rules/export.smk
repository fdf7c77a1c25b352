rule export_sft:
    input:
        paths=task_paths_files,
    output:
        **tree_outputs(f"{RESULTS}/{{task}}"),
        **atif_outputs(f"{RESULTS}/{{task}}"),
        sft=f"{RESULTS}/{{task}}/sft.jsonl",
        stats=f"{RESULTS}/{{task}}/sft.stats.json",
    log:
        f"{RESULTS}/{{task}}/logs/export_sft.log",
    conda:
        "../../envs/sftree.yaml"
    params:
        config=config_args(),
    shell:
        # The `export` section of the effective config says what to write (the form, the Student, the tree form
        # beside sft.jsonl when export.tree_packed, the ATIF trajectories when export.atif).
        "sftree export-sft --paths {input.paths} --out {output.sft} {params.config} > {log} 2>&1"


rule merge_sft:
    input:
        sft=expand(f"{RESULTS}/{{task}}/sft.jsonl", task=TASKS),
        stats=expand(f"{RESULTS}/{{task}}/sft.stats.json", task=TASKS),
        paths=all_paths_files,
        tree=(
            expand(f"{RESULTS}/{{task}}/sft.tree.jsonl", task=TASKS)
            if TREE_PACKED
            else []
        ),
        atif=expand(f"{RESULTS}/{{task}}/sft.atif.jsonl", task=TASKS) if ATIF else [],
    output:
        **tree_outputs(RESULTS),
        **atif_outputs(RESULTS),
        sft=f"{RESULTS}/sft.jsonl",
        stats=f"{RESULTS}/sft.stats.json",
        figures=f"{RESULTS}/sft.figures.json",
        info=f"{RESULTS}/dataset_info.json",
        llamafactory=f"{RESULTS}/sft_llamafactory.jsonl",
        card=report(f"{RESULTS}/dataset_card.md", category="Dataset"),
    log:
        f"{RESULTS}/logs/merge_sft.log",
    conda:
        "../../envs/sftree.yaml"
    params:
        results=lambda wc, output: os.path.dirname(output.sft),
        config=config_args(),
    shell:
        # export.dedupe, export.tree_packed and export.atif from the effective config; the tasks' tree forms and
        # ATIF files are read beside their sft.jsonl.
        "sftree merge-sft {input.sft} --out {output.sft} --dataset-info {output.info}"
        " --card {output.card} --llamafactory-out {output.llamafactory}"
        " --results {params.results} {params.config} > {log} 2>&1"

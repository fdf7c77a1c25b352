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
        granularity=config["export"]["granularity"],
        refuse="--refuse-native" if config["export"]["refuse_native"] else "",
        student=student_args(config["export"].get("student")),
        tree=lambda wc, output: tree_args(output),
        atif=lambda wc, output: atif_args(output),
        text=f"--special-text {config['export']['special_text']}"
        + (" --pretokenized" if config["export"]["pretokenized"] else ""),
    shell:
        "sftree export-sft --paths {input.paths} --out {output.sft}"
        " --granularity {params.granularity} {params.refuse} {params.student} {params.tree} {params.atif}"
        " {params.text}"
        " > {log} 2>&1"


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
        atif=(expand(f"{RESULTS}/{{task}}/sft.atif.jsonl", task=TASKS) if ATIF else []),
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
        dedupe="--dedupe" if config["export"]["dedupe"] else "",
        results=lambda wc, output: os.path.dirname(output.sft),
        tree=lambda wc, input, output: (
            f"--tree-inputs {' '.join(input.tree)} --tree-out {output.tree}"
            if TREE_PACKED
            else ""
        ),
        atif=lambda wc, input, output: (
            f"--atif-inputs {' '.join(input.atif)} --atif-out {output.atif}"
            if ATIF
            else ""
        ),
    shell:
        "sftree merge-sft {input.sft} --out {output.sft} --dataset-info {output.info}"
        " --card {output.card} --llamafactory-out {output.llamafactory}"
        " --results {params.results} {params.dedupe} {params.tree} {params.atif} > {log} 2>&1"

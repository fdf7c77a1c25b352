checkpoint select_roots:
    input:
        task_metadata_files,
    output:
        roots=directory(f"{RESULTS}/{{task}}/roots"),
        table=f"{RESULTS}/{{task}}/stages.tsv",
        plot=report(
            f"{RESULTS}/{{task}}/report/stages.svg",
            caption="../report/stages.rst",
            category="Root selection",
        ),
    log:
        f"{RESULTS}/{{task}}/logs/select_roots.log",
    benchmark:
        f"{RESULTS}/{{task}}/benchmarks/select_roots.tsv"
    conda:
        "../../envs/sftree.yaml"
    params:
        snapshots=lambda wc: task_snapshot_dir(wc.task),
        direction=lambda wc: task_direction(wc.task),
        num_roots=config["select_roots"]["num_roots"],
        smooth_window=config["select_roots"]["smooth_window"],
        link=config["select_roots"]["link"],
        per_island="--per-island" if config["select_roots"]["per_island"] else "",
    # One console line per job instead of Snakemake's listing of every input metadata.json.
    message:
        "select_roots {wildcards.task}: snapshots {params.snapshots} -> {output.roots}, {output.table}"
    shell:
        "sftree select-roots --snapshots {params.snapshots} --out {output.roots}"
        " --table {output.table} --plot {output.plot} --task {wildcards.task}"
        " --direction {params.direction} --num-roots {params.num_roots}"
        " --smooth-window {params.smooth_window} --link {params.link} {params.per_island} > {log} 2>&1"

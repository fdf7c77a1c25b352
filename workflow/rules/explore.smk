rule explore:
    input:
        root=f"{RESULTS}/{{task}}/roots/{{root}}/metadata.json",
    output:
        tree=f"{RESULTS}/{{task}}/trees/{{root}}/tree.json",
    params:
        root_dir=lambda wc: f"{RESULTS}/{wc.task}/roots/{wc.root}",
        tree_dir=lambda wc: f"{RESULTS}/{wc.task}/trees/{wc.root}",
        config=config_args(),
    resources:
        teacher_slots=config["search"]["parallel_width"],
    retries: 2
    log:
        f"{RESULTS}/{{task}}/logs/explore/{{root}}.log",
    benchmark:
        f"{RESULTS}/{{task}}/benchmarks/explore/{{root}}.tsv"
    shell:
        "sftree explore --root {params.root_dir} --out {params.tree_dir} {params.config} > {log} 2>&1"

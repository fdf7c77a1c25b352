rule select_paths:
    input:
        tree=f"{RESULTS}/{{task}}/trees/{{root}}/tree.json",
    output:
        paths=f"{RESULTS}/{{task}}/trees/{{root}}/paths.json",
    log:
        f"{RESULTS}/{{task}}/logs/select_paths/{{root}}.log",
    conda:
        "../../envs/sftree.yaml"
    params:
        top_k=config["select_paths"]["top_k"],
    shell:
        "sftree select-paths --tree {input.tree} --out {output.paths} --top-k {params.top_k} > {log} 2>&1"

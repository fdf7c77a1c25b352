rule report:
    input:
        tables=expand(f"{RESULTS}/{{task}}/stages.tsv", task=TASKS),
        paths=all_paths_files,
        stats=f"{RESULTS}/sft.stats.json",
        figures=f"{RESULTS}/sft.figures.json",
    output:
        html=report(f"{RESULTS}/report.html", category="Report"),
    log:
        f"{RESULTS}/logs/report.log",
    conda:
        "../../envs/sftree.yaml"
    params:
        results=lambda wc, output: os.path.dirname(output.html),
    shell:
        "sftree report --results {params.results} --out {output.html} > {log} 2>&1"

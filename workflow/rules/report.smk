def all_paths_files(wildcards):
    return [
        f"{RESULTS}/{task}/trees/{root}/paths.json"
        for task in TASKS
        for root in chosen_roots(task)
    ]


rule report:
    input:
        tables=expand(f"{RESULTS}/{{task}}/stages.tsv", task=TASKS),
        paths=all_paths_files,
        sft=f"{RESULTS}/sft.jsonl",
    output:
        html=report(f"{RESULTS}/report.html", category="Report"),
    log:
        f"{RESULTS}/logs/report.log",
    params:
        results=RESULTS,
    shell:
        "sftree report --results {params.results} --out {output.html} > {log} 2>&1"

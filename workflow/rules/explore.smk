# Section 1: one token-aware MCTS tree per chosen root (`sftree explore`, docs/search.md).
# teacher_slots = parallel_width, so `--resources teacher_slots=N` caps the expansions running against one
# SGLang server across all explore jobs: Snakemake lowers a job's request to N, and the job runs with the
# granted width (`--width`). teacher_trees = 1 per job, so `--resources teacher_trees=K` keeps at most K trees
# active at once: their sessions then fit the server's KV room and its prefix cache keeps serving them
# (docs/benchmarks.md, cache model). A retried or rerun job resumes from tree.live.json + tree.log.jsonl.
rule explore:
    input:
        root=f"{RESULTS}/{{task}}/roots/{{root}}/metadata.json",
        grader=f"{RESULTS}/{{task}}/grader_env.json",
    output:
        tree=f"{RESULTS}/{{task}}/trees/{{root}}/tree.json",
    log:
        f"{RESULTS}/{{task}}/logs/explore/{{root}}.log",
    benchmark:
        f"{RESULTS}/{{task}}/benchmarks/explore/{{root}}.tsv"
    retries: 2
    conda:
        "../../envs/sftree.yaml"
    resources:
        teacher_slots=config["search"]["parallel_width"],
        teacher_trees=1,
    params:
        root_dir=lambda wc: f"{RESULTS}/{wc.task}/roots/{wc.root}",
        tree_dir=lambda wc: f"{RESULTS}/{wc.task}/trees/{wc.root}",
        config=config_args(),
    shell:
        # fd 3 is the job's console (copied before stderr goes to the log): one progress line per edge.
        "sftree explore --root {params.root_dir} --out {params.tree_dir} {params.config}"
        " --width {resources.teacher_slots} --progress-fd 3 3>&2 > {log} 2>&1"

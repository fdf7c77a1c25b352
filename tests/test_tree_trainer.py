"""The tree form proven on a real model by the consumer's own code: SmolLM2-135M (the GGUF of
scripts/install_llm_server.sh --models-only) through transformers on CPU, in the trainer venv
(scripts/install_trainer.sh), float32. On the CPU path (sdpa and the dense mask `tree_attention` builds from the
batch's DFS intervals) each part's weighted loss and the gradients of the trained layer equal the path form's
objective (the sum of the paths' trained-token losses) computed from the same paths, each a forward of its own; on
the GPU path's attention (FlexAttention and its `BlockMask`, forward only on CPU) the loss of all the parts in one
padded batch equals it too; TRL's SFTTrainer takes the lines through `TreeCollator` and `TreeLossMixin`
(docs/outputs.md's recipe), gradient accumulation included. The `BlockMask` equals the ancestor mask block for block
and element for element on 1,000 random trees."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers.export import make_results
from helpers.trainer import probe_env, trainer_python
from test_export_student import QWEN, SMOL, model, paths_of

from sftree.dataset.export import export_task
from sftree.dataset.student import load_student
from sftree.dataset.tree_packed import pack_records, path_tokens
from sftree.records.tree_packed import line_problem, write_tree_lines

REPO = Path(__file__).parents[1]
TREE_PROBE = REPO / "tests" / "trainer" / "tree_probe.py"


def prefix_record(rec: dict) -> dict:
    """The path record cut after its first trained assistant turn and that turn's tool results: a path that is a
    prefix of `rec`'s (as a path cut before an ill-formed step is)."""
    msgs = rec["messages"]
    k = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    end = next((i for i in range(k + 1, len(msgs)) if msgs[i]["role"] != "tool"), len(msgs))
    meta = dict(rec["metadata"], id=rec["metadata"]["id"] + "/prefix")
    return {"messages": msgs[:end], "tools": rec["tools"], "metadata": meta}


@pytest.mark.trainer
def test_tree_form_loss_and_gradients_equal_the_path_forms(tmp_path):
    """The fixture tree's selected paths share edges, one more path is a prefix of another (its trained tokens
    weigh 2), and the cap splits the tree into parts. A plain causal mask gives another loss (the mask is what makes
    them equal)."""
    py = trainer_python()
    smol, qwen = model(SMOL), model(QWEN)
    from gguf import GGUFReader

    template = tmp_path / "qwen2.5.jinja"
    template.write_text(GGUFReader(str(qwen)).fields["tokenizer.chat_template"].contents())
    st = load_student(smol, 4096, template)
    pf = paths_of(make_results(tmp_path / "results", reasoning=False))
    records, _ = export_task([pf], "path", student=st)
    records.append(prefix_record(records[0]))
    tokens = {r["metadata"]["id"]: path_tokens(st, r) for r in records}
    # a cap below the whole trie: parts of a few paths each (CPU time: one forward per path and per part)
    cap = max(len(t.ids) for t in tokens.values()) + 40
    lines, stats = pack_records(records, st, cap)
    assert stats.parts >= 2 and not stats.dropped and all(line_problem(x.to_dict()) is None for x in lines)
    assert stats.processed < stats.path_processed
    assert any(w > 1 for x in lines for w in x.loss_weight)  # a token in the loss of two paths
    # and the whole tree as one line: the two selected paths branch after e1 (a branch point predicts both)
    whole, _ = pack_records(records, st, 10**6)
    assert len(whole) == 1 and any(whole[0].parent.count(i) > 1 for i in range(len(whole[0])))
    lines += whole
    files = {"tree": tmp_path / "sft.tree.jsonl", "paths": tmp_path / "sft.path.jsonl"}
    write_tree_lines(files["tree"], lines)
    files["paths"].write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = {"model_dir": str(smol.parent), "gguf": smol.name, "template": str(template)}
    cfg |= {k: str(v) for k, v in files.items()}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    out = tmp_path / "out.json"
    res = subprocess.run(
        [str(py), str(TREE_PROBE), str(tmp_path / "cfg.json"), str(out)],
        env=probe_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=850,  # about one minute alone; a loaded 2-core machine takes several
    )
    assert res.returncode == 0, res.stderr[-4000:]
    print(res.stderr[-2000:])  # where the time goes
    got = json.loads(out.read_text())
    assert got["attn_implementation"] == "sdpa"
    assert len(got["lines"]) == len(lines)
    for line, row in zip(lines, got["lines"], strict=True):
        paths = line.metadata["paths"]
        # the trainer's tokenizer gives each path the very tokens the tree was built from
        assert row["path_input_ids"] == [list(tokens[p["id"]].ids) for p in paths]
        assert row["weight"] == sum(tokens[p["id"]].n_trained for p in paths) > 0
        assert abs(row["tree_loss"] - row["path_loss"]) <= 1e-4 * abs(row["path_loss"]), row
        assert row["grad_rel_diff"] <= 1e-4 and row["grad_norm"] > 0, row
        if any(line.parent.count(i) > 1 for i in range(len(line))):
            # a branch: under a plain causal mask the second branch would see the first
            # (measured: 3.67 of 13236 where the tree and the paths differ by 0.0005)
            off = abs(row["causal_loss"] - row["tree_loss"])
            assert off > 1e-4 * abs(row["tree_loss"]) and off > 100 * abs(
                row["tree_loss"] - row["path_loss"]
            ), row
    # FlexAttention: the parts and the whole tree in one padded batch (forward only: no backward on CPU)
    objective = sum(row["path_loss"] for row in got["lines"])
    assert abs(got["flex_loss"] - objective) <= 1e-4 * objective, (got["flex_loss"], objective)
    first = got["lines"][0]
    assert abs(got["trl_first_loss"] - first["path_loss"] / first["weight"]) <= 1e-3 * first["path_loss"]


@pytest.mark.trainer
def test_tree_collator_batches_and_trains_through_trl(tmp_path):
    """A small Llama made in the trainer venv (random weights): two parts in one padded batch give the path form's
    objective of four paths (two sharing a prefix, one a prefix of another, one alone) under eager attention and
    sdpa; TRL's SFTTrainer with `TreeCollator` and `TreeLossMixin`, accumulating the two parts' gradients, logs
    the path form's token mean over both (`num_items_in_batch`), not the mean of each part's mean; a model whose
    forward makes its logits otherwise than its output embeddings is refused."""
    py = trainer_python()
    out = tmp_path / "out.json"
    env = probe_env(tmp_path) | {"PYTHONPATH": f"{REPO / 'src'}:{REPO / 'tests' / 'trainer'}"}
    res = subprocess.run(
        [str(py), str(REPO / "tests" / "trainer" / "tree_tiny.py"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    got = json.loads(out.read_text())
    assert got["parts"] == 2
    for attn in ("eager", "sdpa"):
        assert abs(got["tree_loss"][attn] - got["path_objective"]) <= 1e-5 * abs(got["path_objective"]), got
    assert abs(got["trl_accumulated"] - got["token_mean"]) <= 1e-4 * got["token_mean"], got
    # the parts' weights differ, so the mean of the micro-batches' means is another number
    assert abs(got["mean_of_means"] - got["token_mean"]) > 100 * abs(
        got["trl_accumulated"] - got["token_mean"]
    )
    assert "otherwise than its output embeddings" in got["refusal"], got


@pytest.mark.trainer
def test_block_mask_equals_the_ancestor_mask_on_1000_random_trees(tmp_path):
    """tests/trainer/tree_mask_probe.py in the trainer venv: batches of random depth-first lines (padding, several
    roots, random block sizes); `collate` returns `(B, L)` vectors only, the dense mask and the `BlockMask` (block
    for block, element for element) equal the ancestor mask built from `parent` alone; a line that is not
    depth-first, or whose lists differ in length, is refused, naming it."""
    out = tmp_path / "out.json"
    res = subprocess.run(
        [str(trainer_python()), str(REPO / "tests" / "trainer" / "tree_mask_probe.py"), str(out), "1000"],
        env=probe_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    got = json.loads(out.read_text())
    assert got["cases"] == 1000
    assert got["refusals"] == [
        "tree-form batch, line 1: token 1: its subtree is not one interval (the line is not depth-first)",
        "tree-form batch, line 0: input_ids, position_ids, parent, loss_weight of different lengths",
    ]

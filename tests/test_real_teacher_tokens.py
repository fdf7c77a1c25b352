"""The same-tokenizer export on a real Teacher (`export.teacher_tokens`, dataset/teacher_tokens.py): llama-server
(b11434) serving SmolLM2-135M-Instruct Q4_1 with Qwen2.5's template (`teacher.launch`'s defaults) grows one tree
with `teacher.logprobs: 5`, not streamed (b11434 gives no logprobs on a streamed request with tools), tool choice
free; the Student is the same GGUF under the same template.

- explore recorded the Teacher's vocabulary (tree.json `teacher_vocab`, from the launched GGUF), and it is the
  Student's;
- every answered, well-formed step, as the export builds its step record (`build_record`), pre-tokenized with
  `teacher_tokens` through the export's own path (`add_teacher_tokens`): its trained ids are exactly the ids the
  server sampled, closed by the template's turn end (what follows the sampled stop token in it), with the server's
  logprobs and top-5 on them, and no reply is `misaligned` (the server's ids decode to its reply under the
  Student's tokenizer);
- the Student's own render gives those ids for some replies (`same`) and not for others (`substituted`), and
  the count is printed (docs/outputs.md, "Same-tokenizer export", keeps a measurement).
"""

from __future__ import annotations

from collections import Counter

import pytest
from test_real_teacher import MISSING, explore_one_real_tree, steps_of

from sftree.dataset.export import add_teacher_tokens, build_record
from sftree.dataset.messages import exclusion
from sftree.dataset.student import load_student
from sftree.dataset.teacher_tokens import sampled_of
from sftree.search import tree as treemod
from sftree.teacher.llm_server import LaunchSpec
from sftree.teacher.vocabulary import vocabulary_sha256

pytestmark = [
    pytest.mark.llm,
    pytest.mark.slow,
    pytest.mark.skipif(MISSING is not None, reason=f"no real model: {MISSING}"),
]


def test_a_real_teachers_replies_train_exactly_its_sampled_ids(tmp_path):
    out = explore_one_real_tree(
        tmp_path,
        {"tool_choice": "auto", "constrain": "none", "max_tokens": 64, "logprobs": 5, "stream": False},
        {"max_steps_per_turn": 4, "nudges": 3},
    )
    spec = LaunchSpec.from_config({})
    student = load_student(spec.model, 8192, spec.chat_template_file)
    tree = treemod.load(out / "tree.json")
    assert tree.teacher_vocab is not None
    assert tree.teacher_vocab["sha256"] == vocabulary_sha256(student.tokenizer)
    end, newline = student.tokenizer.token_to_id("<|im_end|>"), student.tokenizer.encode("\n").ids[0]
    outcomes: Counter[str] = Counter()
    checked = 0
    meta = {"granularity": "step", "id": "real"}
    for e in tree.edges:
        for step in steps_of(out, e.id):
            if (
                step["response"] is None
                or step.get("kind", "agent") not in ("agent", "nudge")
                or exclusion(step)
            ):
                continue
            lp = step.get("logprobs")
            assert lp is not None and "ids" in lp, step.get("logprobs_dropped")
            rec, why = build_record(step, meta)
            assert rec is not None, why
            (outcome,) = add_teacher_tokens(rec, student, [sampled_of(student, rec["completion"][0], lp)])
            outcomes[outcome] += 1
            assert outcome in ("same", "substituted"), (outcome, step["response"])
            trained = [i for i, m in zip(rec["input_ids"], rec["completion_mask"], strict=True) if m]
            ids = lp["ids"]
            assert trained[: len(ids)] == ids  # the sampled ids, every one
            tail = trained[
                len(ids) :
            ]  # the template's turn end after the sampled stop (or with it, when unlisted)
            assert (ids + tail)[-2:] == [end, newline] or (ids + tail)[-1] == end, (ids[-3:], tail)
            assert len(tail) <= 2
            assert rec["teacher_logprobs"][: len(ids)] == lp["logprobs"]
            assert rec["teacher_top_ids"][: len(ids)] == lp["top_ids"]
            assert rec["teacher_logprobs"][len(ids) :] == [None] * len(tail)
            checked += 1
    assert checked >= 2, "fewer than two well-formed replies to check"
    print(f"same-tokenizer export, real Teacher: {checked} replies, {dict(outcomes)}")

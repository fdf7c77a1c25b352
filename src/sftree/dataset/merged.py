"""The merged form (`export.granularity: merged`): one record per run of consecutive steps of one session, so a
session's context is processed once instead of once per step.

A run is a maximal sequence of step records (in the order the step form writes them) in which each record's prompt
is the previous record's prompt + completion, followed only by tool results and user messages (no assistant
message between: an ill-formed or skipped step between them ends the run), with the same tools. Under the Student
(`export.student`) it must also hold in tokens: the previous step's prompt + completion, tokenized, is a prefix of
this step's, and this step's trained tokens start after it; so each assistant message is trained once, in exactly
the context the model saw, and the run is cut where a template rewrites earlier turns (e.g. one that drops the
reasoning of earlier turns) and where the record would pass `max_length`. Without a Student only the messages are
compared (the trainer's tokenizer checks the tokens: `trainer_labels.token_labels` refuses a record whose context
its template renders differently).

A merged record is `{messages, tools, metadata}`: the last step's prompt + completion; `metadata.trained` lists the
indices of the trained assistant messages (each one step's completion), `metadata.steps` the step ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sftree.dataset.rendering import Student, Turn, Unfit
from sftree.dataset.student import Measure, render_turn
from sftree.records.tree import SchemaDoc


def extends(prev: SchemaDoc, rec: SchemaDoc) -> bool:
    """Whether step record `rec` continues `prev` in the messages: its prompt starts with prev's prompt and
    completion, then holds no assistant message (an ill-formed step in between is never trained), same tools."""
    head = [*prev["prompt"], *prev["completion"]]
    prompt = rec["prompt"]
    return (
        rec.get("tools") == prev.get("tools")
        and len(prompt) > len(head)
        and prompt[: len(head)] == head
        and all(m.get("role") != "assistant" for m in prompt[len(head) :])
    )


def continues(prev: Turn, turn: Turn) -> bool:
    """Under the Student: the previous step's tokens are a prefix of this step's, before its trained tokens."""
    n = len(prev.whole)
    return turn.start >= n and turn.whole[:n] == prev.whole


@dataclass
class Run:
    records: list[SchemaDoc] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)  # under the Student only

    def measure(self) -> Measure:
        return Measure(
            len(self.turns[-1].whole),
            sum(t.trained for t in self.turns),
            sum(len(t.whole) for t in self.turns),
        )


def merged_record(run: Run) -> SchemaDoc:
    """The run as one `{messages, tools, metadata}` record (metadata: the last step's, the run's ids and usage)."""
    first, last = run.records[0], run.records[-1]
    meta = dict(last["metadata"])
    usage = {k: sum(r["metadata"]["usage"][k] for r in run.records) for k in meta["usage"]}
    ranks = sorted({x for r in run.records for x in r["metadata"]["path_ranks"]})
    meta.update(
        id=first["metadata"]["id"],
        granularity="merged",
        usage=usage,  # the Teacher's tokens of all the run's model calls
        path_ranks=ranks,
        trained=[len(r["prompt"]) for r in run.records],
        steps=[r["metadata"]["id"] for r in run.records],
    )
    meta.pop("student_tokens", None)
    return {"messages": [*last["prompt"], *last["completion"]], "tools": last["tools"], "metadata": meta}


def step_turn(student: Student, rec: SchemaDoc) -> Turn:
    return render_turn(
        student, rec["prompt"], rec["completion"][0], rec.get("tools") or [], rec["metadata"]["id"]
    )


def runs(
    records: Iterator[SchemaDoc],
    student: Student | None = None,
    unfit: Callable[[SchemaDoc, Unfit], None] | None = None,
    ends: Callable[[SchemaDoc], bool] | None = None,
) -> Iterator[Run]:
    """Group step records into runs (see the module). Under the Student a run also ends before a step longer than
    `max_length`: that step (its record as long as the run would become) is dropped as in the step form, and the
    run's steps before it are kept. A step the Student's template cannot hold (Unfit) is given to `unfit` and
    left out (the next step, whose prompt holds its message, starts a new run); under `fit: strict` it raises.
    `ends`: a step after which its run ends (`export.teacher_tokens`: one whose sampled ids are trained, which
    later context cannot follow)."""
    run = Run()
    for rec in records:
        try:
            turn = step_turn(student, rec) if student is not None else None
        except Unfit as exc:
            if student is None or student.strict or unfit is None:
                raise
            unfit(rec, exc)
            continue
        joins = bool(run.records) and extends(run.records[-1], rec)
        if joins and turn is not None and student is not None:
            joins = continues(run.turns[-1], turn) and len(turn.whole) <= student.max_length
        if not joins and run.records:
            yield run
            run = Run()
        run.records.append(rec)
        if turn is not None:
            run.turns.append(turn)
        if ends is not None and ends(rec):
            yield run
            run = Run()
    if run.records:
        yield run

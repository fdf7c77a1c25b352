"""A scripted Teacher for the security tests: a tiny OpenAI-compatible server that replays fixed tool calls.

    script = {1: [[("bash", {"command": "id"})], [("bash", {"command": "coral eval -m x"})]], 2: [...]}
    teacher = ScriptedTeacher(script).start()           # base_url; steps are served per (edge, turn)
    ctx, r = run_scripted_edge(base, script)            # a real EdgeContext, native agent, sandbox `auto`

Each turn's list holds the model steps in order; a step is a list of (tool, arguments) calls. Past the end of a
turn's steps the model answers text only (the turn ends `no_eval`: nudges are 0). A script key may also be
`(edge, turn)` to aim at one edge. The edge runs in a real tree folder under `base` (outside /tmp), with the
real circle_packing task, its real grader, the real tools, bwrap and `coral`.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from helpers.runtime import config, example_task, make_root
from helpers.sse import reply_chunks, send_sse
from sftree.config import REPO_ROOT
from sftree.httpserver import QuietThreadingHTTPServer, local_url, read_body, send_json, serve_in_background
from sftree.settings import settings_of

BASE_PARENT = Path("/var/tmp")  # not /tmp: bwrap's private /tmp would hide things for free


def make_base() -> Path:
    return Path(tempfile.mkdtemp(prefix="sftree-security-", dir=BASE_PARENT))


class ScriptedTeacher:
    def __init__(self, script: dict):
        self.script = script
        self.counts: dict[tuple[str, int], int] = {}
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self.serving = None

    def steps_for(self, edge: str, turn: int) -> list:
        return self.script.get((edge, turn), self.script.get(turn, []))

    def reply(self, headers, body: dict) -> dict:
        edge, turn = headers.get("X-Sftree-Edge", ""), int(headers.get("X-Sftree-Turn", "1") or 1)
        with self._lock:
            self.requests.append({"edge": edge, "turn": turn, "body": body})
            i = self.counts.get((edge, turn), 0)
            self.counts[(edge, turn)] = i + 1
        steps = self.steps_for(edge, turn)
        usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
        if i >= len(steps):
            msg, finish = {"role": "assistant", "content": "done"}, "stop"
        else:
            calls = [
                {
                    "id": f"call_{turn}_{i}_{k}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                for k, (name, args) in enumerate(steps[i])
            ]
            msg, finish = {"role": "assistant", "content": "", "tool_calls": calls}, "tool_calls"
        return {
            "id": "x",
            "object": "chat.completion",
            "model": "scripted",
            "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
            "usage": usage,
        }

    def start(self) -> str:
        teacher = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    send_json(self, 200, {"object": "list", "data": [{"id": "scripted"}]})
                else:
                    send_json(self, 200, {"status": "ok"})

            def do_POST(self):
                body = json.loads(read_body(self) or b"{}")
                reply = teacher.reply(self.headers, body)
                if body.get("stream"):  # OpenCode streams: the same reply as SSE chunks
                    choice = reply["choices"][0]
                    chunks = reply_chunks(
                        choice["message"],
                        choice["finish_reason"],
                        reply["usage"],
                        reply["id"],
                        reply["model"],
                    )
                    return send_sse(self, chunks)
                send_json(self, 200, reply)

        self.server = QuietThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.serving = serve_in_background(self.server, "scripted-teacher")
        return local_url(self.server)

    def stop(self) -> None:
        if self.serving:
            self.serving.stop()


class Scripted:
    """A tree of scripted edges: `edge(...)` runs one and returns its EdgeResult."""

    def __init__(
        self,
        base: Path,
        script: dict,
        *,
        agent: dict | None = None,
        extra: dict | None = None,
        teacher: dict | None = None,
    ):
        from sftree.search.edge import EdgeContext

        self.base = Path(base)
        self.teacher = ScriptedTeacher(script)
        url = self.teacher.start()
        cfg = config(
            teacher={"base_url": url, "sim": None, "model": "scripted", **(teacher or {})},
            agent={"sandbox": "auto", "nudges": 0, "max_steps_per_turn": 8, **(agent or {})},
            **(extra or {}),
        )
        self.task_cfg = example_task(cfg)
        snaps = self.base / "all_snapshots"
        snaps.mkdir(exist_ok=True)
        self.root = make_root(snaps)
        self.tree_dir = self.base / "results" / "circle_packing" / "trees" / self.root.name
        self.ctx = EdgeContext.create(self.tree_dir, self.root, settings_of(cfg), self.task_cfg)

    def edge(self, edge_id: str = "e1", parent=None, parent_score: float | None = 1.0):
        from sftree.search.edge import run_edge

        return run_edge(
            self.ctx, parent or self.ctx.root_state, edge_id, parent_score, depth=1, attempt=1, eval_count=5
        )

    def steps(self, edge_id: str) -> list[dict]:
        from sftree.records import steplog

        return steplog.read_steps(self.tree_dir / "edges" / edge_id / "steps.jsonl")

    def outputs(self, edge_id: str) -> list[str]:
        """Every tool result the model saw in the edge, in order."""
        return [r["content"] for s in self.steps(edge_id) for r in s["tool_results"]]

    def close(self) -> None:
        self.ctx.close()
        self.teacher.stop()


GRADER = REPO_ROOT / "examples" / "circle_packing" / "eval" / "grader.py"
TASK_DIR = GRADER.parent


def bash(command: str) -> tuple[str, dict]:
    return ("bash", {"command": command, "description": "scripted"})


EVAL = bash("coral eval -m scripted")


def edit_solution() -> tuple[str, dict]:
    """A real change that keeps the packing valid (so `coral eval` commits and scores it)."""
    return (
        "edit",
        {"filePath": "solution.py", "oldString": "GROW_PASSES = 0", "newString": "GROW_PASSES = 1"},
    )


if __name__ == "__main__":  # used by the memory test: run one edge in a fresh process, print peak RSS (MB)
    import resource

    spec = json.loads(sys.argv[1])
    base = Path(spec["base"])
    script = {int(k): v for k, v in spec["script"].items()}
    s = Scripted(base, script, agent=spec.get("agent"))
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = s.edge("e1")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(
            json.dumps(
                {
                    "before_mb": before / 1024,
                    "peak_mb": peak / 1024,
                    "outputs": [o[:200] + "..." + o[-200:] for o in s.outputs("e1")],
                    "error": r.error,
                    "scores": [t.score for t in r.turns],
                }
            )
        )
    finally:
        s.close()
        shutil.rmtree(base, ignore_errors=True)

"""A Coral agent runtime for tests: `agents.runtime: scripted_runtime:ScriptedRuntime` (this folder on PYTHONPATH).

Coral loads a custom runtime from `module:Class` (coral/agent/registry.py; its tests/test_custom_runtime.py shows
the protocol) and calls `start()` for every agent, as it would start Claude Code or OpenCode: in the agent's
worktree, with its log folder. This runtime starts `scripted_agent.py`, a small program that plays the agent's
part from a plan (`agents.runtime_options.plan`: a JSON file, one list of steps per agent id): edit the code,
write a note, run the real `coral eval`. Everything else (worktrees, the grader daemon, checkpoints, attempt
records, eval_count) is Coral's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

AGENT = Path(__file__).resolve().parent / "scripted_agent.py"


class ScriptedRuntime:
    def start(
        self,
        worktree_path: Path,
        coral_md_path: Path,
        model: str = "scripted",
        runtime_options: dict[str, Any] | None = None,
        max_turns: int = 200,
        log_dir: Path | None = None,
        verbose: bool = False,
        resume_session_id: str | None = None,
        prompt: str | None = None,
        prompt_source: str | None = None,
        task_name: str | None = None,
        task_description: str | None = None,
        gateway_url: str | None = None,
        gateway_api_key: str | None = None,
    ):
        from coral.agent.runtime import AgentHandle, write_coral_log_entry

        worktree_path = Path(worktree_path)
        agent_id = (worktree_path / ".coral_agent_id").read_text().strip()
        log_dir = Path(log_dir or worktree_path / ".opencode" / "logs")
        log_dir.mkdir(parents=True, exist_ok=True)
        n = len(list(log_dir.glob(f"{agent_id}.*.log")))
        log_path = log_dir / f"{agent_id}.{n}.log"
        log_file = open(log_path, "a")  # noqa: SIM115 - the handle keeps it (AgentHandle._log_file)
        write_coral_log_entry(
            log_file, prompt or "start", prompt_source or "start", agent_id, task_name=task_name
        )
        plan = (runtime_options or {}).get("plan", "")
        env = dict(os.environ)
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # Coral's `coral`
        proc = subprocess.Popen(
            [sys.executable, str(AGENT), "--plan", str(plan), "--agent", agent_id],
            cwd=worktree_path,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # Coral stops an agent by its process group
        )
        return AgentHandle(
            agent_id=agent_id,
            process=proc,
            worktree_path=worktree_path,
            log_path=log_path,
            _log_file=log_file,
        )

    def extract_session_id(self, log_path: Path) -> str | None:
        return None

    @property
    def instruction_filename(self) -> str:
        return "AGENTS.md"

    @property
    def shared_dir_name(self) -> str:
        return ".opencode"

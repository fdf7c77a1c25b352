"""Start and stop a real `llama-server` (llama.cpp) as the Teacher: config `teacher.launch`, the real-server tests.

`scripts/install_llm_server.sh` builds the binary and installs a small GGUF into `.tools/llama.cpp/`;
`teacher.launch` names them (defaults: that folder). The server gets a free port on 127.0.0.1, its command
line is logged, and we wait for its `/health` before the first request; stopping kills its process group.
Why these flags (`--jinja`, the chat template): docs/real_teacher.md.
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sftree.config import REPO_ROOT
from sftree.errors import InputError, TeacherUnavailable
from sftree.runtime.guard import guarded
from sftree.runtime.procs import stop_group
from sftree.settings import JSONMap
from sftree.teacher.transport import probe

log = logging.getLogger(__name__)

TOOLS_DIR = REPO_ROOT / ".tools" / "llama.cpp"
DEFAULT_BINARY = TOOLS_DIR / "bin" / "llama-server"
DEFAULT_MODEL = TOOLS_DIR / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# ChatML with Hermes-style <tool_call> blocks: SmolLM2 speaks ChatML, and llama.cpp knows this format's grammar
DEFAULT_TEMPLATE = TOOLS_DIR / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"


def repo_path(value: str | Path) -> Path:
    """A configured path: `~` expanded, a relative one taken from the repository root (`teacher.launch`'s paths,
    `teacher.tokenizer`)."""
    p = Path(os.path.expanduser(str(value)))
    return p if p.is_absolute() else REPO_ROOT / p


@dataclass
class LaunchSpec:
    """What `teacher.launch` asks for (paths relative to the repository root when not absolute)."""

    binary: Path = DEFAULT_BINARY
    model: Path = DEFAULT_MODEL
    chat_template_file: Path | None = DEFAULT_TEMPLATE
    ctx_size: int = 8192
    threads: int = 1  # 2 spinning threads on 2 busy cores ran 10x slower than 1 (docs/real_teacher.md)
    parallel: int = 1
    extra_args: list[str] = field(default_factory=list)
    startup_timeout: float = 120.0
    log_file: Path | None = None

    @classmethod
    def from_config(cls, cfg: JSONMap | None) -> LaunchSpec:
        cfg = dict(cfg or {})

        def path(key: str, default: Path | None) -> Path | None:
            v = cfg.get(key, default)
            return None if v is None else repo_path(v)

        def required(key: str, default: Path) -> Path:  # the schema has no null for these
            return path(key, default) or default

        return cls(
            binary=required("binary", DEFAULT_BINARY),
            model=required("model", DEFAULT_MODEL),
            chat_template_file=path("chat_template_file", DEFAULT_TEMPLATE),
            ctx_size=int(cfg.get("ctx_size", 8192)),
            threads=int(cfg.get("threads", 1)),
            parallel=int(cfg.get("parallel", 1)),
            extra_args=[str(a) for a in cfg.get("extra_args", [])],
            startup_timeout=float(cfg.get("startup_timeout", 120)),
            log_file=path("log_file", None),
        )

    def missing(self) -> str | None:
        """Why this spec cannot start (a missing file, named), or None."""
        if not self.binary.is_file() or not os.access(self.binary, os.X_OK):
            return f"llama-server binary not found at {self.binary} (run scripts/install_llm_server.sh)"
        if not self.model.is_file():
            return f"model file not found at {self.model} (run scripts/install_llm_server.sh)"
        if self.chat_template_file is not None and not self.chat_template_file.is_file():
            return f"chat template not found at {self.chat_template_file} (teacher.launch.chat_template_file)"
        return None

    def command(self, port: int) -> list[str]:
        cmd = [str(self.binary), "--model", str(self.model), "--host", "127.0.0.1", "--port", str(port),
               "--ctx-size", str(self.ctx_size), "--threads", str(self.threads),
               "--parallel", str(self.parallel), "--jinja", "--no-webui"]  # fmt: skip
        if self.chat_template_file is not None:
            cmd += ["--chat-template-file", str(self.chat_template_file)]
        return cmd + self.extra_args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _healthy(url: str) -> bool:
    r = probe(f"{url}/health", timeout=5)
    return r is not None and r.status_code == 200


def start_llm_server(spec: LaunchSpec) -> tuple[str, Callable[[], None]]:
    """Start llama-server; return (base_url ending in /v1, stop). Raises InputError / TeacherUnavailable."""
    why = spec.missing()
    if why:
        raise InputError(f"teacher.launch: {why}")
    port = free_port()
    cmd = spec.command(port)
    log.info("starting llama-server: %s", shlex.join(cmd))
    out = open(spec.log_file, "ab") if spec.log_file else None  # noqa: SIM115 (closed by stop)
    # under the guard: a `kill -9` of the sftree process that started it ends it too (runtime/guard.py)
    proc = subprocess.Popen(guarded(cmd), stdout=subprocess.DEVNULL if out is None else out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    root = f"http://127.0.0.1:{port}"

    def stop() -> None:
        stop_group(proc, grace=10)
        if out is not None:
            out.close()

    deadline = time.monotonic() + spec.startup_timeout
    while not _healthy(root):
        if proc.poll() is not None:
            stop()
            raise TeacherUnavailable(
                f"llama-server exited with code {proc.returncode} before /health answered "
                f"(command: {shlex.join(cmd)}; its output: {spec.log_file or 'not kept, set teacher.launch.log_file'})"
            )
        if time.monotonic() >= deadline:
            stop()
            raise TeacherUnavailable(f"llama-server at {root} not healthy after {spec.startup_timeout:g}s")
        time.sleep(0.2)
    log.info("llama-server ready at %s (pid %d)", root, proc.pid)
    return f"{root}/v1", stop

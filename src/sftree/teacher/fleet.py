"""A fleet of Teacher workers behind a router on localhost: the test bed of docs/serving.md.

    python -m sftree.teacher.fleet --workers 2 [--router smg|sglang-router] [--kind llama-server|teacher-sim]
                                   [--policy cache_aware] [--port 8020] [--model PATH] [--log-dir DIR]

starts N workers (llama-server with `teacher.launch`'s defaults, or `sftree teacher-sim` processes), each on
its own free port of 127.0.0.1, and the router in front of them: `smg launch --worker-urls ... --policy P
--routing-key-override` by default (smg 1.13.0, the successor of sglang-router, `scripts/install_smg.sh` links it
as `.tools/smg`; each Teacher session's requests carry `x-smg-routing-key`, teacher/affinity.py, so a session
stays on one worker), or `sglang-router launch ...` (0.3.2, `scripts/install_router.sh`, `.tools/sglang-router`),
which takes the same flags. It prints the router's base URL for
`teacher.base_url`, and stops everything on Ctrl-C. Tests and `benchmarks/fleet.py` use `start_fleet`; every
process is started in its own session and stopped by its PID (`Fleet.stop`), whatever happened.

The router's health checks are set tight (every 2 s, down after 2 failures of 2 s each, up after 1 success) so
a dead worker leaves the routing within seconds, and so is its circuit breaker's open time (2 s, closed again
after 1 success): the requests that failed on a dying worker open its circuit, which the router's default keeps
open for 60 s after the worker is back and healthy - long enough for "no available workers" when the other one
dies meanwhile. docs/serving.md gives the same flags for a cluster.
llama-server workers run with `--metrics`: `/metrics` has each worker's prompt tokens processed and reused
from its cache (`prompt_tokens_total`, `prompt_tokens_cached_total`) and tokens generated, which
`Fleet.metrics` reads (benchmarks/fleet.py: the cache share per worker). smg routes by model name: each
llama-server worker serves its model as `served_name` (`--alias`, "default": `teacher.model`'s default), which
sglang-router ignores.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sftree.config import REPO_ROOT
from sftree.errors import InputError, TeacherUnavailable
from sftree.runtime.procs import stop_group
from sftree.teacher.llm_server import LaunchSpec, free_port
from sftree.teacher.transport import Response, probe

ROUTER_BIN = REPO_ROOT / ".tools" / "sglang-router" / "bin" / "sglang-router"
SMG_BIN = REPO_ROOT / ".tools" / "smg" / "bin" / "smg"
ROUTERS = {
    "smg": (SMG_BIN, "scripts/install_smg.sh"),
    "sglang-router": (ROUTER_BIN, "scripts/install_router.sh"),
}
DEFAULT_ROUTER = "smg"
# smg: the session's routing key pins it to one worker (valid x-smg-routing-key first, else the request lineage);
# its first request goes where the policy sends it
SMG_FLAGS = ("--routing-key-override",)
POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")
# down after 2 failed checks of 2 s, checked every 2 s; back after one good check; an open circuit (10 failed
# requests) lets a request through again after 2 s and closes on its success (router default: 60 s, 3)
HEALTH_FLAGS = ("--health-check-interval-secs", "2", "--health-failure-threshold", "2",
                "--health-check-timeout-secs", "2", "--health-success-threshold", "1",
                "--cb-timeout-duration-secs", "2", "--cb-success-threshold", "1")  # fmt: skip


def router_missing(router: str = DEFAULT_ROUTER, binary: Path | None = None) -> str | None:
    if router not in ROUTERS:
        return f"router must be one of {', '.join(ROUTERS)}, not {router!r}"
    binary = binary or ROUTERS[router][0]
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        return f"{router} not found at {binary} (run {ROUTERS[router][1]})"
    return None


def router_command(port: int, worker_urls: list[str], policy: str, *, router: str = DEFAULT_ROUTER,
                   binary: Path | None = None, metrics_port: int | None = None,
                   extra: tuple[str, ...] = ()) -> list[str]:  # fmt: skip
    """`smg launch` or `sglang-router launch` for these workers (what docs/serving.md runs on a cluster, with its
    host/port)."""
    cmd = [str(binary or ROUTERS[router][0]), "launch", "--host", "127.0.0.1", "--port", str(port),
           "--worker-urls", *worker_urls, "--policy", policy, *HEALTH_FLAGS, "--log-level", "warn"]  # fmt: skip
    if router == "smg":
        cmd += SMG_FLAGS
    if (
        metrics_port is not None
    ):  # its Prometheus exporter wants a port of its own (two routers on one machine)
        cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]
    return cmd + list(extra)


@dataclass
class Worker:
    index: int
    kind: str  # llama-server | teacher-sim
    port: int
    cmd: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.starts += 1
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)  # fmt: skip
        finally:
            log.close()

    def healthy(self) -> bool:
        r = probe(f"{self.url}/health", timeout=2)
        return r is not None and r.status_code == 200

    def answering(self) -> bool:
        """A request is being answered now: llama-server's `/slots` (a slot processing), teacher-sim's
        `/sim/stats` (a request in flight)."""
        path = "/slots" if self.kind == "llama-server" else "/sim/stats"
        try:
            data = _json(probe(f"{self.url}{path}", timeout=2))
        except ValueError:
            return False
        if isinstance(data, dict):
            return bool(data.get("in_flight"))
        return isinstance(data, list) and any(isinstance(s, dict) and s.get("is_processing") for s in data)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.alive():
            os.killpg(self.proc.pid, sig)

    def stop(self, grace: float = 10) -> None:
        if self.proc is not None:
            stop_group(self.proc, grace)  # SIGCONT first: a stopped (SIGSTOP) worker cannot handle SIGTERM


def _json(r: Response | None) -> object:
    """A probe's JSON body; ValueError when there was no answer or it is not JSON."""
    if r is None:
        raise ValueError("no answer")
    return r.json()


@dataclass
class Fleet:
    workers: list[Worker]
    policy: str
    router_port: int
    router_cmd: list[str]
    log_dir: Path
    router: subprocess.Popen[bytes] | None = None
    metrics_port: int | None = None  # the router's Prometheus exporter
    router_kind: str = DEFAULT_ROUTER
    started_at: float = field(default_factory=time.monotonic)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def router_view(self) -> dict[str, bool]:
        """The router's worker list, {url: healthy} ({} while it does not answer)."""
        try:
            data = _json(probe(f"{self.url}/workers", timeout=3))
        except ValueError:
            return {}
        workers = data.get("workers", []) if isinstance(data, dict) else []  # not a worker list: no answer
        return {w["url"]: bool(w.get("is_healthy")) for w in workers if isinstance(w, dict)}

    def wait_router(
        self, pred: Callable[[dict[str, bool]], object], timeout: float, what: str
    ) -> dict[str, bool]:
        """Poll the router's view until pred(view) holds; TeacherUnavailable naming `what` after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            view = self.router_view()
            if pred(view):
                return view
            if self.router is not None and self.router.poll() is not None:
                raise TeacherUnavailable(f"{self.router_kind} exited with code {self.router.returncode} "
                                         f"(log: {self.log_dir / 'router.log'})")  # fmt: skip
            if time.monotonic() >= deadline:
                raise TeacherUnavailable(f"{self.router_kind} at {self.url}: {what} not seen after {timeout:g}s "
                                         f"(workers: {view})")  # fmt: skip
            time.sleep(0.25)

    def metrics(self, w: Worker) -> dict[str, float]:
        """llama-server's `/metrics` counters of one worker ({} when it does not answer)."""
        r = probe(f"{w.url}/metrics", timeout=5)
        if r is None:
            return {}
        text = r.text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("llamacpp:"):
                name, _, value = line.partition(" ")
                try:
                    out[name.removeprefix("llamacpp:")] = float(value)
                except ValueError:
                    pass
        return out

    def router_metrics(self) -> str:
        """The router's Prometheus text ('' when it does not answer)."""
        r = probe(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5)
        return "" if r is None else r.text

    def restart(self, w: Worker, timeout: float = 180) -> None:
        """Start a stopped worker again on its port (a requeued job) and wait until the router routes to it."""
        w.stop(grace=5)
        w.start()
        _wait_healthy(w, timeout)
        self.wait_router(lambda v: v.get(w.url), timeout, f"worker {w.url} healthy again")

    def stop(self) -> None:
        if self.router is not None:
            stop_group(self.router, grace=10)
        for w in self.workers:
            w.stop()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def worker_command(
    kind: str,
    port: int,
    *,
    spec: LaunchSpec | None = None,
    sim: Mapping[str, object] | None = None,
    served_name: str = "default",
) -> list[str]:
    if kind == "llama-server":  # the model named as the Teacher asks for it (smg routes by model name)
        return (spec or LaunchSpec()).command(port) + ["--metrics", "--alias", served_name]
    if kind == "teacher-sim":
        cmd = [sys.executable, "-m", "sftree.cli", "teacher-sim", "--port", str(port)]
        for k, v in (sim or {}).items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        return cmd
    raise InputError(f"worker kind must be llama-server or teacher-sim, not {kind!r}")


def _wait_healthy(w: Worker, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not w.healthy():
        if not w.alive():
            code = w.proc.returncode if w.proc is not None else None
            raise TeacherUnavailable(f"{w.kind} worker {w.index} exited with code {code} before "
                                     f"/health answered (command: {shlex.join(w.cmd)}; log: {w.log_path})")  # fmt: skip
        if time.monotonic() >= deadline:
            raise TeacherUnavailable(
                f"{w.kind} worker at {w.url} not healthy after {timeout:g}s (log: {w.log_path})"
            )
        time.sleep(0.2)


def start_fleet(n: int, log_dir: Path, *, kind: str = "llama-server", policy: str = "cache_aware",
                spec: LaunchSpec | None = None, sim: Mapping[str, object] | None = None, router_port: int | None = None,
                timeout: float = 180, router_extra: tuple[str, ...] = (),
                router: str = DEFAULT_ROUTER) -> Fleet:  # fmt: skip
    """Start n workers and the router; return once the router sees every worker healthy (stops all on error)."""
    missing = router_missing(router)
    if missing:
        raise InputError(missing)
    if kind == "llama-server":
        why = (spec or LaunchSpec()).missing()
        if why:
            raise InputError(why)
    if policy not in POLICIES:
        raise InputError(f"--policy must be one of {', '.join(POLICIES)}, not {policy!r}")
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    workers = []
    for i in range(n):
        port = free_port()
        workers.append(
            Worker(i, kind, port, worker_command(kind, port, spec=spec, sim=sim), log_dir / f"worker{i}.log")
        )
    rport, mport = router_port or free_port(), free_port()
    cmd = router_command(rport, [w.url for w in workers], policy, router=router, metrics_port=mport,
                         extra=router_extra)  # fmt: skip
    fleet = Fleet(workers, policy, rport, cmd, log_dir, metrics_port=mport, router_kind=router)
    try:
        for w in workers:
            w.start()
        for w in workers:
            _wait_healthy(w, timeout)
        with open(log_dir / "router.log", "ab") as log:
            env = {**os.environ, "NO_COLOR": "1", "RUST_LOG_STYLE": "never"}
            fleet.router = subprocess.Popen(fleet.router_cmd, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True, env=env)  # fmt: skip
        fleet.wait_router(lambda v: len(v) == n and all(v.values()), timeout, f"all {n} workers healthy")
    except BaseException:
        fleet.stop()
        raise
    return fleet


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sftree.teacher.fleet", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--kind", choices=["llama-server", "teacher-sim"], default="llama-server")
    p.add_argument("--router", choices=list(ROUTERS), default=DEFAULT_ROUTER)
    p.add_argument("--policy", choices=POLICIES, default="cache_aware")
    p.add_argument("--port", type=int, default=None, help="the router's port (default: a free one)")
    p.add_argument("--model", default=None, help="GGUF for llama-server workers (default: teacher.launch's)")
    p.add_argument("--log-dir", default="fleet-logs")
    args = p.parse_args(argv)
    spec = LaunchSpec.from_config({"model": args.model} if args.model else {})
    try:
        fleet = start_fleet(args.workers, Path(args.log_dir), kind=args.kind, policy=args.policy, spec=spec,
                            router_port=args.port, router=args.router)  # fmt: skip
    except (InputError, TeacherUnavailable) as exc:
        print(f"fleet: error: {exc}", file=sys.stderr)
        return 2
    with fleet:
        print(f"fleet: {args.workers} {args.kind} workers behind {args.router} ({args.policy}); "
              f"teacher.base_url: {fleet.base_url}", flush=True)  # fmt: skip
        for w in fleet.workers:
            print(f"fleet:   worker {w.index}: {w.url} (pid {w.pid}, log {w.log_path})", flush=True)
        try:
            while fleet.router is not None and fleet.router.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

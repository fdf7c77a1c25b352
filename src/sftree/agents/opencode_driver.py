"""One edge's OpenCode, kept running for the whole edge: runs in the edge's sandbox (`python -I`, standard library
only, no sftree import) and speaks JSON lines with the host over the two pipes `--fds` names (not its stdin and
stdout: bwrap's processes in the sandbox keep those, and they are as reachable as the agent's).

    python -I opencode_driver.py BINARY WORKDIR STORE OUT [--bridge PROXY_SOCKET PORT] [--reap] --fds IN OUT

It starts `opencode serve` (one server for the edge's two turns, so OpenCode starts once per edge and not once
per turn; docs/opencode.md, "Costs") and drives it over its HTTP API as `opencode run --format json` drives its
in-process server, request for request, so OpenCode builds the same model requests:

- `{"op": "turn", "session": ID|null, "title": T, "model": "provider/model", "text": PROMPT}`: the session (`GET
  /session/ID`, else `POST /session` with run's title and permission rules), the event stream (`GET /event`),
  then the prompt (`POST /session/ID/message`). Events go to the host in run's JSON form (`tool_use`,
  `step_start`, `step_finish`, `text`, `reasoning`, `error`, each with `sessionID`), permission requests are
  rejected as run rejects them, and `{"type": "idle"}` ends the turn.
- `{"op": "abort"}`: abort every session still working (`POST /session/ID/abort`; the host ends a turn at
  `coral eval`, as Coral's manager interrupts its agent; the agent may have started other sessions through the
  server's API), wait for the turn to end, then, with `--reap`, stop the server (SIGSTOP, until the next turn: no
  plugin of the agent's runs in it meanwhile) and kill every other process of the sandbox (the commands the
  agent left running): between two turns nothing of the agent runs. Answers `{"type": "aborted"}`, or
  `abort_failed` when any of it did not happen (the host then kills the sandbox).
- `{"op": "save"}`: stop the server and write OpenCode's session store (its SQLite database, WAL included) as one
  file to OUT with SQLite's backup; answers `{"type": "saved"}` (or `save_failed`) and exits. A fork starts its
  server on a copy.

The driver is not dumpable, so the agent (same uid) cannot ptrace it or read its memory, and it exits when the
server dies, so the host sees that at once.

`--bridge`: the sandbox has no network; the proxy's port on the sandbox's loopback is forwarded to the proxy's
Unix socket, so OpenCode reaches the Teacher and nothing else.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse

TYPE_CHECKING = False  # annotations only: the driver imports nothing it does not run
if TYPE_CHECKING:
    from collections.abc import Iterator
    from io import BufferedReader
    from typing import IO

# `opencode run`'s session rules when it is not interactive (packages/opencode/src/cli/cmd/run.ts).
RUN_RULES = [
    {"permission": "question", "action": "deny", "pattern": "*"},
    {"permission": "plan_enter", "action": "deny", "pattern": "*"},
    {"permission": "plan_exit", "action": "deny", "pattern": "*"},
]
# Part types `opencode run --format json` prints, with the event type it prints them as.
EMIT = {"step-start": "step_start", "step-finish": "step_finish"}
LINE_MAX = 1 << 20
OUT_LOCK = threading.Lock()
# the two pipes to the host (--fds), "in" and "out": held by this process only
HOST: dict[str, IO[bytes]] = {}


def _obj(value: object) -> dict[str, object]:
    """`value` when it is a JSON object (what OpenCode sends is read without trusting its shape), else {}."""
    return value if isinstance(value, dict) else {}


def emit(kind: str, **data: object) -> None:
    line = json.dumps({"type": kind, "timestamp": int(time.time() * 1000), **data}) + "\n"
    with OUT_LOCK:
        HOST["out"].write(line.encode())
        HOST["out"].flush()


# ---- the proxy bridge ----------------------------------------------------------------------------------------
def _pipe(a: socket.socket, b: socket.socket) -> None:
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _bridge_one(c: socket.socket, path: str) -> None:
    u = socket.socket(socket.AF_UNIX)
    try:
        u.connect(path)
    except OSError:
        c.close()
        return
    t = threading.Thread(target=_pipe, args=(u, c), daemon=True)
    t.start()
    _pipe(c, u)
    t.join()
    c.close()
    u.close()


def bridge(path: str, port: int) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(64)

    def loop() -> None:
        while True:
            c, _ = srv.accept()
            # Relayed replies are streamed in small pieces: without this each waits for OpenCode's delayed ACK.
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=_bridge_one, args=(c, path), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()


# ---- HTTP to the server --------------------------------------------------------------------------------------
class Server:
    def __init__(self, binary: str, workdir: str) -> None:
        self.workdir = workdir
        self.proc = subprocess.Popen(
            [binary, "serve", "--port", "0", "--hostname", "127.0.0.1"],
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=sys.stderr,
            start_new_session=False,
        )
        if self.proc.stdout is None:  # stdout=PIPE made one
            raise RuntimeError("opencode serve has no stdout")
        self.stdout = self.proc.stdout
        port = None
        self.stopping = False
        for raw in self.stdout:
            line = raw.decode("utf-8", "replace")
            if "listening on http://" in line:
                port = int(line.rsplit(":", 1)[1].strip().strip("/"))
                break
        if port is None:
            raise RuntimeError(f"opencode serve exited ({self.proc.wait()}) before it listened")
        self.port = port
        threading.Thread(target=self._drain, daemon=True).start()
        self.watch()

    def _drain(self) -> None:
        for _ in self.stdout:
            pass

    def _connect(self, timeout: float | None) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        return s

    def _head(self, method: str, path: str, body: object) -> bytes:
        data = b"" if body is None else json.dumps(body).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: opencode.internal\r\n"
            f"x-opencode-directory: {urllib.parse.quote(self.workdir, safe='/')}\r\n"
            "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
        )
        return head.encode() + data

    def call(
        self, method: str, path: str, body: object = None, timeout: float | None = None
    ) -> tuple[int, object]:
        """(status, parsed JSON body or None)."""
        s = self._connect(timeout)
        try:
            s.sendall(self._head(method, path, body))
            f = s.makefile("rb")
            status, headers = _read_head(f)
            if headers.get("transfer-encoding", "").lower() == "chunked":
                raw = b"".join(_chunks(f))
            else:
                n = headers.get("content-length")
                raw = f.read(int(n)) if n is not None else f.read()
        finally:
            s.close()
        try:
            parsed: object = json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode("utf-8", "replace")
        return status, parsed

    def events(self) -> Iterator[object]:
        """The instance's event stream: parsed `data:` payloads, until the connection ends."""
        s = self._connect(None)
        s.sendall(self._head("GET", "/event", None))
        f = s.makefile("rb")
        _status, headers = _read_head(f)
        chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        buf = b""
        for chunk in _chunks(f) if chunked else iter(lambda: f.read1(65536), b""):
            buf += chunk
            while b"\n\n" in buf:
                block, buf = buf.split(b"\n\n", 1)
                data = b"\n".join(ln[5:].lstrip() for ln in block.split(b"\n") if ln.startswith(b"data:"))
                if data:
                    try:
                        yield json.loads(data)
                    except ValueError:
                        continue

    def pause(self) -> None:
        """SIGSTOP: between two turns nothing runs in the server (a plugin the agent wrote, say)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def watch(self) -> None:
        """The driver ends with its server (unless the driver stopped it): the host then sees its end."""

        def wait() -> None:
            self.proc.wait()
            if not self.stopping:
                sys.stderr.write(f"driver: opencode serve exited ({self.proc.returncode})\n")
                sys.stderr.flush()
                os._exit(3)

        threading.Thread(target=wait, daemon=True).start()

    def stop(self) -> None:
        """SIGKILL, stopped or not: it is idle (the session aborted), and a SIGCONT for a graceful end would let
        a plugin of the agent's run again. Its store stays consistent (SQLite's journal)."""
        self.stopping = True
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _read_head(f: BufferedReader) -> tuple[int, dict[str, str]]:
    line = f.readline(LINE_MAX)
    parts = line.split()
    status = int(parts[1]) if len(parts) > 1 else 0
    headers = {}
    while True:
        h = f.readline(LINE_MAX)
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers


def _chunks(f: BufferedReader) -> Iterator[bytes]:
    while True:
        size = f.readline(LINE_MAX).strip()
        if not size:
            return
        n = int(size.split(b";")[0], 16)
        if n == 0:
            return
        yield f.read(n)
        f.readline(LINE_MAX)


# ---- one turn ------------------------------------------------------------------------------------------------
class Turns:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.session: str | None = None
        self.sessions: set[str] = set()
        self.idle = threading.Event()
        self.connected = threading.Event()
        self.active = False
        self.running: threading.Thread | None = None  # the thread of the turn in progress
        threading.Thread(target=self._watch, daemon=True).start()
        if not self.connected.wait(60):
            raise RuntimeError("opencode serve: no event stream")

    def _watch(self) -> None:
        """Mirror the event stream as `opencode run --format json` prints it (its loop over events). Without it
        no turn could end, so when it fails or ends (and the server was not stopped on purpose) the driver
        ends, and the host sees that."""
        try:
            for ev in self.server.events():
                try:
                    self._event(ev)
                except Exception as exc:  # noqa: BLE001 - one odd event (a plugin may publish any) is skipped
                    sys.stderr.write(f"driver: event skipped: {type(exc).__name__}: {exc}\n")
        except Exception as exc:  # noqa: BLE001
            sys.stderr.write(f"driver: event stream failed: {type(exc).__name__}: {exc}\n")
        if not self.server.stopping:
            sys.stderr.write("driver: the server's event stream ended\n")
            sys.stderr.flush()
            os._exit(4)

    def _event(self, ev: object) -> None:
        """One event, as run's loop handles it."""
        if not isinstance(ev, dict):
            return
        kind, props = ev.get("type"), _obj(ev.get("properties"))
        if kind == "server.connected":
            self.connected.set()
        sid = self.session
        info = _obj(props.get("info"))
        if (
            kind == "session.created"
            and info.get("parentID") in self.sessions
            and isinstance(info["id"], str)
        ):
            self.sessions.add(info["id"])
        if not self.active or sid is None:
            return
        if kind == "message.part.updated":
            part = _obj(props.get("part"))
            if part.get("sessionID") != sid:
                return
            t = part.get("type")
            state = _obj(part.get("state"))
            if t == "tool" and state.get("status") in ("completed", "error"):
                emit("tool_use", sessionID=sid, part=part)
            elif isinstance(t, str) and t in EMIT:
                emit(EMIT[t], sessionID=sid, part=part)
            elif t in ("text", "reasoning") and _obj(part.get("time")).get("end"):
                emit(str(t), sessionID=sid, part=part)
        elif kind == "session.error" and props.get("sessionID") == sid and props.get("error"):
            emit("error", sessionID=sid, error=props["error"])
        elif kind == "session.status" and props.get("sessionID") == sid:
            if _obj(props.get("status")).get("type") == "idle":
                self.idle.set()
        elif kind == "permission.asked" and props.get("sessionID") in self.sessions:
            pid = props.get("id")
            status, _ = self.server.call("POST", f"/permission/{pid}/reply", {"reply": "reject"}, 30)
            if status == 404:  # the older route
                self.server.call(
                    "POST",
                    f"/session/{props.get('sessionID')}/permissions/{pid}",
                    {"response": "reject"},
                    30,
                )

    def start(self, req: dict[str, object]) -> None:
        self.server.resume()
        self.running = threading.Thread(target=self.turn, args=(req,), daemon=True)
        self.running.start()

    def turn(self, req: dict[str, object]) -> None:
        try:
            self._turn(req)
        except Exception as exc:  # noqa: BLE001 - the host must hear the turn end, whatever went wrong here
            emit("error", error={"name": type(exc).__name__, "data": {"message": str(exc)[:500]}})
        finally:
            self.active = False
            emit("idle", sessionID=self.session)

    def _turn(self, req: dict[str, object]) -> None:
        given = req.get("session")
        sid = given if isinstance(given, str) else None  # the host's record of the edge's session, or none
        if sid:
            status, info = self.server.call("GET", f"/session/{sid}", None, 60)
            if status != 200:
                msg = f"session {sid}: {status}"
                emit("error", error={"name": "SessionNotFound", "data": {"message": msg}})
                return
        else:
            body: dict[str, object] = {"permission": RUN_RULES}
            if req.get("title") is not None:
                body = {"title": req["title"], "permission": RUN_RULES}
            status, info = self.server.call("POST", "/session", body, 60)
            if status != 200 or not isinstance(info, dict):
                emit("error", error={"name": "SessionCreate", "data": {"message": f"{status}: {info}"[:500]}})
                return
            sid = str(info["id"])
        self.session = sid
        self.sessions = {sid}
        self.idle.clear()
        self.active = True
        emit("session", sessionID=sid)
        provider, _, model = str(req.get("model") or "").partition("/")
        prompt: dict[str, object] = {"parts": [{"type": "text", "text": req["text"]}]}
        if provider:
            prompt = {"model": {"providerID": provider, "modelID": model}, **prompt}
        status, res = self.server.call("POST", f"/session/{sid}/message", prompt, None)
        if status >= 400:
            emit("error", sessionID=sid, error=res if isinstance(res, dict) else {"name": str(res)[:500]})
        self.idle.wait(30)  # the idle status follows the reply

    def abort(self, reap: bool) -> None:
        """End the turn: abort every session still working (the agent may have started others through the
        server's API), wait for the turn to end, then with `reap` stop the server and kill everything else of
        the sandbox (`quiesce`), so that nothing of the agent (its commands, a plugin in the server) runs until
        the next turn. `aborted` only when all of that is done, else `abort_failed` (the host then kills the
        sandbox)."""
        ok = True
        try:
            self.server.resume()
            status, busy = self.server.call("GET", "/session/status", None, 10)
            sessions = set(busy) if status == 200 and isinstance(busy, dict) else set()
            for sid in sessions | ({self.session} if self.session else set()):
                self.server.call("POST", f"/session/{sid}/abort", {}, 10)
        except (OSError, ValueError):
            ok = False
        if self.running is not None:
            self.running.join(20)
            ok = ok and not self.running.is_alive()
        if reap:
            ok = quiesce(self.server.proc.pid) and ok
        emit("aborted" if ok else "abort_failed")


def _tasks_in(pid: int | str, states: str) -> bool:
    """Every thread of `pid` is in one of `states` (a thread that is gone counts as in)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in states:
                    return False
        except (OSError, IndexError):
            continue
    return True


def _stopped(pid: int, timeout: float = 2.0) -> bool:
    """Wait until every thread of `pid` is stopped (SIGSTOP takes effect a little after kill returns)."""
    end = time.monotonic() + timeout
    while not _tasks_in(pid, "Tt"):
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def quiesce(server: int, timeout: float = 10.0) -> bool:
    """Stop `server` and kill every other process of this PID namespace (but us and our ancestors); True once
    the server is stopped and nothing else is left. A process of the agent's may SIGCONT the server meanwhile,
    or the server may be forking: so stop, wait until it is, reap, and repeat until the server is still
    stopped with nothing left to wake it."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        os.kill(server, signal.SIGSTOP)
        if _stopped(server) and _reap({os.getpid(), server}) and _tasks_in(server, "Tt"):
            return True
    return False


def _reap(keep: set[int]) -> bool:
    """SIGKILL every process of this PID namespace but `keep` and our ancestors (bwrap's init), whatever its
    state; True once all are gone (every thread of each a zombie or dead), False if some are left after 5 s
    or may not be killed."""
    anc, p = set(), os.getpid()
    while p > 1:
        anc.add(p)
        try:
            with open(f"/proc/{p}/stat") as f:
                p = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    keep = keep | anc | {1}
    end = time.monotonic() + 5
    while time.monotonic() < end:
        left = 0
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in keep:
                continue
            try:
                os.kill(int(name), signal.SIGKILL)
            except ProcessLookupError:
                continue
            except OSError:
                return False  # not ours to kill
            if not _tasks_in(name, "ZX"):
                left += 1
        if not left:
            return True
        time.sleep(0.02)
    return False


def save(server: Server, store: str, out: str) -> None:
    """Kill the (stopped) server, then copy its session store to `out` with SQLite's backup (the WAL included,
    one file); `save_failed` if there is none or it cannot be read."""
    server.stop()
    tmp = out + ".tmp"
    for p in (out, tmp):  # nothing the agent may have left there is taken for the copy
        if os.path.lexists(p):
            os.unlink(p)
    try:
        if not os.path.exists(store):
            raise OSError(f"no session store at {store}")
        src = sqlite3.connect(store, timeout=5)
        dst = sqlite3.connect(tmp)
        with dst:
            src.backup(dst)
        src.close()
        dst.close()
        os.replace(tmp, out)
    except (sqlite3.Error, OSError) as exc:
        emit("save_failed", message=f"{type(exc).__name__}: {exc}"[:300])
        return
    emit("saved")


def _undumpable() -> None:
    """Not dumpable: another process of the sandbox's uid (the agent's) may then not ptrace this one nor read
    its memory or environment; that would take CAP_SYS_PTRACE, which the sandbox has not."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        sys.stderr.write("driver: PR_SET_DUMPABLE unavailable\n")


def main(argv: list[str]) -> int:
    _undumpable()
    binary, workdir, store, out = argv[:4]
    rest = argv[4:]
    i = rest.index("--fds")
    fds = int(rest[i + 1]), int(rest[i + 2])
    for fd in fds:
        os.set_inheritable(fd, False)  # not for the server, nor anything it starts
    HOST["in"], HOST["out"] = os.fdopen(fds[0], "rb"), os.fdopen(fds[1], "wb")
    if "--bridge" in rest:
        i = rest.index("--bridge")
        bridge(rest[i + 1], int(rest[i + 2]))
    reap = "--reap" in rest
    server = Server(binary, workdir)
    turns = Turns(server)
    emit("ready")
    for line in HOST["in"]:
        try:
            req = _obj(json.loads(line))
        except ValueError:
            continue
        op = req.get("op")
        if op == "turn":
            turns.start(req)
        elif op == "abort":
            turns.abort(reap)
        elif op == "save":
            save(server, store, out)
            return 0
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

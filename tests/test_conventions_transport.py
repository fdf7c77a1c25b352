"""One way to the Teacher: teacher/transport.py is the only module in src/ that speaks HTTP as a client
(docs/failures.md, "The Teacher transport"). Every other module reaches the Teacher, its router and its workers
through it: the client's requests, the proxy's upstream calls, the fleet's and the launcher's health probes
(`transport.probe`). teacher/http.py may import requests and urllib3 for the connection classes the transport
mounts, but sends nothing itself. Servers (`http.server`) are not clients and are not checked.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "sftree"
TRANSPORT = "teacher/transport.py"
WIRE = "teacher/http.py"  # the transport's connection classes
CLIENT_LIBS = ("requests", "urllib3", "http.client", "httpx", "aiohttp", "urllib.request", "pycurl")
SENDS = re.compile(r"\brequests\.(get|post|put|head|delete|patch|request|Session)\b|\.urlopen\(")


def _client_imports(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        out |= {n for n in names if any(n == lib or n.startswith(lib + ".") for lib in CLIENT_LIBS)}
    return out


def test_only_the_transport_imports_an_http_client():
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        libs = _client_imports(ast.parse(path.read_text(encoding="utf-8")))
        if libs and rel not in (TRANSPORT, WIRE):
            found[rel] = sorted(libs)
    assert found == {}, f"HTTP clients outside {TRANSPORT}: {found}"


def test_only_the_transport_sends_requests():
    senders = {
        path.relative_to(SRC).as_posix()
        for path in SRC.rglob("*.py")
        if SENDS.search(path.read_text(encoding="utf-8"))
    }
    assert senders == {TRANSPORT}

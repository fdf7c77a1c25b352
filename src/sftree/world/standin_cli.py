"""A stand-in `coral` for the read-only commands, for a sandbox without an installed Coral:
`python -I standin_cli.py log|show|notes|skills|status ...`, run in the agent's worktree.

It reads the Coral-shaped layout (`.coral_dir` in the working folder -> `<coral_dir>/public/{attempts,notes,skills}`
and `<coral_dir>/config.yaml` for the direction) and prints what Coral's CLI prints for the same commands and flags
(`log -n --recent --agent --search --all --class`, `show HASH [--diff]`, `notes --search -n --read`, `skills
--read`), in Coral's formats. Standard library only; nothing of sftree is imported. `show` prints no git summary
(the commits are the host's). `status` prints a short summary of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# a JSON document in Coral's shape (this program runs under another Python and imports nothing of sftree)
Doc = dict[str, Any]

CLASSES = ("real", "grader_error", "tune")


def coral_dir() -> Path:
    crumb = Path.cwd() / ".coral_dir"
    try:
        return Path(crumb.read_text().strip())
    except OSError:
        sys.stderr.write("Error: no .coral_dir here (not an agent worktree)\n")
        sys.exit(1)


def direction(cd: Path) -> str:
    try:
        text = (cd / "config.yaml").read_text()
    except OSError:
        return "maximize"
    m = re.search(r"^grader:\s*\n(?:[ \t]+.*\n)*?[ \t]+direction:\s*['\"]?(\w+)", text, re.M)
    return m.group(1) if m else "maximize"


# ---- attempts ----
def budget(a: Doc) -> str:
    meta = a.get("metadata") or {}
    cls = meta.get("budget_class") if isinstance(meta, dict) else None
    return cls if cls in CLASSES else "real"


def attempts(cd: Path) -> list[Doc]:
    out: list[Doc] = []
    d = cd / "public" / "attempts"
    if not d.is_dir():
        return out
    for f in sorted(d.glob("*.json")):
        try:
            data = json.loads(f.read_text())
            for key in ("commit_hash", "agent_id", "title", "timestamp"):
                data[key]  # noqa: B018 - as Attempt.from_dict: a record without them is skipped
        except (ValueError, KeyError, TypeError, OSError):
            continue
        data.setdefault("score", None)
        data.setdefault("status", "crashed")
        data.setdefault("feedback", "")
        out.append(data)
    return out


def fmt_time(ts: Any) -> str:  # (a record's timestamp as Coral wrote it: any other value shown cut short)
    try:
        return datetime.fromisoformat(ts).strftime("%m-%d %H:%M:%S")
    except (ValueError, TypeError):
        return ts[:19] if ts else "—"


def leaderboard(rows: list[Doc]) -> str:
    if not rows:
        return "No attempts yet."
    lines = [
        "| Rank | Score            | Agent   | Class  | Title                                    | Time        | Commit   |",
        "|------|------------------|---------|--------|------------------------------------------|-------------|----------|",
    ]
    for i, a in enumerate(rows, 1):
        score = f"{a['score']:.10f}" if a["score"] is not None else "—"
        title = a["title"][:40].ljust(40) if a["title"] else "—".ljust(40)
        cls = "error" if budget(a) == "grader_error" else budget(a)
        lines.append(
            f"| {i:<4} | {score:>16} | {a['agent_id']:<7} | {cls:<6} | {title} | {fmt_time(a['timestamp']):<11} | {a['commit_hash'][:8]} |"
        )
    return "\n".join(lines)


def cmd_log(args: argparse.Namespace, cd: Path) -> None:
    count = args.count or 20
    raw_n = count if (args.all or args.budget_class) else max(count * 4, 40)

    def keep(rows: list[Doc]) -> list[Doc]:
        if args.budget_class:
            return [a for a in rows if budget(a) == args.budget_class]
        return rows if args.all else [a for a in rows if budget(a) == "real"]

    every = attempts(cd)
    if args.search:
        q = args.search.lower()
        rows = keep([a for a in every if q in f"{a['title']} {a['feedback']} {a['status']}".lower()])[:count]
        print(
            f"Search results for '{args.search}':\n{leaderboard(rows)}"
            if rows
            else f"No attempts matching '{args.search}'."
        )
    elif args.agent:
        rows = keep([a for a in every if a["agent_id"] == args.agent])[:count]
        print(f"Attempts by {args.agent}:\n{leaderboard(rows)}" if rows else f"No attempts by {args.agent}.")
    elif args.recent:
        rows = keep(sorted(every, key=lambda a: a["timestamp"], reverse=True)[:raw_n])[:count]
        print(f"Recent {len(rows)} attempt(s):\n{leaderboard(rows)}" if rows else "No attempts yet.")
    else:
        scored = [a for a in every if a["score"] is not None]
        scored.sort(key=lambda a: a["score"] or 0.0, reverse=direction(cd) != "minimize")
        rows = keep(scored[:raw_n])[:count]
        print(f"Leaderboard (top {len(rows)}):\n{leaderboard(rows)}" if rows else "No attempts yet.")


def cmd_show(args: argparse.Namespace, cd: Path) -> None:
    d = cd / "public" / "attempts"
    f = d / f"{args.hash}.json"
    if not f.exists():
        matches = list(d.glob(f"{args.hash}*.json"))
        if len(matches) > 1:
            print(f"Ambiguous hash prefix '{args.hash}'. Matches:")
            for m in matches:
                print(f"  {m.stem}")
            return
        if not matches:
            print(f"Attempt {args.hash} not found.")
            return
        f = matches[0]
    data = json.loads(f.read_text())
    print(f"Commit:  {data['commit_hash']}")
    print(f"Agent:   {data['agent_id']}")
    print(f"Title:   {data['title']}")
    print(f"Score:   {data.get('score', '—')}")
    print(f"Status:  {data['status']}")
    print(f"Budget:  {budget(data)}")
    print(f"Time:    {data['timestamp']}")
    if data.get("parent_hash"):
        print(f"Parent:  {data['parent_hash']}")
    if data.get("feedback"):
        print(f"Feedback: {data['feedback']}")


# ---- notes ----
def _front(text: str) -> tuple[dict[str, str], str]:
    if text.startswith("---"):
        end = text.find("---", 3)
        if end != -1:
            meta: dict[str, str] = {}
            for line in text[3:end].strip().splitlines():
                if ":" in line:
                    k, _, v = line.partition(":")
                    meta[k.strip()] = v.strip()
            return meta, text[end + 3 :].strip()
    return {}, text


def _legacy(text: str) -> list[Doc]:
    out = []
    for part in re.compile(r"^## ", re.M).split(text):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"\[([^\]]*)\]\s*(.*)", part, re.S)
        if m:
            date, (title, _, body) = m.group(1).strip(), m.group(2).partition("\n")
        else:
            date, (title, _, body) = "", part.partition("\n")
        out.append(
            {
                "date": date,
                "title": title.strip(),
                "body": body.strip(),
                "creator": "",
                "filename": "notes.md",
            }
        )
    return out


def _note(path: Path) -> Doc:
    meta, body = _front(path.read_text())
    title = path.stem.replace("-", " ").replace("_", " ").title()
    for line in body.splitlines():
        if line.strip().startswith("# "):
            title = line.strip()[2:].strip()
            break
    return {
        "date": meta.get("created", ""),
        "title": title,
        "body": body,
        "creator": meta.get("creator", ""),
        "filename": path.name,
        "_mtime": os.path.getmtime(path),
    }


def _collect(d: Path) -> list[Doc]:
    if not d.is_dir():
        return []
    files = sorted(f for f in d.rglob("*.md") if f.name != "notes.md" and not f.name.startswith("_"))
    legacy = d / "notes.md"
    has_legacy = legacy.exists() and legacy.stat().st_size > 0
    entries = [_note(f) for f in files]
    if has_legacy:
        entries += _legacy(legacy.read_text())
    return entries


def _when(e: Doc) -> datetime:
    if e.get("date"):
        try:
            dt = datetime.fromisoformat(e["date"])
            return dt if dt.tzinfo else dt.replace(tzinfo=UTC)
        except (ValueError, TypeError):
            pass
    if e.get("_mtime") is not None:
        return datetime.fromtimestamp(e["_mtime"], tz=UTC)
    return datetime.min.replace(tzinfo=UTC)


def notes(cd: Path) -> list[Doc]:
    entries = _collect(cd / "public" / "notes")
    seen = {e["filename"] for e in entries}
    for e in _collect(cd / "public" / "insights"):
        if e["filename"] not in seen:
            entries.append(e)
    entries.sort(key=_when)
    return entries


def fmt_notes(entries: list[Doc]) -> str:
    if not entries:
        return "No notes yet."
    return "\n".join(
        f"  {i}. {'[' + e['date'] + '] ' if e.get('date') else ''}{e['title']}{' (' + e['creator'] + ')' if e.get('creator') else ''}"
        for i, e in enumerate(entries, 1)
    )


def cmd_notes(args: argparse.Namespace, cd: Path) -> None:
    if args.read:
        try:
            idx = int(args.read)
        except ValueError:
            print("\n\n---\n\n".join(e["body"] for e in notes(cd)))
            return
        entries = notes(cd)
        print(entries[idx - 1]["body"] if 1 <= idx <= len(entries) else f"Note #{idx} not found.")
    elif args.search:
        q = args.search.lower()
        hits = [e for e in notes(cd) if q in f"{e['title']} {e['body']}".lower()]
        print(
            f"Notes matching '{args.search}':\n{fmt_notes(hits)}"
            if hits
            else f"No notes matching '{args.search}'."
        )
    elif args.recent:
        entries = notes(cd)
        entries = entries[-args.recent :] if len(entries) > args.recent else entries
        print(f"Recent notes ({len(entries)}):\n{fmt_notes(entries)}")
    else:
        entries = notes(cd)
        print(f"Notes ({len(entries)}):\n{fmt_notes(entries)}")


# ---- skills ----
def _skill_front(text: str) -> Doc:
    m = re.match(r"^---\s*\n(.*?)\n---\s*\n(.*)", text, re.S)
    if not m:
        return {}
    meta = {}
    for line in m.group(1).splitlines():
        if ":" in line and not line.startswith((" ", "\t")):
            k, _, v = line.partition(":")
            meta[k.strip()] = v.strip().strip("'\"")
    return meta


def cmd_skills(args: argparse.Namespace, cd: Path) -> None:
    d = cd / "public" / "skills"
    if args.read:
        sd = d / args.read
        if not sd.is_dir():
            matches = (
                [p for p in d.iterdir() if p.is_dir() and p.name.startswith(args.read)] if d.is_dir() else []
            )
            if len(matches) > 1:
                print(f"Ambiguous name '{args.read}'. Matches:")
                for m in matches:
                    print(f"  {m.name}")
                return
            if not matches:
                print(f"Skill '{args.read}' not found.")
                return
            sd = matches[0]
        md = sd / "SKILL.md"
        print(md.read_text() if md.exists() else "")
        files = [str(f.relative_to(sd)) for f in sorted(sd.rglob("*")) if f.is_file()]
        if files:
            print(f"\nFiles: {', '.join(files)}")
        return
    rows = []
    for sd in sorted(d.iterdir()) if d.is_dir() else []:
        md = sd / "SKILL.md"
        if sd.is_dir() and md.exists():
            meta = _skill_front(md.read_text())
            rows.append((meta.get("name") or sd.name, meta.get("description", "")))
    print(f"Skills ({len(rows)}):")
    if not rows:
        print("No skills yet.")
    else:
        print("\n".join(f"  {i}. {n}{' — ' + desc if desc else ''}" for i, (n, desc) in enumerate(rows, 1)))


def cmd_status(args: argparse.Namespace, cd: Path) -> None:
    every = attempts(cd)
    scored = [a for a in every if a["score"] is not None]
    print(
        f"Attempts: {len(every)}  |  Scored: {len(scored)}  |  Crashed: {sum(a['status'] == 'crashed' for a in every)}"
    )
    if scored:
        pick = min if direction(cd) == "minimize" else max
        best = pick(scored, key=lambda a: a["score"])
        print(f"Best:  {best['score']:.10f}  ({best['title'][:50]})")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="coral")
    sub = p.add_subparsers(dest="command")
    lg = sub.add_parser("log")
    lg.add_argument("-n", "--count", type=int, default=20)
    lg.add_argument("--recent", action="store_true")
    lg.add_argument("--agent")
    lg.add_argument("--search")
    g = lg.add_mutually_exclusive_group()
    g.add_argument("--all", action="store_true")
    g.add_argument("--class", dest="budget_class", choices=CLASSES)
    sh = sub.add_parser("show")
    sh.add_argument("hash")
    sh.add_argument("--diff", action="store_true")
    nt = sub.add_parser("notes")
    nt.add_argument("--search", "-s")
    nt.add_argument("-n", "--recent", type=int)
    nt.add_argument("--read", "-r")
    sk = sub.add_parser("skills")
    sk.add_argument("--read", "-r")
    sub.add_parser("status")
    for s in (lg, sh, nt, sk):
        s.add_argument("--task")
        s.add_argument("--run")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.command:
        parser().print_help()
        return 0
    cd = coral_dir()
    {"log": cmd_log, "show": cmd_show, "notes": cmd_notes, "skills": cmd_skills, "status": cmd_status}[
        args.command
    ](args, cd)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Results files of the benchmarks: every JSON a benchmark writes says how it was made.

docs/benchmarks.md is generated from `benchmarks/results/*.json` (benchmarks/render_docs.py) and prints,
above each table, the command, date and commit the figures came from. So every benchmark writes its JSON
through `write_results`, which adds three keys in front of the payload:

- `command`: the command line, as run from the repository root (`python benchmarks/<script> <args>`); a path
  argument outside the repository is written as `PATH/<file name>`, so a results file never records a
  local folder layout;
- `measured_at`: the date (YYYY-MM-DD) the run finished;
- `commit`: the short hash of HEAD, plus `tree_dirty` (true when tracked files had uncommitted edits).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
STAMP_KEYS = ("command", "measured_at", "commit")
_PIECE = re.compile(r"[^\s:=,?&]+")  # path candidates inside `key=value`, `alpaca:<path>?opt` and lists


def _public_piece(piece: str) -> str:
    """`piece` unchanged unless it is a path that leaves the repository; then `PATH/<name>`."""
    if "/" not in piece:
        return piece
    path = Path(piece) if os.path.isabs(piece) else Path.cwd() / piece
    try:
        path.resolve().relative_to(REPO)
    except ValueError:
        return f"PATH/{path.name}"
    return piece


def public_arg(arg: str) -> str:
    """One command-line argument with every out-of-repository path replaced by `PATH/<name>`."""
    return _PIECE.sub(lambda m: _public_piece(m.group(0)), arg)


def command_line(script: str, argv: Sequence[str]) -> str:
    """`python benchmarks/<script> <args>` as typed from the repository root, paths made public."""
    try:
        rel = Path(script).resolve().relative_to(REPO).as_posix()
    except ValueError:
        rel = Path(script).name
    args = [public_arg(a) for a in argv]
    quoted = [a if re.fullmatch(r"[\w@%+=:,./-]+", a) else "'" + a.replace("'", "'\\''") + "'" for a in args]
    return " ".join(["python", rel, *quoted])


def current_commit() -> Dict[str, Any]:
    """HEAD's short hash and whether tracked files differ from it (`unknown` outside a git checkout)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=30, cwd=REPO,
                              check=True).stdout.strip()

    try:
        return {"commit": git("rev-parse", "--short", "HEAD"),
                "tree_dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "tree_dirty": None}


def stamp(payload: Mapping[str, Any], script: str, argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """`payload` with `command`, `measured_at`, `commit` and `tree_dirty` in front (the stamp wins over
    payload keys of the same name)."""
    head = {"command": command_line(script, sys.argv[1:] if argv is None else argv),
            "measured_at": _dt.date.today().isoformat(), **current_commit()}
    return {**head, **{k: v for k, v in payload.items() if k not in head}}


def write_results(path: str | Path, payload: Mapping[str, Any], script: str,
                  argv: Optional[Sequence[str]] = None, indent: int = 2) -> Path:
    """Write `stamp(payload, ...)` as JSON to `path` (parents created) and return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stamp(payload, script, argv), indent=indent, default=float) + "\n")
    return out

"""Reading JSON Lines files whose every line is an object, naming the file and line on bad input.

One reader for the length history, rollout logs, run metrics, plans, step timings and datasets, so every
malformed line is reported the same way (`path:line: invalid JSON (...)`). Datasets may also come as one JSON
array of objects (`iter_json_objects`); each element then carries the line it starts on.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple, Union

from mindspeed_asp.errors import InputError
from mindspeed_asp.textfile import decode_utf8, read_text

PathLike = Union[str, Path]
_BLANK = b" \t\r\n"


def iter_jsonl_objects(path: PathLike) -> Iterator[Tuple[int, Dict[str, Any]]]:
    """Yield (line number, object) for each non-blank line; streams, so large logs need no full copy."""
    path = Path(path)
    with path.open("rb") as fh:  # bytes: a line that is not UTF-8 is reported with its number
        for lineno, raw in enumerate(fh, start=1):
            line = decode_utf8(raw, path, line=lineno)
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"invalid JSON ({exc.msg})", path=str(path), line=lineno) from None
            _check_object(rec, path, lineno)
            yield lineno, rec


def iter_json_objects(path: PathLike) -> Iterator[Tuple[int, Dict[str, Any]]]:
    """Yield (line number, object) from a JSON Lines file, or from a file holding one JSON array of objects
    (its first non-blank character is '['); a missing file, bad JSON or a non-object names file and line."""
    path = Path(path)
    if not path.is_file():
        raise InputError("file not found", path=str(path))
    if _first_byte(path) == b"[":
        yield from _iter_array(path)
    else:
        yield from iter_jsonl_objects(path)


def _check_object(rec: Any, path: Path, line: int) -> None:
    if not isinstance(rec, dict):
        raise InputError("each line must be a JSON object", path=str(path), line=line)


def _first_byte(path: Path) -> bytes:
    with path.open("rb") as fh:
        while True:
            chunk = fh.read(4096)
            if not chunk:
                return b""
            rest = chunk.lstrip(_BLANK)
            if rest:
                return rest[:1]


def _iter_array(path: Path) -> Iterator[Tuple[int, Dict[str, Any]]]:
    """The elements of a JSON array file, each with the line it starts on."""
    text = read_text(path)  # names the line of a byte that is not UTF-8
    decoder = json.JSONDecoder()
    n = len(text)
    pos = text.index("[") + 1

    def skip_blank(i: int) -> int:
        while i < n and text[i] in " \t\r\n":
            i += 1
        return i

    while True:
        pos = skip_blank(pos)
        if pos < n and text[pos] == "]":
            return
        line = 1 + text.count("\n", 0, pos)
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise InputError(f"invalid JSON ({exc.msg})", path=str(path), line=exc.lineno) from None
        _check_object(obj, path, line)
        yield line, obj
        pos = skip_blank(pos)
        if pos < n and text[pos] == ",":
            pos += 1
        elif pos < n and text[pos] == "]":
            return
        else:
            raise InputError("expected ',' or ']' in JSON array", path=str(path), line=1 + text.count("\n", 0, pos))

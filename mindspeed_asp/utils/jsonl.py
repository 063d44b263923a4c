"""Reading JSON and JSON Lines inputs, naming the file, line and key on bad input.

One reader for the length history, rollout logs, run metrics, plans, step timings, datasets, cost files and
plan headers, so every malformed input is reported the same way (`path:line: invalid JSON (...)`). Datasets may
also come as one JSON array of objects (`iter_json_objects`); each element then carries the line it starts on.

A key given twice in one object is refused (`path:line: key 'a.b': duplicate key ...`): Python's json keeps
the last value silently, so a hand-edited cost file, plan header or dataset line would lose the first one
without a word. Why a second, pure-Python pass to find it: the C decoder's `object_pairs_hook` sees the pairs
but not where they stand, and a walk over every input would be slow; the walk runs only once a duplicate is
known, on that one document.
"""
from __future__ import annotations

import json
from json.decoder import scanstring
from json.scanner import py_make_scanner
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from mindspeed_asp.errors import InputError
from mindspeed_asp.utils.textfile import decode_utf8, read_text

PathLike = Union[str, Path]
_BLANK = b" \t\r\n"
_WS = " \t\r\n"


class _DuplicateKey(Exception):
    """Raised by the pairs hook: `key` appears twice in one object."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_pairs)


def loads(text: str, path: PathLike, line: Optional[int] = 1, key: Optional[str] = None) -> Any:
    """One JSON document, `text`, read from `path` (its first line is line `line` of the file; None: the text
    is not in the file's lines, e.g. Parquet metadata). Invalid JSON and a key repeated in one object are
    refused as InputErrors naming the file, the line and the key (`key` prefixes the dotted key, e.g. the
    metadata entry that held the text)."""
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        at = min(exc.pos, len(text.rstrip()))  # a document cut short is named on its last line, not the next
        raise InputError(f"invalid JSON ({exc.msg})", path=str(path), key=key,
                         line=None if line is None else line + text.count("\n", 0, at)) from None
    except _DuplicateKey as dup:
        raise _duplicate_error(text, 0, dup.key, path, line, key) from None


def _decode_at(text: str, pos: int, path: PathLike) -> Tuple[Any, int]:
    """(value, end) of the JSON value starting at `pos` of a whole file's text (lines counted from 1)."""
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON ({exc.msg})", path=str(path), line=exc.lineno) from None
    except _DuplicateKey as dup:
        raise _duplicate_error(text, pos, dup.key, path, 1, None) from None


def _duplicate_error(text: str, pos: int, key: str, path: PathLike, line: Optional[int],
                     prefix: Optional[str]) -> InputError:
    """The refusal of a repeated key: where it stands (found by `_first_repeat`) and where it was first given."""
    found = _first_repeat(text, pos)
    dotted, at, first = found if found is not None else (key, None, None)
    if prefix:
        dotted = f"{prefix}.{dotted}"
    where = None if line is None or at is None else line + text.count("\n", 0, at)
    before = "" if line is None or first is None else f"first given on line {line + text.count(chr(10), 0, first)}; "
    return InputError(f"duplicate key ({before}JSON would keep the last silently): give each key once",
                      path=str(path), line=where, key=dotted)


class _Found(Exception):
    def __init__(self, dotted: str, at: int, first: int) -> None:
        super().__init__(dotted)
        self.found = (dotted, at, first)


def _first_repeat(text: str, pos: int) -> Optional[Tuple[str, int, int]]:
    """(dotted key, offset, offset of its first occurrence) of the first key repeated in one object of the
    JSON value at `pos`, in document order; None if the walk cannot tell (it then names no line)."""
    scalar = py_make_scanner(json.JSONDecoder())
    n = len(text)

    def skip(i: int) -> int:
        while i < n and text[i] in _WS:
            i += 1
        return i

    def walk(i: int, where: str) -> int:
        i = skip(i)
        if text[i] == "{":
            seen: Dict[str, int] = {}
            i = skip(i + 1)
            if text[i] == "}":
                return i + 1
            while True:
                name, j = scanstring(text, i + 1)
                dotted = f"{where}.{name}" if where else name
                if name in seen:
                    raise _Found(dotted, i, seen[name])
                seen[name] = i
                j = walk(skip(j) + 1, dotted)  # past the ':'
                j = skip(j)
                if text[j] == "}":
                    return j + 1
                i = skip(j + 1)  # past the ','
        if text[i] == "[":
            i = skip(i + 1)
            if text[i] == "]":
                return i + 1
            k = 0
            while True:
                i = skip(walk(i, f"{where}[{k}]"))
                k += 1
                if text[i] == "]":
                    return i + 1
                i += 1  # past the ','
        return scalar(text, i)[1]

    try:
        walk(pos, "")
    except _Found as hit:
        return hit.found
    except (ValueError, IndexError, StopIteration, RecursionError):
        return None
    return None


def iter_jsonl_objects(path: PathLike) -> Iterator[Tuple[int, Dict[str, Any]]]:
    """Yield (line number, object) for each non-blank line; streams, so large logs need no full copy."""
    path = Path(path)
    with path.open("rb") as fh:  # bytes: a line that is not UTF-8 is reported with its number
        for lineno, raw in enumerate(fh, start=1):
            line = decode_utf8(raw, path, line=lineno)
            if not line.strip():
                continue
            rec = loads(line, path, line=lineno)
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
    n = len(text)
    pos = text.index("[") + 1

    def skip_blank(i: int) -> int:
        while i < n and text[i] in _WS:
            i += 1
        return i

    while True:
        pos = skip_blank(pos)
        if pos < n and text[pos] == "]":
            return
        line = 1 + text.count("\n", 0, pos)
        obj, pos = _decode_at(text, pos, path)
        _check_object(obj, path, line)
        yield line, obj
        pos = skip_blank(pos)
        if pos < n and text[pos] == ",":
            pos += 1
        elif pos < n and text[pos] == "]":
            return
        else:
            raise InputError("expected ',' or ']' in JSON array", path=str(path), line=1 + text.count("\n", 0, pos))

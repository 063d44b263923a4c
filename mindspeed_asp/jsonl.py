"""Reading JSON Lines files whose every line is an object, naming the file and line on bad input.

One reader for the length history, rollout logs, step timings and datasets, so every malformed line is
reported the same way (`path:line: invalid JSON (...)`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple, Union

from mindspeed_asp.errors import InputError
from mindspeed_asp.textfile import decode_utf8


def iter_jsonl_objects(path: Union[str, Path]) -> Iterator[Tuple[int, Dict[str, Any]]]:
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
            if not isinstance(rec, dict):
                raise InputError("each line must be a JSON object", path=str(path), line=lineno)
            yield lineno, rec

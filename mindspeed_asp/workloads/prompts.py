"""Prompt datasets as the scheduler sees them: ids and prompt lengths, read from JSON Lines.

The planner only needs each prompt's id (to find its length history) and its prompt length (prefill and KV
cost); the text stays with the trainer. One line per prompt:

    {"prompt_id": "17", "prompt_len": 231, "source": "math"}
    {"id": 18, "prompt_token_ids": [151644, 872, ...]}

`prompt_id` (or `id`) is required and unique; `prompt_len` or `prompt_token_ids` gives the length; `source`
is optional (a cold-start feature). Every malformed line stops the load with the file and line named.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional, Union

import numpy as np

from mindspeed_asp.utils.atomic import atomic_open
from mindspeed_asp.errors import InputError
from mindspeed_asp.utils.jsonl import iter_json_objects
from mindspeed_asp.core.limits import length_value
from mindspeed_asp.core.problem import PromptSet

PathLike = Union[str, Path]


def _int_field(rec: dict, key: str, path: str, line: int) -> int:
    """A prompt length: an integer in 0 .. MAX_LENGTH tokens (mindspeed_asp/core/limits.py)."""
    return length_value(rec[key], path=path, line=line, key=key, lo=0, what="prompt length", integral_floats=True)


def load_prompt_set(path: PathLike, n: int = 8) -> PromptSet:
    """Read a prompt dataset (JSON Lines, see module doc) into a PromptSet with n samples per prompt."""
    spath = str(path)
    ids: List[str] = []
    lens: List[int] = []
    sources: List[Optional[str]] = []
    seen = {}
    for line, rec in iter_json_objects(path):
        key = "prompt_id" if "prompt_id" in rec else "id"
        pid = rec.get(key)
        if pid is None or isinstance(pid, (list, dict, bool)):
            raise InputError("missing or invalid prompt id", path=spath, line=line, key="prompt_id")
        pid = str(pid)
        if pid in seen:
            raise InputError(f"duplicate prompt id {pid!r} (first on line {seen[pid]})", path=spath, line=line,
                             key=key)
        seen[pid] = line
        if "prompt_len" in rec:
            plen = _int_field(rec, "prompt_len", spath, line)
        elif "prompt_token_ids" in rec:
            toks = rec["prompt_token_ids"]
            if not isinstance(toks, list):
                raise InputError("prompt_token_ids must be a list", path=spath, line=line, key="prompt_token_ids")
            plen = length_value(len(toks), path=spath, line=line, key="prompt_token_ids", lo=0, what="prompt length")
        else:
            raise InputError("missing prompt length", path=spath, line=line, key="prompt_len")
        src = rec.get("source")
        if src is not None and not isinstance(src, str):
            raise InputError("source must be a string", path=spath, line=line, key="source")
        ids.append(pid)
        lens.append(plen)
        sources.append(src)
    if not ids:
        raise InputError("no prompts in file", path=spath)
    has_src = any(s is not None for s in sources)
    return PromptSet(prompt_ids=np.array(ids, dtype=object), prompt_lens=np.array(lens, dtype=np.int64), n=n,
                     sources=np.array([s or "" for s in sources], dtype=object) if has_src else None,
                     origin=spath)


def save_prompt_set(prompts: PromptSet, path: PathLike) -> None:
    """Write a PromptSet as JSON Lines readable by `load_prompt_set` (n is not stored: the run config has it)."""
    with atomic_open(path) as fh:  # whole or not at all (temp file + rename)
        for i in range(len(prompts)):
            rec = {"prompt_id": str(prompts.prompt_ids[i]), "prompt_len": int(prompts.prompt_lens[i])}
            if prompts.sources is not None:
                rec["source"] = str(prompts.sources[i])
            fh.write(json.dumps(rec) + "\n")


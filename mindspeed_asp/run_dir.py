"""A run's output directory: refuse to mix two runs in one, or clear the old run's files when told to.

`asp train` appends to rollout_log.jsonl, and the next `asp plan` reads that log as one history, so a second
run written into the same directory would silently make a prompt's epoch hold two runs' lengths. A directory
that already holds a run is therefore refused unless the user asks for `--overwrite`, which removes the
files a run writes (and only those: anything else the user put there stays), or continues that run with
`asp train --resume DIR` from its checkpoint.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import List, Optional, Sequence, Union

from mindspeed_asp.atomic import check_output_dir
from mindspeed_asp.errors import OutputError

#: Every file `asp train` writes into its run directory (docs/runtime.md, "Errors and safe output").
RUN_FILES = ("summary.json", "metrics.jsonl", "trace.json", "rollout_log.jsonl", "length_history.jsonl",
             "dataset.jsonl", "gantt.png", "queue.png", "lag_hist.png", "reward.png", "checkpoint")
#: The files whose presence means the directory holds a run (any one of them).
RUN_MARKERS = ("summary.json", "rollout_log.jsonl", "metrics.jsonl", "checkpoint/latest.json")
#: Written by every checkpoint (runtime/checkpoint.py): a run that has one can be continued with --resume.
CHECKPOINT_POINTER = "checkpoint/latest.json"


def run_files(directory: Union[str, Path]) -> List[Path]:
    """The run files present in `directory` (none when it does not exist)."""
    d = Path(directory)
    return [d / name for name in RUN_FILES if (d / name).exists()]


def holds_run(directory: Union[str, Path]) -> Optional[str]:
    """The first run marker found in `directory`, or None."""
    d = Path(directory)
    return next((name for name in RUN_MARKERS if (d / name).is_file()), None)


def prepare_run_dir(directory: Union[str, Path], overwrite: bool, key: str = "--out",
                    markers: Sequence[str] = (), resume_flag: Optional[str] = None) -> Path:
    """Check that `directory` can take a new run, before any work starts.

    Refuses a path that cannot be a writable directory, and one that already holds a run (or one of the
    extra `markers` files) unless `overwrite`, in which case the old run's files are removed now, so the new
    run never appends to them. `resume_flag` (asp train's `--resume`) is named in the refusal as the way to
    continue the run. Returns the directory (not created here).
    """
    d = check_output_dir(directory, key=key)
    found = holds_run(d) or next((m for m in markers if (d / m).exists()), None)
    if found is None:
        return d
    if not overwrite:
        if resume_flag is None:
            hint = "use --overwrite to replace it, or another --out"
        elif (d / CHECKPOINT_POINTER).is_file():
            hint = (f"use {resume_flag} {d} to continue it from its checkpoint, --overwrite to replace it, "
                    f"or another --out")
        else:
            hint = (f"it has no checkpoint for {resume_flag} to continue from; use --overwrite to replace it, "
                    f"or another --out")
        raise OutputError(f"already holds a run ({found}); {hint}", path=str(d), key=key)
    for f in run_files(d) + [d / m for m in markers if (d / m).is_file()]:
        try:
            if f.is_dir():
                shutil.rmtree(f)
            else:
                f.unlink()
        except OSError as exc:
            raise OutputError(f"cannot remove the old run's {f.name}: {exc.strerror or exc}", path=str(d),
                              key=key) from None
    return d

"""Run metrics: one JSON line per training step, a trace for plots, and a summary JSON.

Names follow docs/design.md#metrics (`bubble/*`, `lag/*`, `throughput/e2e_tps`, `time/*`) so stock, async and
ASP runs (and MindSpeed-RL logs, through the log reader) compare line by line. The recorder only collects
timestamps the driver already has; every number in the summary is computed here from those raw events, so
the definitions live in one place.
"""
from __future__ import annotations

import errno
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

import numpy as np

from mindspeed_asp.utils.atomic import write_text
from mindspeed_asp.errors import OutputError, RunError, error_chain
from mindspeed_asp.utils.jsonl import iter_jsonl_objects
from mindspeed_asp.core.learning import final_reward, learning_summary, length_starvation
from mindspeed_asp.core.metrics import (DeviceCount, e2e_tps, generation_padding, idle_share, lag_histogram, lag_stats,
                                   rho_stock, skewness, split_devices, tail_share)

#: Devices the CPU runtime's trainer counts as (it is one process, the driver's): the run config's
#: `trainer.devices` default.
DEFAULT_TRAINER_DEVICES = 1

STEPS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
TRACE_FILE = "trace.json"


@dataclass
class GroupSpan:
    """One generated group on one instance: the Gantt bar and the token counts behind throughput."""

    instance: int
    gid: int
    submit: float
    start: float
    end: float
    prompt_tokens: int
    response_tokens: int
    sample_lengths: List[int]
    version: int  # oldest policy version that produced any of its tokens
    window: int  # iteration index in stock mode, 0 for the streaming modes
    trained: bool = False


@dataclass
class RunRecorder:
    """Collects raw events during a run and turns them into the metrics of docs/design.md#metrics."""

    out_dir: Path
    mode: str
    instances: int
    slots: int
    minibatch_groups: int
    max_lag: int
    devices: Optional[DeviceCount] = None  # e2e_tps' denominator; default: instances + DEFAULT_TRAINER_DEVICES
    target_reward: Optional[float] = None  # learning/*_to_target are reported against it (run.target_reward)
    clock: Any = time.monotonic
    t0: float = field(default=0.0)
    groups: List[GroupSpan] = field(default_factory=list)
    queue_trace: List[Tuple[float, int]] = field(default_factory=list)
    trainer_idle: List[Tuple[float, float]] = field(default_factory=list)  # starved while rollout active
    steps: List[Dict[str, Any]] = field(default_factory=list)
    lags: List[int] = field(default_factory=list)  # one per trained sample
    decode_steps: Dict[int, int] = field(default_factory=dict)  # instance -> engine decode steps, if known
    events: List[Dict[str, Any]] = field(default_factory=list)  # steals, deaths, drops, regenerations

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        if self.devices is None:
            self.devices = split_devices(self.instances, 1, DEFAULT_TRAINER_DEVICES)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.t0 = self.clock()
        # metrics.jsonl is opened by `open_steps` (the first step at the latest), never here: a resume refused
        # after the recorder was built must leave the run's steps as they are
        self._steps_fh: Optional[TextIO] = None
        self._steps_opened = False  # opened once already: a reopening appends
        self._rewrite_steps = False  # resumed: the file is first rewritten to the checkpoint's steps
        self._resumed_at: Optional[Tuple[float, int]] = None  # (checkpoint time, events before the resume)

    def now(self) -> float:
        """Seconds since the recorder was created."""
        return self.clock() - self.t0

    # ---------------------------------------------------------------- raw events
    def group(self, span: GroupSpan) -> None:
        self.groups.append(span)

    def queue(self, occupancy: int, t: Optional[float] = None) -> None:
        self.queue_trace.append((self.now() if t is None else t, int(occupancy)))

    def trainer_starved(self, start: float, end: float) -> None:
        if end > start:
            self.trainer_idle.append((start, end))

    def event(self, kind: str, **info: Any) -> None:
        self.events.append({"t": round(self.now(), 4), "kind": kind, **info})

    def log_step(self, record: Dict[str, Any], trained_lags: Sequence[int]) -> None:
        """Write one step's JSON line; `trained_lags` are the lags of the samples trained in it."""
        lags = np.asarray(trained_lags, dtype=np.int64)
        self.lags.extend(int(x) for x in lags)
        rec = dict(record)
        if len(lags):
            rec.update({"lag/mean": float(lags.mean()), "lag/max": int(lags.max())})
        self.steps.append(rec)
        self.open_steps()
        try:
            self._steps_fh.write(json.dumps(_clean(rec)) + "\n")
            self._steps_fh.flush()
        except OSError as exc:
            raise self._steps_write_error(exc, f"append step {rec.get('step', len(self.steps) - 1)}") from exc

    def open_steps(self) -> None:
        """Open metrics.jsonl for this run's steps, once the run is known to proceed (the driver calls it at
        the end of its set-up; `log_step` at the latest). A new run starts the file; a resumed one first
        rewrites it to hold exactly the checkpoint's steps (lines a crash left after the checkpoint go), then
        appends."""
        if self._steps_fh is not None and not self._steps_fh.closed:
            return
        path = self.out_dir / STEPS_FILE
        mode = "a" if self._steps_opened else "w"
        try:
            if self._rewrite_steps:
                write_text(path, "".join(json.dumps(_clean(r)) + "\n" for r in self.steps))  # atomic
                self._rewrite_steps, mode = False, "a"
            self._steps_fh = open(path, mode)
        except (OSError, OutputError) as exc:  # the atomic rewrite's OutputError keeps the OSError as context
            raise self._steps_write_error(exc, "write it") from exc
        self._steps_opened = True

    def _steps_write_error(self, exc: BaseException, doing: str) -> RunError:
        """The one-line stop for a refused write of metrics.jsonl between checkpoints (a full disk, an I/O
        error, a file system gone read-only): names the file, the OS's cause and the checkpoint to resume from,
        as a failed checkpoint write does. The file handle is dropped without another write (its unflushed
        line would fail again on close and hide this error); a resume rewrites the file to the checkpoint's
        steps, so a partial last line goes then."""
        fh, self._steps_fh = self._steps_fh, None
        if fh is not None:
            try:
                fh.close()
            except OSError:
                pass
        os_error = next((c for c in error_chain(exc) if isinstance(c, OSError)), None)
        cause = (os_error.strerror or str(os_error)) if os_error is not None else str(exc)
        if os_error is not None and os_error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            fix = "free space"
        else:
            fix = "fix that"
        from mindspeed_asp.runtime.checkpoint import checkpoint_info, checkpoint_root

        info = checkpoint_info(self.out_dir)
        after = (f"the previous checkpoint {checkpoint_root(self.out_dir) / str(info.get('dir'))} is intact: {fix}, "
                 f"then `asp train --resume {self.out_dir}`" if isinstance(info, dict) and info.get("dir")
                 else "the run has no checkpoint to resume from")
        return RunError(f"{self.out_dir / STEPS_FILE}: cannot {doing} ({cause}); the run stops; {after}")

    def close(self) -> None:
        if self._steps_fh is not None and not self._steps_fh.closed:
            self._steps_fh.close()

    # ---------------------------------------------------------------- checkpoint
    def state_dict(self) -> Dict[str, Any]:
        """Everything recorded so far and the run's clock (`elapsed`), as plain data for a checkpoint."""
        return _clean({"elapsed": self.now(), "groups": [asdict(g) for g in self.groups],
                       "queue_trace": self.queue_trace, "trainer_idle": self.trainer_idle, "steps": self.steps,
                       "lags": self.lags, "decode_steps": self.decode_steps, "events": self.events})

    def load_state_dict(self, state: Dict[str, Any], defer_files: bool = False) -> None:
        """Continue a checkpointed run: its records come back, metrics.jsonl is rewritten to hold exactly its
        steps (lines a crash left after the checkpoint go), and the clock goes on from `elapsed`.

        `defer_files`: the file is left as it is until `open_steps` (the driver's choice: the rest of the
        checkpoint is checked first, and a refused resume must not have touched the run's files)."""
        self.groups = [GroupSpan(**g) for g in state["groups"]]
        self.queue_trace = [(float(t), int(q)) for t, q in state["queue_trace"]]
        self.trainer_idle = [(float(a), float(b)) for a, b in state["trainer_idle"]]
        self.steps = [dict(r) for r in state["steps"]]
        self.lags = [int(x) for x in state["lags"]]
        self.decode_steps = {int(j): int(n) for j, n in state["decode_steps"].items()}
        self.events = [dict(e) for e in state["events"]]
        elapsed = float(state["elapsed"])
        self.close()
        self._rewrite_steps = True
        self._resumed_at = (elapsed, len(self.events))
        self.t0 = self.clock() - elapsed
        if not defer_files:
            self.open_steps()

    def continue_clock(self) -> None:
        """After a resumed run's start-up: the clock goes on from the checkpoint's time, so the time the run
        was stopped or starting again counts nowhere (events of the start-up are put at that instant)."""
        if self._resumed_at is None:
            return
        elapsed, first = self._resumed_at
        for e in self.events[first:]:
            e["t"] = round(elapsed, 4)
        self.t0 = self.clock() - elapsed
        self._resumed_at = None

    # ---------------------------------------------------------------- metrics
    def summary(self, extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Every metric of docs/design.md#metrics over the run (plus `extra`), as a flat dict."""
        s: Dict[str, Any] = {"mode": self.mode, "instances": self.instances, "max_lag": self.max_lag,
                             "steps": len(self.steps), "devices": self.devices.to_dict()}
        s.update(lag_stats(self.lags, self.max_lag))
        s["lag/hist"] = lag_histogram(self.lags)
        s.update(offpolicy_summary(self.steps))
        s.update(self._bubbles())
        s.update(self._times_and_throughput())
        rewards = [r["reward/mean"] for r in self.steps if "reward/mean" in r]
        if rewards:
            s["reward/final"] = final_reward(rewards)
            s["reward/first"] = float(rewards[0])
            first = min([g.submit for g in self.groups], default=0.0)
            s.update(learning_summary(rewards, [r["t_end"] for r in self.steps if "reward/mean" in r], first,
                                      self.target_reward))
        trained = [L for g in self.groups if g.trained for L in g.sample_lengths]
        s["length/trained_mean"] = float(np.mean(trained)) if trained else 0.0
        starve = length_starvation([(g.gid, g.submit, g.trained, g.sample_lengths) for g in self.groups])
        s["length/generated_mean"] = starve["generated_len_mean"]
        s["length/ks_trained_vs_generated"] = starve["ks_trained_vs_generated"]
        s["length/discarded_share"] = starve["discarded_share"]
        for i, share in enumerate(starve["discarded_share_by_quartile"]):
            s[f"length/discarded_share_q{i + 1}"] = share  # q1 = shortest quarter of the generated groups
        s["events"] = _count(e["kind"] for e in self.events)
        if extra:
            s.update(extra)
        return _clean(s)

    def _bubbles(self) -> Dict[str, float]:
        out: Dict[str, float] = {}
        windows = sorted({g.window for g in self.groups})
        skews, tails = [], []
        for w in windows:
            gs = [g for g in self.groups if g.window == w]
            sk = group_skewness(gs, self.instances)
            skews.append(sk["skew"])
            tails.append(sk["after90"])
        out["bubble/skewness"] = float(np.mean(skews)) if skews else 0.0
        out["bubble/skewness_after90"] = float(np.mean(tails)) if tails else 0.0
        out["bubble/padding"], out["bubble/padding_basis"] = run_padding(self.groups, self.slots, self.decode_steps)
        span = self.run_span()
        idle = sum(b - a for a, b in self.trainer_idle)
        out["bubble/sorting"] = idle / span if span > 0 else 0.0
        occ = np.array([q for _, q in self.queue_trace], dtype=np.float64)
        out["bubble/sorting_queue_cv"] = float(occ.std() / occ.mean()) if len(occ) and occ.mean() > 0 else 0.0
        ends = np.sort([g.end for g in self.groups])
        if len(ends) >= self.minibatch_groups * 2:
            ready = ends[self.minibatch_groups - 1::self.minibatch_groups]
            gaps = np.diff(ready)
            out["bubble/sorting_arrival_cv"] = float(gaps.std() / gaps.mean()) if gaps.mean() > 0 else 0.0
        return out

    def run_span(self) -> float:
        """From the first dispatch to the last update (the run's measured time)."""
        if not self.steps:
            return 0.0
        first = min([g.submit for g in self.groups], default=0.0)
        return float(self.steps[-1]["t_end"] - first)

    def _times_and_throughput(self) -> Dict[str, float]:
        out: Dict[str, float] = {}
        for key in ("time/iteration", "time/rollout", "time/train", "time/weight_sync"):
            vals = [r[key] for r in self.steps if key in r]
            if vals:
                out[key] = float(np.mean(vals))
                out[key + "_total"] = float(np.sum(vals))
        span = self.run_span()
        tokens = sum(r.get("tokens/trained", 0) for r in self.steps)
        out["tokens/trained"] = int(tokens)
        out["throughput/e2e_tps"] = e2e_tps(tokens, span, self.devices)
        out["throughput/tokens_per_s"] = tokens / span if span > 0 else 0.0
        gen = sum(g.response_tokens for g in self.groups)
        busy = instance_busy(self.groups, self.instances)
        out["throughput/rollout_tps"] = gen / max(busy.values()) if busy and max(busy.values()) > 0 else 0.0
        out["time/run"] = span
        if self.mode == "stock" and out.get("time/rollout_total", 0.0) > 0:
            # the stock run's own rho (docs/design.md#rho-and-rho_stock); other modes get it from a stock run in compare
            out["rho_stock"] = rho_stock(out.get("time/train_total", 0.0), out["time/rollout_total"])
        return out

    # ---------------------------------------------------------------- files
    def write(self, extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Write summary.json and trace.json (and metrics.jsonl, if no step has opened it yet); returns the
        summary."""
        self.open_steps()
        self.close()
        summary = self.summary(extra)
        write_text(self.out_dir / SUMMARY_FILE, json.dumps(summary, indent=2, sort_keys=True))  # atomic
        trace = {"mode": self.mode, "instances": self.instances, "max_lag": self.max_lag,
                 "groups": [asdict(g) for g in self.groups], "queue": self.queue_trace,
                 "trainer_idle": self.trainer_idle, "lags": self.lags, "events": self.events,
                 "steps": self.steps}
        write_text(self.out_dir / TRACE_FILE, json.dumps(_clean(trace)))
        return summary


# ------------------------------------------- from the recorder's spans to mindspeed_asp.core.metrics' definitions
#: Per-step keys of the off-policy correction (the trainer's `offpolicy/*` stats) and the token-weighted lag.
OFFPOLICY_PREFIX = "offpolicy/"
TOKEN_LAG_KEY = "lag/token_weighted_mean"


def token_weighted_lag(lags: Sequence[int], response_lengths: Sequence[int]) -> float:
    """Mean lag weighted by response tokens: long responses carry more tokens and, generating longer, more lag."""
    tokens = sum(response_lengths)
    return float(sum(lag * n for lag, n in zip(lags, response_lengths)) / tokens) if tokens else 0.0


def offpolicy_fields(train_stats: Dict[str, Any]) -> Dict[str, float]:
    """The `offpolicy/*` and `lag/token_weighted_mean` entries of a trainer's step stats, as floats."""
    return {k: float(v) for k, v in train_stats.items()
            if (k.startswith(OFFPOLICY_PREFIX) or k == TOKEN_LAG_KEY) and v is not None}


def offpolicy_summary(steps: Sequence[Dict[str, Any]]) -> Dict[str, float]:
    """Run-level off-policy metrics from the step records: the max over steps for `*_max` keys, the mean over
    the steps that logged it for every other key (a per-lag key only counts the steps that had that lag)."""
    values: Dict[str, List[float]] = {}
    for rec in steps:
        for k, v in offpolicy_fields(rec).items():
            if math.isfinite(v):
                values.setdefault(k, []).append(v)
    return {k: float(max(v)) if k.endswith("_max") else float(np.mean(v)) for k, v in sorted(values.items())}


def _union_length(intervals: List[Tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def instance_busy(groups: Sequence[GroupSpan], instances: int) -> Dict[int, float]:
    """Busy time T_j of each instance: the union of its groups' generation intervals."""
    return {j: _union_length([(g.start, g.end) for g in groups if g.instance == j]) for j in range(instances)}


def group_skewness(groups: Sequence[GroupSpan], instances: int) -> Dict[str, float]:
    """One window's `skew` (`metrics.skewness` of the instances' busy times) and `after90` (`metrics.tail_share`
    of the group ends from the window's first start)."""
    if not groups:
        return {"skew": 0.0, "after90": 0.0}
    busy = instance_busy(groups, instances)
    return {"skew": skewness(list(busy.values())),
            "after90": tail_share([g.end for g in groups], start=min(g.start for g in groups))}


def run_padding(groups: Sequence[GroupSpan], slots: int, decode_steps: Dict[int, int]) -> Tuple[float, str]:
    """`bubble/padding` and its basis.

    With engine step counts S_j it is `metrics.generation_padding` ("steps"); without them the slot-time form
    ("time"): each sequence occupies a slot from its group's start to its own end, estimated from the group's
    span scaled by its length share, over B slots times the instances' busy time (`metrics.idle_share`).
    """
    if not groups:
        return 0.0, "none"
    if decode_steps and sum(decode_steps.values()) > 0:
        total_L = sum(sum(g.sample_lengths) for g in groups)
        return generation_padding(total_L, slots, list(decode_steps.values())), "steps"
    instances = max(g.instance for g in groups) + 1
    busy = instance_busy(groups, instances)
    used = 0.0
    for g in groups:
        longest = max(g.sample_lengths) if g.sample_lengths else 0
        if longest > 0:
            used += (g.end - g.start) * sum(g.sample_lengths) / longest
    return idle_share(used, slots * sum(busy.values())), "time"


def _count(items) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for k in items:
        out[k] = out.get(k, 0) + 1
    return out


def _clean(obj: Any) -> Any:
    """JSON-safe: numpy scalars to Python, NaN/inf to None."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if math.isfinite(f) else None
    return obj


def read_steps(run_dir: str | Path) -> List[Dict[str, Any]]:
    """The per-step records of a run directory (a bad line is refused with the file and line named)."""
    return [rec for _, rec in iter_jsonl_objects(Path(run_dir) / STEPS_FILE)]

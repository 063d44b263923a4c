"""The pass/fail table of `shell/ascend_first_run.sh`: what only hardware can tell, read off one short run.

A first run on a new cluster (or a new config) should answer, before hours are spent, the questions no CPU
tier can: do HCCL's weight groups form, and how fast does a bucket travel; do the engines compute with the
trainer's weights (the functional probe); do vllm-ascend's log-probs agree with Megatron's at lag 0 on the
same weights; are ASP's patches still live after `initialize_megatron` in every Megatron worker; how much
device memory a trainer rank peaks at across the export and the update; how long the engines take to build
against their deadline. The short run logs each of these (the train task's log lines and the audit file);
this module reads them and prints one table with the numbers and the bound each is held to.

It reads only files, so the CPU tier runs it on a CPU run's outputs
(tests/integrations/mindspeed_rl/test_first_run_report.py).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

from mindspeed_asp.errors import InputError
from mindspeed_asp.integrations.mindspeed_rl.log_reader import parse_line

PASS, FAIL, WARN, NA = "PASS", "FAIL", "WARN", "n/a"

ENGINES_RE = re.compile(r"asp: start-up: (\d+) rollout engines built in ([0-9.]+) s "
                        r"\(asp\.engine_start_timeout_s ([0-9.]+) s\)")
GROUPS_RE = re.compile(r"asp: start-up: (\d+) weight groups formed in ([0-9.]+) s")
PROBE_RE = re.compile(r"asp: weight probe at version (\d+): .*? at most ([0-9.eE+-]+)")
PATCHES_RE = re.compile(r"mindspeed-asp: (\d+) patches live after initialize_megatron \(pid (\d+)\)")
REVERTED_RE = re.compile(r"patch(?:es)? .*revert", re.IGNORECASE)


@dataclass(frozen=True)
class Bounds:
    """What each check is held to; the defaults suit an Ascend cluster (the CPU tier loosens the bandwidth)."""

    trainer_ranks: int  # Megatron workers that must each report the patches live
    probe_tolerance: float = 0.1  # nats, asp.weight_probe_tolerance
    lag0_tolerance: float = 0.1  # nats, mean |vllm-ascend - Megatron| log-prob on lag-0 tokens
    min_sync_gbps: float = 1.0  # GB/s of one sync (bytes sent / sync time); HCCL over HCCS is far above
    engine_deadline_share: float = 0.5  # engines built in more than this share of their deadline: WARN
    device_memory_gib: Optional[float] = None  # HBM per trainer device (64 on A2/A3); None: report only


@dataclass(frozen=True)
class Row:
    check: str
    status: str
    value: str
    bound: str


def _finite(values: Iterable[Any]) -> List[float]:
    out = []
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out.append(f)
    return out


def check_engines(log: str, b: Bounds) -> Row:
    m = ENGINES_RE.search(log)
    if not m:
        return Row("engine build time", FAIL, "no start-up line", "engines built before the deadline")
    n, took, deadline = int(m.group(1)), float(m.group(2)), float(m.group(3))
    status = PASS if took <= b.engine_deadline_share * deadline else WARN
    return Row("engine build time", status, f"{n} engines in {took:.1f} s",
               f"<= {b.engine_deadline_share:.0%} of asp.engine_start_timeout_s {deadline:g} s")


def check_groups(log: str) -> Row:
    m = GROUPS_RE.search(log)
    if not m:
        return Row("weight groups (HCCL init)", FAIL, "no start-up line", "formed")
    return Row("weight groups (HCCL init)", PASS, f"{m.group(1)} groups in {float(m.group(2)):.1f} s", "formed")


def check_sync_bandwidth(audit: Sequence[Dict[str, Any]], b: Bounds) -> Row:
    rates = []
    for rec in audit:
        sync = rec.get("sync") or {}
        sent, took = float(sync.get("asp/sync_bytes", 0.0)), float(sync.get("time/weight_sync", 0.0))
        if sent > 0 and took > 0:
            rates.append(sent / took / 1e9)
    if not rates:
        return Row("weight sync bandwidth", FAIL, "no sync recorded", f">= {b.min_sync_gbps:g} GB/s")
    best = max(rates)
    return Row("weight sync bandwidth", PASS if best >= b.min_sync_gbps else FAIL,
               f"{best:.3g} GB/s best of {len(rates)} (median {sorted(rates)[len(rates) // 2]:.3g})",
               f">= {b.min_sync_gbps:g} GB/s")


def check_probe(log: str, iterations: Sequence[Dict[str, Any]], audit: Sequence[Dict[str, Any]], b: Bounds) -> Row:
    values = _finite(m.group(2) for m in PROBE_RE.finditer(log))  # the start-up sync's probe
    values += _finite(r.get("asp/weight_probe_absdiff") for r in iterations)
    values += _finite((rec.get("sync") or {}).get("asp/weight_probe_absdiff") for rec in audit)
    if not values:
        return Row("functional weight probe", FAIL, "no probe recorded", f"<= {b.probe_tolerance:g} nats")
    worst = max(values)
    return Row("functional weight probe", PASS if worst <= b.probe_tolerance else FAIL,
               f"max mean |dlogp| {worst:.3g} nats over {len(values)} probes", f"<= {b.probe_tolerance:g} nats")


def check_lag0(iterations: Sequence[Dict[str, Any]], b: Bounds) -> Row:
    values = _finite(r.get("asp/engine_prox_absdiff_lag0") for r in iterations)
    if not values:
        return Row("engine vs Megatron log-probs, lag 0", FAIL, "no lag-0 tokens trained",
                   f"<= {b.lag0_tolerance:g} nats")
    worst = max(values)
    return Row("engine vs Megatron log-probs, lag 0", PASS if worst <= b.lag0_tolerance else FAIL,
               f"max mean |dlogp| {worst:.3g} nats over {len(values)} updates", f"<= {b.lag0_tolerance:g} nats")


def check_patches(log: str, b: Bounds) -> Row:
    pids = {m.group(2): int(m.group(1)) for m in PATCHES_RE.finditer(log)}
    counts = sorted(set(pids.values()))
    if REVERTED_RE.search(log):
        return Row("patches live after initialize_megatron", FAIL, "a worker reports reverted patches",
                   f"{b.trainer_ranks} workers")
    status = PASS if len(pids) >= b.trainer_ranks and len(counts) == 1 else FAIL
    what = f"{len(pids)} workers" + (f", {counts[0]} patches each" if len(counts) == 1 else f", counts {counts}")
    return Row("patches live after initialize_megatron", status, what, f">= {b.trainer_ranks} workers, equal counts")


def check_memory(iterations: Sequence[Dict[str, Any]], audit: Sequence[Dict[str, Any]], b: Bounds) -> Row:
    values = _finite((rec.get("sync") or {}).get("asp/trainer_peak_mem_gib") for rec in audit)
    values += _finite(r.get("asp/trainer_peak_mem_gib") for r in iterations)
    bound = f"< {b.device_memory_gib:g} GiB" if b.device_memory_gib else "reported"
    if not values:
        return Row("trainer peak memory (export + update)", NA, "no device (CPU run)", bound)
    peak = max(values)
    status = PASS if b.device_memory_gib is None or peak < 0.95 * b.device_memory_gib else FAIL
    return Row("trainer peak memory (export + update)", status, f"{peak:.1f} GiB per rank (max)", bound)


def check_state(save_dir: Optional[str], train_iters: Optional[int]) -> Row:
    """ASP's state beside the last iteration's checkpoint, where a relaunch will look for it."""
    from mindspeed_asp.integrations.mindspeed_rl.resume_state import state_path
    if not save_dir or not train_iters:
        return Row("ASP state beside the checkpoint", NA, "no save directory given", "written")
    path = state_path(save_dir, int(train_iters))
    return Row("ASP state beside the checkpoint", PASS if path.is_file() else FAIL,
               str(path) if path.is_file() else f"missing: {path}", "written")


def evaluate(log: str, iterations: Sequence[Dict[str, Any]], audit: Sequence[Dict[str, Any]],
             b: Bounds, save_dir: Optional[str] = None, train_iters: Optional[int] = None) -> List[Row]:
    return [check_engines(log, b), check_groups(log), check_sync_bandwidth(audit, b),
            check_probe(log, iterations, audit, b),
            check_lag0(iterations, b), check_patches(log, b), check_memory(iterations, audit, b),
            check_state(save_dir, train_iters)]


def render(rows: Sequence[Row]) -> str:
    widths = [max(len(getattr(r, f)) for r in rows + [Row("check", "status", "value", "bound")])
              for f in ("check", "status", "value", "bound")]
    def line(r: Row) -> str:
        return "  ".join(str(v).ljust(w) for v, w in zip((r.check, r.status, r.value, r.bound), widths))
    head = Row("check", "status", "value", "bound")
    return "\n".join([line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def read_audit(path: Path) -> List[Dict[str, Any]]:
    out = []
    for k, text in enumerate(path.read_text().splitlines(), 1):
        if text.strip():
            try:
                out.append(json.loads(text))
            except ValueError as exc:
                raise InputError(f"line {k} is not JSON: {exc}", path=str(path)) from None
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mindspeed_asp.integrations.mindspeed_rl.first_run_report",
                                 description="Pass/fail table of a first run: read its log and audit file.")
    ap.add_argument("--log", required=True, help="the run's log (train.log: the train task's output included)")
    ap.add_argument("--audit", required=True, help="the run's asp.audit_path (JSON Lines, one record per update)")
    ap.add_argument("--trainer-ranks", type=int, required=True, help="Megatron workers (actor_resource.num_npus)")
    ap.add_argument("--probe-tolerance", type=float, default=0.1)
    ap.add_argument("--lag0-tolerance", type=float, default=0.1)
    ap.add_argument("--min-sync-gbps", type=float, default=1.0)
    ap.add_argument("--device-memory-gib", type=float, default=None)
    ap.add_argument("--save-dir", help="actor_config.save of the run (ASP's state must be beside its checkpoint)")
    ap.add_argument("--train-iters", type=int, help="the run's iterations (the checkpoint saved at the last)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    try:
        log_path, audit_path = Path(args.log), Path(args.audit)
        for p in (log_path, audit_path):
            if not p.is_file():
                raise InputError("not found (did the short run start?)", path=str(p))
        log = log_path.read_text(errors="replace")
        iterations = [rec for rec in (parse_line(x) for x in log.splitlines()) if rec]
        rows = evaluate(log, iterations, read_audit(audit_path),
                        Bounds(args.trainer_ranks, args.probe_tolerance, args.lag0_tolerance, args.min_sync_gbps,
                               device_memory_gib=args.device_memory_gib), args.save_dir, args.train_iters)
    except InputError as exc:
        print(f"[asp] error: {exc}", file=sys.stderr)
        return 2
    print(render(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    failed = [r.check for r in rows if r.status == FAIL]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} checks pass or do not apply"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

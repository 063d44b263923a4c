"""`asp doctor`: check a node for a target (cpu, gpu, npu) and say what is wrong and how to fix it."""
from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("doctor", help="check this node (versions, MindSpeed-RL pin, HCCL, Ray) for a target",
                              description="Check this node for running ASP on a target; exit 1 when not ready.")
    p.add_argument("--target", choices=("cpu", "gpu", "npu"), default="cpu",
                   help="platform tier to check for (default: cpu)")
    p.add_argument("--config", default=None,
                   help="also check an ASP MindSpeed-RL YAML (configs/*_asp.yaml) and the NPUs it needs")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    from mindspeed_asp.integrations.mindspeed_rl.doctor_checks import as_dicts, ready, run_checks
    checks = run_checks(args.target, config=args.config)
    ok = ready(checks)
    if args.json:
        print(json.dumps({"target": args.target, "ready": ok, "checks": as_dicts(checks)}, indent=2))
    else:
        width = max(len(c.name) for c in checks)
        print(f"asp doctor --target {args.target}")
        for c in checks:
            line = f"  [{c.status:>4}] {c.name:<{width}}  {c.found}"
            if c.fix and c.status in ("FAIL", "warn"):
                line += f"\n         {'':<{width}}  fix: {c.fix}"
            print(line)
        fails = sum(c.status == "FAIL" for c in checks)
        print(f"node {'READY' if ok else 'NOT READY'} for target {args.target}"
              + ("" if ok else f" ({fails} failing check{'s' if fails != 1 else ''})"))
    sys.stdout.flush()
    return 0 if ok else 1

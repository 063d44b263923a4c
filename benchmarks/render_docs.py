"""Regenerate the figure blocks of docs/benchmarks.md from benchmarks/results/*.json.

    python benchmarks/render_docs.py           # rewrite docs/benchmarks.md in place
    python benchmarks/render_docs.py --check   # exit 1 if the file is not what the results give

Why: a figure pasted by hand drifts from the run it came from; a generated one cannot. The page keeps
hand-written prose (what a benchmark measures, its targets, how to read it, without quoting numbers); every
number sits in a block

    <!-- BEGIN generated: NAME -->
    ...
    <!-- END generated: NAME -->

whose content is `RENDERERS[NAME]` applied to its results file, under a header printing the file, the
command that wrote it and the date and commit it was measured at (keys `command`, `measured_at`, `commit`,
written by `benchmarks/_results.py`). A block whose results file is missing stops the run with an error
naming the file, unless its BEGIN marker says `(pending)`: `<!-- BEGIN generated: NAME (pending) -->`
renders a "not measured yet" line until the file exists, and the real tables once it does. A renderer
registered with `missing=<command>` (the long-tail runtime benchmark, about an hour of runs)
skips its block the same way with or without the marker, naming the command that writes the file.

Adding a renderer (about 20 lines):
1. the benchmark writes its JSON with `_results.write_results(path, payload, __file__)`;
2. write `def my_bench(d) -> str` in benchmarks/doc_tables.py: Markdown tables from the parsed JSON
   (`doc_tables.table`, `num`, `pct`, `verdict` help), verdicts computed from the numbers;
3. register it below: `"my_bench": Renderer("my_bench.json", doc_tables.my_bench)`;
4. put the BEGIN/END markers for `my_bench` in docs/benchmarks.md under the question it answers (an empty
   block is fine), run this script, and commit the JSON, the script change and the page together.
`tests/benchmarks/test_benchmark_docs.py` runs `--check`, so a hand edit inside a block, or a results file changed
without re-rendering, fails the fast test tier.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

import doc_tables

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
#: every page with generated blocks (docs/simulator.md holds the what-if tables next to the model they measure)
DOCS = (DOC, REPO / "docs" / "simulator.md")
RESULTS = REPO / "benchmarks" / "results"


@dataclass(frozen=True)
class Renderer:
    results: str  # path under benchmarks/results/
    render: Callable[[Mapping[str, Any]], str]
    #: a block whose figures may not exist yet (a long benchmark the lead runs later): while its results file is
    #: missing the block says so and names the command that writes it, instead of failing the page
    missing: Optional[str] = None


#: the command that writes benchmarks/results/runtime_longtail.json (bench_runtime.py's docstring has the rest)
LONGTAIL_COMMAND = ("python benchmarks/bench_runtime.py --config configs/tiny_cpu_longtail.yaml "
                    "--out runs/bench_runtime_longtail --seeds 0,1,2,3,4,5,6,7 --lags 1,2,K-1 "
                    "--kinds tiny_decode,chat --kind-lag 1 --json benchmarks/results/runtime_longtail.json")


RENDERERS: Dict[str, Renderer] = {
    "lengths": Renderer("lengths.json", doc_tables.lengths),
    "plan_speed": Renderer("plan_speed.json", doc_tables.plan_speed),
    "plan_quality": Renderer("plan_quality.json", doc_tables.plan_quality),
    "schedulers": Renderer("schedulers/results.json", doc_tables.schedulers),
    "runtime": Renderer("runtime_tiny_cpu.json", doc_tables.runtime),
    "runtime_earlier": Renderer("runtime_tiny_cpu_run1.json", doc_tables.runtime_earlier),
    "runtime_lag0": Renderer("runtime_lag0_tiny_cpu.json", doc_tables.runtime),
    "runtime_longtail": Renderer("runtime_longtail.json", doc_tables.runtime_longtail, missing=LONGTAIL_COMMAND),
    "weight_sync": Renderer("weight_sync.json", doc_tables.weight_sync),
    "checksum_cost": Renderer("checksum_cost.json", doc_tables.checksum_cost),
    "demo_learning": Renderer("demo_learning.json", doc_tables.demo_learning),
    "convergence": Renderer("convergence.json", doc_tables.convergence),
    "demo": Renderer("convergence.json", doc_tables.demo),
    "whatif": Renderer("whatif.json", doc_tables.whatif),
    "whatif_validation": Renderer("whatif.json", doc_tables.whatif_validation),
    "robustness": Renderer("robustness.json", doc_tables.robustness),
}

# markers stand alone on their line (a marker quoted inside prose is not one)
BLOCK = re.compile(r"^(?P<begin><!-- BEGIN generated: (?P<name>[\w.-]+)(?P<pending> \(pending\))? -->\n)"
                   r"(?P<body>.*?)"
                   r"^(?P<end><!-- END generated: (?P=name) -->)$", re.S | re.M)
STRAY = re.compile(r"^<!-- (BEGIN|END) generated: ", re.M)


class RenderError(Exception):
    """A block that cannot be rendered: unknown name, missing or unstamped results file."""


def header(rel: str, d: Mapping[str, Any]) -> str:
    """Where the figures come from: file, date, commit and the command that wrote the file."""
    missing = [k for k in ("command", "measured_at", "commit") if k not in d]
    if missing:
        raise RenderError(f"benchmarks/results/{rel} lacks {', '.join(missing)}: write it with "
                          "benchmarks/_results.py (write_results)")
    dirty = " (working tree with uncommitted edits)" if d.get("tree_dirty") else ""
    note = f" {d['note']}" if d.get("note") else ""
    return (f"<!-- generated by benchmarks/render_docs.py: edit the benchmark or its JSON, not this block -->\n"
            f"Measured {d['measured_at']} at commit {d['commit']}{dirty}; raw results "
            f"`benchmarks/results/{rel}`.{note}\n\n```bash\n{d['command']}\n```\n")


def render_block(name: str, pending: bool, results_dir: Path) -> str:
    """The body of block `name`: header and tables, or the pending line while its file does not exist."""
    spec = RENDERERS.get(name)
    if spec is None:
        if pending:
            return "_Not measured yet: no renderer is registered for this block._\n"
        raise RenderError(f"no renderer registered for block {name!r} (add it to RENDERERS in "
                          "benchmarks/render_docs.py, or mark the block '(pending)')")
    path = results_dir / spec.results
    if not path.is_file():
        if spec.missing is not None:
            return (f"_Not measured yet: `benchmarks/results/{spec.results}` does not exist, so this section is "
                    f"skipped (no figures are shown until it does). It is written by:_\n\n```bash\n{spec.missing}"
                    "\n```\n")
        if pending:
            return f"_Not measured yet: `benchmarks/results/{spec.results}` does not exist._\n"
        raise RenderError(f"block {name!r} needs benchmarks/results/{spec.results}, which does not exist "
                          "(run its benchmark, or mark the block '(pending)')")
    d = json.loads(path.read_text())
    return header(spec.results, d) + "\n" + spec.render(d).rstrip() + "\n"


def render(text: str, results_dir: Path = RESULTS) -> str:
    """`text` with every generated block re-rendered; errors name every block that failed."""
    errors: List[str] = []

    def one(m: "re.Match[str]") -> str:
        try:
            body = render_block(m["name"], bool(m["pending"]), results_dir)
        except (RenderError, KeyError, ValueError) as exc:
            errors.append(f"{m['name']}: {type(exc).__name__}: {exc}")
            body = m["body"]
        return m["begin"] + body + m["end"]

    out = BLOCK.sub(one, text)
    stray = len(STRAY.findall(BLOCK.sub("", text)))
    if stray:
        errors.append(f"{stray} BEGIN/END generated marker(s) without a matching partner")
    if errors:
        raise RenderError("cannot render docs/benchmarks.md:\n  " + "\n  ".join(errors))
    return out


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page differs from the rendered one")
    ap.add_argument("--doc", type=Path, default=None, help="one page (default: every page of DOCS)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="directory of the results files")
    args = ap.parse_args(argv)
    status = 0
    for doc in ([args.doc] if args.doc else list(DOCS)):
        status = max(status, _one(doc, args.check, args.results))
    return status


def _one(doc: Path, check: bool, results: Path) -> int:
    """Render (or with `check`, compare) one page; 2 on a render error, 1 when stale."""
    text = doc.read_text()
    try:
        new = render(text, results)
    except RenderError as exc:
        print(f"{doc}: {exc}", file=sys.stderr)
        return 2
    if check:
        if new != text:
            print(f"{doc} is out of date with benchmarks/results/: run python benchmarks/render_docs.py "
                  "(figures are generated, not edited by hand)", file=sys.stderr)
            return 1
        return 0
    if new != text:
        doc.write_text(new)
        print(f"rewrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

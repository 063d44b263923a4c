"""The what-if sweep behind `asp whatif` and benchmarks/bench_whatif.py: split x max_lag x planner.

It sits above the simulator, the scheduler and the workloads (it plans and resolves workloads,
docs/design.md#layering). Why one place: the command, the benchmark and the docs must compare colocated
stock with the splits under the same cluster model, workload windows and throughput definition.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from mindspeed_asp.config import EstimatorSection, read_yaml
from mindspeed_asp.errors import InputError
from mindspeed_asp.scheduler.estimators import make_estimator
from mindspeed_asp.scheduler.planners import get_planner
from mindspeed_asp.sim import cluster as cm
from mindspeed_asp.sim.model_presets import Device, ModelPreset, get_device, get_preset
from mindspeed_asp.core.problem import CostModel
from mindspeed_asp.workloads.spec import workload_from_spec

#: planner names of the sweep -> cluster-model mode
PLANNER_MODES = {"stock": "colocated", "stock_split": "stock_split", "async": "async", "asp": "asp"}


@dataclass(frozen=True)
class Setting:
    """What a what-if needs besides the sweep: the model, the device, the run's shape and the overrides."""

    preset: ModelPreset
    device: Device
    devices: int
    tp: int
    n: int = 8
    window_groups: int = 32  # prompt groups per iteration (MindSpeed-RL global_batch_size)
    minibatch: int = 32  # groups per update
    slots: int = 256
    cap: int = 16384  # max response tokens
    mem_util_split: float = 0.9
    mem_util_colocated: float = 0.5
    extra_passes: float = 2.0
    train_efficiency: float = 1.0
    train_overhead_s: float = 0.0
    sync_s: Optional[float] = None  # None: weight bytes / device.sync_bw
    switch_s: Optional[float] = None  # None: reshard both ways + offload/onload of optimizer and grad state
    cost_override: Optional[CostModel] = None  # a fitted cost file (for `tp`)
    cost_scale: float = 1.0  # decode cost multiplier (calibration from a MindSpeed-RL log)
    train_sec_per_token: Optional[float] = None  # calibrated trainer speed
    config_split: Optional[Dict[str, int]] = None  # the split a config file runs (rollout devices, max_lag)
    name: str = ""
    sources: Dict[str, str] = field(default_factory=dict)


def check_fits(s: Setting, tp_key: str = "--tp") -> None:
    """Refuse a setting whose instances cannot hold the model: the weights must leave KV cache at both memory
    utilisations (a split's rollout instance, and a colocated engine). Why: a budget of 0 tokens is no
    simulation at all, and the answer for a configuration that cannot load would mislead."""
    p, d = s.preset, s.device
    for util, flag, what in ((s.mem_util_split, "--mem-util", "a rollout instance of a split"),
                             (s.mem_util_colocated, "--mem-util-colocated", "a colocated engine")):
        if p.kv_budget(s.tp, d, util) > 0:
            continue
        usable = s.tp * d.hbm_bytes * util / 1e9
        raise InputError(f"{p.name}'s weights ({p.weight_bytes / 1e9:.1f} GB) leave no KV cache in {what}: TP "
                         f"{s.tp} x {d.hbm_bytes / 1e9:.0f} GB {d.name} x memory utilisation {util} = {usable:.1f} GB; "
                         f"raise the TP (TP {p.min_tp(d, util)} holds the weights and 16k KV tokens) or {flag}",
                         key=tp_key)


def check_shape(s: Setting, windows: int, slots_key: str = "--slots", groups_key: str = "--window-groups",
                windows_key: str = "--windows") -> None:
    """Refuse, naming the flag (or config key), a shape `asp plan` and `asp simulate` refuse too: fewer slots
    than a group's n samples (the planners and the cluster model put a group's n samples on one instance
    together, as the runtime dispatches it), and slots or windows x groups whose simulation cannot fit this
    machine's memory (estimated before the workload is synthesised)."""
    from mindspeed_asp.core.memory_budget import check_fits as check_memory, planning_bytes, synthesis_bytes

    if s.slots < s.n:
        raise InputError(f"{slots_key} {s.slots} is below a group's {s.n} samples (n={s.n}): a group's samples run "
                         f"together on one instance; give {slots_key} {s.n} or more", key=slots_key)
    instances = max(1, s.devices // s.tp)  # the most any split (colocated: all devices) runs
    check_memory(planning_bytes(0, 0, instances, s.slots),
                 f"simulating up to {instances} instances x {s.slots} slots", key=slots_key)
    groups = int(windows) * int(s.window_groups)
    check_memory(planning_bytes(groups, s.n, 0, 0) + synthesis_bytes(groups, s.n, 4),
                 f"simulating {windows} windows x {s.window_groups} groups x n={s.n}",
                 key=f"{windows_key}/{groups_key}")


def _kv_budget(s: Setting, util: float) -> Callable[[int], int]:
    """KV tokens per instance of `tp` devices at `util`; a TP whose weights do not fit is an error, never an
    unbounded budget."""
    def budget(tp: int) -> int:
        kv = s.preset.kv_budget(tp, s.device, util)
        if kv <= 0:
            raise ValueError(f"{s.preset.name} does not fit an instance of TP {tp} at memory utilisation {util}")
        return kv
    return budget


def build_model(s: Setting) -> cm.ClusterModel:
    """The cluster model of a setting (presets' formulas, overrides applied)."""
    p, d = s.preset, s.device

    def cost(tp: int) -> CostModel:
        c = s.cost_override if (s.cost_override is not None and tp == s.tp) else p.decode_cost(tp, d)
        if s.cost_scale != 1.0:
            c = CostModel(a=c.a * s.cost_scale, b=c.b * s.cost_scale, c=c.c * s.cost_scale, p=c.p * s.cost_scale,
                          source=f"{c.source} x {s.cost_scale:.3g} (calibrated)")
        return c

    sec_tok = s.train_sec_per_token if s.train_sec_per_token is not None else 1.0 / p.train_tokens_per_s
    trainer = cm.TrainerCost(sec_per_token=sec_tok, extra_passes=s.extra_passes, efficiency=s.train_efficiency,
                             overhead_s=s.train_overhead_s)
    sync = s.sync_s if s.sync_s is not None else p.weight_bytes / d.sync_bw

    def switch(devices: int) -> float:
        if s.switch_s is not None:
            return s.switch_s
        # weights to the inference layout and back, optimizer (12 B/param) + grads (4 B/param) off and on
        return 2.0 * p.weight_bytes / d.reshard_bw + 2.0 * 16.0 * p.params / devices / d.host_bw

    return cm.ClusterModel(cost=cost, kv_split=_kv_budget(s, s.mem_util_split),
                           kv_colocated=_kv_budget(s, s.mem_util_colocated),
                           slots=s.slots, trainer=trainer, sync_s=sync, switch_s=switch, name=s.name,
                           assumptions=assumptions(s))


def assumptions(s: Setting) -> Dict[str, str]:
    """Every input of the model and where it comes from (printed and stored in the JSON)."""
    p, d = s.preset, s.device
    c = s.cost_override or p.decode_cost(s.tp, d)
    sync = s.sync_s if s.sync_s is not None else p.weight_bytes / d.sync_bw
    out = {
        "model": f"{p.name}: {p.size_source}",
        "device": f"{d.name}: {d.source}",
        "decode_cost": f"TP{s.tp}: a={c.a * 1e3:.2f} ms, b={c.b * 1e3:.3f} ms/seq, c={c.c:.2e} s/KV token, "
                       f"p={c.p:.2e} s/prefill token ({c.source})"
                       + (f", scaled x{s.cost_scale:.3g} by calibration" if s.cost_scale != 1.0 else ""),
        "kv_budget": f"per instance: (TP x {d.hbm_bytes / 1e9:.0f} GB x mem_util - weights) / "
                     f"{p.kv_bytes_per_token:.0f} B per token; mem_util {s.mem_util_split} for a split's "
                     f"instances, {s.mem_util_colocated} colocated (the trainer's state stays resident)",
        "trainer": (f"update = tokens x {(s.train_sec_per_token or 1.0 / p.train_tokens_per_s) * 1e3:.3f} ms x "
                    f"(1 + {s.extra_passes:g} extra forward passes x 1/3) / (devices x {s.train_efficiency:g}) + "
                    f"{s.train_overhead_s:g} s; " + (s.sources.get("trainer") or p.train_source)),
        "weight_sync": f"{sync:.2f} s per update in a split, instances paused ("
                       + ("given" if s.sync_s is not None else
                          f"{p.weight_bytes / 1e9:.1f} GB / {d.sync_bw / 1e9:.0f} GB/s") + ")",
        "colocated_switch": ("given" if s.switch_s is not None else
                             f"2 x {p.weight_bytes / 1e9:.1f} GB / {d.reshard_bw / 1e9:.0f} GB/s (reshard both ways) "
                             f"+ 2 x 16 B/param / devices / {d.host_bw / 1e9:.0f} GB/s (optimizer + grad offload "
                             "and onload)") + " per iteration",
        "throughput": "e2e_tps = (prompt + response tokens) / (all devices x seconds), MindSpeed-RL's "
                      "definition: trainer + rollout devices of a split, all devices once colocated",
        "steady_state": "the windows after the first and before the last, for every mode (streaming: fill and "
                        "drain reported apart; barrier iterations are alike, so this only makes both count the "
                        "same tokens)",
    }
    out.update({k: v for k, v in s.sources.items() if k not in out})
    return out


def _config_get(data: dict, path: str, default=None):
    cur = data
    for k in path.split("."):
        if not isinstance(cur, dict) or k not in cur:
            return default
        cur = cur[k]
    return cur


def setting_from_config(path: str, **overrides) -> Setting:
    """A setting for one MindSpeed-RL + ASP config (configs/*.yaml): model, devices, TP, batch, lengths and the
    config's own split. MoE instances span infer TP x EP devices; a stock or colocated config runs on its
    training devices."""
    p = Path(path)
    if not p.is_file():
        raise InputError("config file not found", path=str(p), key="--config")
    data = read_yaml(p)  # strict UTF-8, a syntax error or a repeated key named with file and line
    model = _config_get(data, "megatron_training.model") or _config_get(data, "actor_config.model")
    if not model:
        raise InputError("no megatron_training.model", path=str(p), key="--config")
    preset = get_preset(str(model))
    m = re.search(r"_(A2|A3)", p.stem)
    device = get_device(m.group(1) if m else "A3")
    need = {"actor_config.tensor_model_parallel_size": None, "rl_config.actor_resource.num_npus": None,
            "rl_config.n_samples_per_prompt": None, "megatron_training.global_batch_size": None,
            "asp.instances": None, "asp.minibatch_groups": None}
    for k in need:
        v = _config_get(data, k)
        if v is None:
            raise InputError("missing key", path=str(p), key=k)
        need[k] = int(v)
    infer_tp = int(_config_get(data, "generate_config.infer_tensor_parallel_size", 1))
    infer_ep = int(_config_get(data, "generate_config.infer_expert_parallel_size", 1))
    width = infer_tp * max(1, infer_ep)
    trainer_dev = need["rl_config.actor_resource.num_npus"]
    # the deployment follows asp.mode: stock and colocated run on MindSpeed-RL's own engines at lag 0, asp and
    # async on a separate pool (at any max_lag, 0 included); max_lag unset is the mode's default
    mode = str(_config_get(data, "asp.mode", "asp"))
    colocated = mode in ("stock", "colocated")
    max_lag = int(_config_get(data, "asp.max_lag", 0 if colocated else 1))
    devices = trainer_dev if colocated else trainer_dev + need["asp.instances"] * infer_tp
    cap = int(_config_get(data, "generate_config.sampling_config.max_tokens", 2048))
    util = float(_config_get(data, "generate_config.gpu_memory_utilization", 0.5))
    kw = dict(preset=preset, device=device, devices=devices, tp=width, n=need["rl_config.n_samples_per_prompt"],
              window_groups=need["megatron_training.global_batch_size"], minibatch=need["asp.minibatch_groups"],
              slots=int(_config_get(data, "asp.slots", 256)), cap=cap, mem_util_colocated=util,
              config_split={"rollout_devices": devices if colocated else need["asp.instances"] * infer_tp,
                            "max_lag": max_lag, "colocated": int(colocated)},
              name=p.stem)
    if kw["window_groups"] % kw["minibatch"]:
        kw["minibatch"] = kw["window_groups"]
    kw.update({k: v for k, v in overrides.items() if v is not None})
    return Setting(**kw)


def default_workload(s: Setting, windows: int, seed: int = 0) -> str:
    """Long-CoT-like synthetic lengths of the setting: median cap/4 (2k at a 8k cap), n and cap of the run."""
    return (f"synthetic:prompts={windows * s.window_groups},n={s.n},cap={s.cap},median={max(16, s.cap // 4)},"
            f"seed={seed}")


def make_windows(spec: str, s: Setting, windows: int) -> cm.Windows:
    """Resolve the workload and cut it into `windows` windows of the setting's global batch (a synthetic spec
    without prompts= gets exactly that many groups)."""
    if spec.startswith("synthetic:") and "prompts=" not in spec:
        spec = spec.rstrip(",") + ("," if spec != "synthetic:" else "") + f"prompts={windows * s.window_groups}"
    wl = workload_from_spec(spec)
    G = len(wl.prompts)
    if wl.prompts.n != s.n and not spec.startswith("synthetic:"):
        pass  # a trace's own n wins
    K = min(windows, G // s.window_groups)
    if K < 3:
        raise InputError(f"{G} groups give {K} windows of {s.window_groups}; steady state needs >= 3 "
                         "(more prompts, or a smaller --window-groups)", key="--workload")
    idx = np.arange(K * s.window_groups)
    est = make_estimator(EstimatorSection(kind="history"), wl.truth).estimate(wl.prompts, wl.history,
                                                                              wl.max_new_tokens)
    full = cm.Windows(prompts=wl.prompts, truth=np.asarray(wl.truth, dtype=np.int64), estimate=est,
                      window_groups=s.window_groups, minibatch=s.minibatch, max_new_tokens=int(wl.max_new_tokens))
    return full.take(idx) if K * s.window_groups < G else full


#: `fast`: the ASP planner's default candidate only (its grids of one value skip the search); `full`: the
#: planner as `asp plan` runs it (every candidate event-simulated, seconds per window).
ASP_SEARCH = ("fast", "full")


def planner_fn(mode: str, seed: int = 0, asp_search: str = "full") -> cm.Plan:
    """The plan a mode runs under: the ASP planner for asp, MindSpeed-RL's contiguous split otherwise."""
    if mode != "asp":
        fn = get_planner("stock")
        return lambda problem: fn(problem, np.random.default_rng(seed))
    if asp_search not in ASP_SEARCH:
        raise InputError(f"choose from {', '.join(ASP_SEARCH)}", key="--asp-search")
    from mindspeed_asp.scheduler.asp_planner import DEFAULT_EPS, DEFAULT_RULE, DEFAULT_THETA, plan_asp

    if asp_search == "full":
        fn = get_planner("asp")
        return lambda problem: fn(problem, np.random.default_rng(seed))
    return lambda problem: plan_asp(problem, np.random.default_rng(seed), theta_grid=[DEFAULT_THETA],
                                    eps_grid=[DEFAULT_EPS], rules=[DEFAULT_RULE])


def sweep(s: Setting, wins: cm.Windows, planners: Sequence[str], max_lags: Sequence[int],
          splits: Optional[Sequence[int]] = None, progress: Optional[Callable[[str], None]] = None,
          refine: bool = True) -> List[Dict[str, object]]:
    """Every (planner, split, max_lag): rows of `ClusterResult.row()` plus the planner name.

    asp runs the planner's fast search over the grid; with `refine`, the best split of each max_lag is
    simulated again under the full search (row `asp_search` = "full"), which is what a run would plan."""
    model = build_model(s)
    for p in planners:
        if p not in PLANNER_MODES:
            raise InputError(f"unknown planner {p!r}; choose from {', '.join(PLANNER_MODES)}", key="--planners")
    grid = list(splits) if splits is not None else cm.split_grid(s.devices, s.tp)
    if not grid and any(PLANNER_MODES[p] != "colocated" for p in planners):
        raise InputError(f"no split of {s.devices} devices in TP {s.tp} steps leaves a trainer device",
                         key="--devices")
    jobs = []
    for p in planners:
        mode = PLANNER_MODES[p]
        if mode == "colocated":
            jobs.append((p, mode, None, 0))
        elif mode == "stock_split":
            jobs += [(p, mode, r, 0) for r in grid]
        else:
            jobs += [(p, mode, r, lag) for r in grid for lag in max_lags]
    rows = []
    for i, (p, mode, r, lag) in enumerate(jobs):
        if progress:
            progress(f"[{i + 1}/{len(jobs)}] {p} rollout={r if r is not None else 'all'} max_lag={lag}")
        split = cm.Split(devices=s.devices, tp=s.tp, rollout_devices=r)
        res = cm.simulate(model, wins, split, mode, lag, planner_fn(mode, asp_search="fast"))
        rows.append(dict(res.row(), planner=p, asp_search="fast" if mode == "asp" else ""))
    if refine and "asp" in planners:
        for lag in max_lags:
            cand = [r for r in rows if r["planner"] == "asp" and r["max_lag"] == lag]
            if not cand:
                continue
            top = max(cand, key=lambda r: float(r["e2e_tps"]))
            if progress:
                progress(f"[refine] asp full search rollout={top['rollout_devices']} max_lag={lag}")
            split = cm.Split(devices=s.devices, tp=s.tp, rollout_devices=int(top["rollout_devices"]))
            res = cm.simulate(model, wins, split, "asp", lag, planner_fn("asp", asp_search="full"))
            rows.append(dict(res.row(), planner="asp", asp_search="full"))
    return rows


def summarize(s: Setting, rows: List[Dict[str, object]], max_lags: Sequence[int]) -> Dict[str, object]:
    """Best split and max_lag per staleness bound, the speed-up over colocated stock, and where the config's
    own split stands (its e2e_tps over the best at its max_lag)."""
    best = cm.best_per_bound(rows, max_lags)
    out: Dict[str, object] = {"best_per_bound": best}
    stock = [r for r in rows if r["mode"] == "colocated"]
    if stock:
        out["colocated"] = {k: stock[0][k] for k in ("e2e_tps", "window_s", "rollout_s", "train_s", "rho_stock")}
    cs = s.config_split
    if cs and not cs.get("colocated"):
        mine = [r for r in rows if r["mode"] == "asp" and r["rollout_devices"] == cs["rollout_devices"]
                and r["max_lag"] == cs["max_lag"]]
        at = [b for b in best if b["bound"] == cs["max_lag"]]
        if mine and at:
            out["config_split"] = {"rollout_devices": cs["rollout_devices"], "max_lag": cs["max_lag"],
                                   "e2e_tps": mine[0]["e2e_tps"],
                                   "share_of_best": float(mine[0]["e2e_tps"]) / float(at[0]["best"]["e2e_tps"]),
                                   "best_rollout_devices": at[0]["best"]["rollout_devices"]}
    return out


def format_rows(rows: Sequence[Dict[str, object]]) -> str:
    """A plain-text table of a sweep (one row per configuration)."""
    cols = [("planner", "planner", "{}"), ("rollout", "rollout_devices", "{}"), ("train", "trainer_devices", "{}"),
            ("inst", "instances", "{}"), ("max_lag", "max_lag", "{}"), ("e2e_tps", "e2e_tps", "{:.1f}"),
            ("iter s", "window_s", "{:.1f}"), ("rollout s", "rollout_s", "{:.1f}"), ("train s", "train_s", "{:.1f}"),
            ("fill s", "fill_s", "{:.1f}"), ("drain s", "drain_s", "{:.1f}"), ("lag max", "lag_max", "{:.0f}"),
            ("idle%", "instance_idle", "{:.0%}")]
    body = [[c for c, _, _ in cols]]
    for r in rows:
        body.append([f.format(r[k]) if not isinstance(r[k], bool) else str(r[k]) for _, k, f in cols])
    w = [max(len(b[i]) for b in body) for i in range(len(cols))]
    lines = ["  ".join(x.rjust(w[i]) if i else x.ljust(w[i]) for i, x in enumerate(b)) for b in body]
    lines.insert(1, "  ".join("-" * x for x in w))
    return "\n".join(lines)


def with_overrides(s: Setting, **kw) -> Setting:
    return replace(s, **{k: v for k, v in kw.items() if v is not None})


def format_best(summary: Dict[str, object]) -> str:
    """The answer: per staleness bound, the best configuration and its speed-up over colocated stock."""
    lines = []
    if summary.get("colocated"):
        c = summary["colocated"]
        lines.append(f"colocated stock: {c['e2e_tps']:.1f} tokens/s/device, {c['window_s']:.1f} s per iteration "
                     f"({c['rollout_s']:.1f} s rollout, {c['train_s']:.1f} s train), rho_stock "
                     f"{c['rho_stock']:.2f} (train / rollout time)")
    lines.append("best per staleness bound (steady-state e2e_tps, all devices):")
    for b in summary["best_per_bound"]:  # type: ignore[union-attr]
        r = b["best"]
        lines.append(f"  max_lag <= {b['bound']}: {r['planner']} with {r['rollout_devices']} rollout + "
                     f"{r['trainer_devices']} trainer devices at max_lag {r['max_lag']}: {r['e2e_tps']:.1f} "
                     f"tokens/s/device, {b['speedup_vs_colocated']:.2f}x colocated stock")
    cs = summary.get("config_split")
    if cs:
        lines.append(f"  the config's split ({cs['rollout_devices']} rollout devices, max_lag {cs['max_lag']}) "
                     f"reaches {cs['share_of_best']:.0%} of the best at its max_lag "
                     f"(best: {cs['best_rollout_devices']} rollout devices)")
    return "\n".join(lines)


def setting_json(s: Setting) -> Dict[str, object]:
    """The setting's numbers (JSON-ready)."""
    c = s.cost_override or s.preset.decode_cost(s.tp, s.device)
    return {"name": s.name, "model": s.preset.name, "device": s.device.name, "devices": s.devices, "tp": s.tp,
            "n": s.n, "window_groups": s.window_groups, "minibatch": s.minibatch, "slots": s.slots, "cap": s.cap,
            "mem_util_split": s.mem_util_split, "mem_util_colocated": s.mem_util_colocated,
            "extra_passes": s.extra_passes, "train_efficiency": s.train_efficiency,
            "train_overhead_s": s.train_overhead_s, "sync_s": build_model(s).sync_s,
            "cost": {"a": c.a * s.cost_scale, "b": c.b * s.cost_scale, "c": c.c * s.cost_scale,
                     "p": c.p * s.cost_scale},
            "train_sec_per_token": s.train_sec_per_token or 1.0 / s.preset.train_tokens_per_s,
            "config_split": s.config_split}


def calibrate_from_log(s: Setting, summ: Dict[str, object], path: str, wins: cm.Windows) -> Setting:
    """Calibrate a setting on a stock (colocated) MindSpeed-RL log of the same model and devices.

    The trainer: timing/update = tokens per iteration x t_tok x (1 + extra/3) / devices, with tokens per
    iteration = window groups x n x (prompt_length/mean + response_length/mean). The decode cost: scaled by
    the log's timing/rollout over the model's colocated rollout of these windows (the workload should have the
    log's lengths for that ratio to mean anything). `summ` is the log reader's summary (commands read it:
    the integration layer sits above this one)."""
    need = ("timing/update", "timing/rollout", "response_length/mean")
    missing = [k for k in need if not np.isfinite(float(summ.get(k, float("nan"))))]  # type: ignore[arg-type]
    if missing:
        raise InputError(f"the log has no {', '.join(missing)}", path=str(path), key="--calibrate-log")
    tok = s.window_groups * s.n * (float(summ.get("prompt_length/mean", 0.0))  # type: ignore[arg-type]
                                   + float(summ["response_length/mean"]))  # type: ignore[arg-type]
    t = cm.TrainerCost(sec_per_token=1.0, extra_passes=s.extra_passes, efficiency=s.train_efficiency)
    sec_tok = (float(summ["timing/update"]) - s.train_overhead_s) / (tok * t.alpha(s.devices))
    if not sec_tok > 0:
        raise InputError("timing/update is not above the per-update overhead", path=str(path), key="--calibrate-log")
    s1 = replace(s, train_sec_per_token=sec_tok, cost_scale=1.0)
    res = cm.simulate_barrier(build_model(s1), wins, cm.Split(devices=s.devices, tp=s.tp), planner_fn("stock"))
    scale = float(summ["timing/rollout"]) / res.rollout_s
    note = (f"trainer {sec_tok * 1e3:.3f} ms/token/device from timing/update {float(summ['timing/update']):.1f} s; "
            f"decode cost x {scale:.3g} = timing/rollout {float(summ['timing/rollout']):.1f} s / simulated "
            f"{res.rollout_s:.1f} s")
    sources = dict(s.sources, calibration=f"{path}: {note}", trainer=f"calibrated on {path}")
    return replace(s1, cost_scale=scale, sources=sources)


def plot(rows: Sequence[Dict[str, object]], path, title: str = ""):
    """e2e_tps against rollout devices, one line per (planner, max_lag), colocated stock as a level."""
    from mindspeed_asp.utils.plotting import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    keys = sorted({(str(r["planner"]), int(r["max_lag"])) for r in rows
                   if r["mode"] != "colocated" and r.get("asp_search") != "full"})
    lag_colour = {lag: f"C{i}" for i, lag in enumerate(sorted({k[1] for k in keys}))}
    for planner, lag in keys:
        pts = sorted((int(r["rollout_devices"]), float(r["e2e_tps"])) for r in rows
                     if r["planner"] == planner and int(r["max_lag"]) == lag and r.get("asp_search") != "full")
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o" if planner == "asp" else "s", ms=3,
                ls={"asp": "-", "async": "--"}.get(planner, ":"), color=lag_colour[lag],
                label=f"{planner} max_lag {lag}")
    for r in rows:
        if r["mode"] == "colocated":
            ax.axhline(float(r["e2e_tps"]), color="k", lw=1.5, label="colocated stock")
        if r.get("asp_search") == "full":
            ax.plot([int(r["rollout_devices"])], [float(r["e2e_tps"])], marker="*", ms=10, color="k", ls="")
    ax.set_xlabel("rollout devices (the rest train)")
    ax.set_ylabel("e2e_tps (tokens / s / device, all devices)")
    ax.set_title(title + ("  (* = asp full search)" if any(r.get("asp_search") == "full" for r in rows) else ""))
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)

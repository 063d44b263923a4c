"""The cluster model (mindspeed_asp/sim/cluster.py) and the presets: hand-computed timelines, device scaling,
the steady-state window, the e2e_tps definition and the five configs' settings."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mindspeed_asp.errors import InputError
from mindspeed_asp.experiments import whatif as wi
from mindspeed_asp.sim import cluster as cm
from mindspeed_asp.sim.model_presets import A3_DIE, PRESETS, get_preset
from mindspeed_asp.core.problem import CostModel

from factories import length_estimate, prompt_set


def _windows(K: int, Gw: int, n: int, L: int, P: int = 0, M: int = None) -> cm.Windows:
    G = K * Gw
    ps = prompt_set(np.full(G, P, dtype=np.int64), n, prefix="g")
    truth = np.full((G, n), L, dtype=np.int64)
    # float medians and maxima (oracle_estimate would keep the int64 of the lengths in group_max)
    est = length_estimate(np.full(G, float(L)), np.full(G, float(L)), samples=truth.astype(float), estimator="test")
    return cm.Windows(prompts=ps, truth=truth, estimate=est, window_groups=Gw, minibatch=M or Gw,
                      max_new_tokens=L)


def _model(a=0.01, train_s_tok=1e-3, sync=0.0, switch=0.0, slots=1024, extra=0.0) -> cm.ClusterModel:
    return cm.ClusterModel(cost=lambda tp: CostModel(a=a / tp, b=0.0, c=0.0, p=0.0), kv_split=lambda tp: None,
                           kv_colocated=lambda tp: None, slots=slots,
                           trainer=cm.TrainerCost(sec_per_token=train_s_tok, extra_passes=extra),
                           sync_s=sync, switch_s=lambda d: switch)


def test_trainer_time_scales_with_devices_and_counts_extra_passes():
    t = cm.TrainerCost(sec_per_token=3e-3, extra_passes=2.0, efficiency=0.5, overhead_s=1.0)
    assert t.alpha(4) == pytest.approx(3e-3 * (1 + 2 / 3) / (4 * 0.5))
    assert t.alpha(8) == pytest.approx(t.alpha(4) / 2)
    m = t.model(8, minibatch=4)
    assert m.train_time(1000) == pytest.approx(1000 * t.alpha(8) + 1.0)
    with pytest.raises(InputError):
        t.alpha(0)
    with pytest.raises(InputError):
        cm.TrainerCost(sec_per_token=1e-3, efficiency=1.5)


def test_split_shapes_and_refusals():
    s = cm.Split(devices=32, tp=2, rollout_devices=12)
    assert (s.instances, s.trainer_devices, s.colocated) == (6, 20, False)
    c = cm.Split(devices=16, tp=4)
    assert (c.instances, c.trainer_devices, c.colocated) == (4, 16, True)
    with pytest.raises(InputError, match="multiple of TP"):
        cm.Split(devices=32, tp=2, rollout_devices=7)
    with pytest.raises(InputError, match="rollout devices"):
        cm.Split(devices=16, tp=1, rollout_devices=16)
    assert cm.split_grid(16, 1) == list(range(4, 15))
    assert cm.split_grid(32, 2) == list(range(8, 29, 2))


def test_colocated_iteration_by_hand():
    """Equal lengths, a-only cost, enough slots: rollout = L*a/TP, train = tokens*t/N, plus the switch."""
    K, Gw, n, L, P = 4, 4, 2, 100, 10
    wins = _windows(K, Gw, n, L, P)
    model = _model(a=0.02, train_s_tok=1e-3, switch=3.0)
    res = cm.simulate(model, wins, cm.Split(devices=4, tp=2), "colocated", 0, wi.planner_fn("stock"))
    tokens = Gw * n * (L + P)
    expect = L * 0.02 / 2 + tokens * 1e-3 / 4 + 3.0
    assert res.window_s == pytest.approx(expect)
    assert res.e2e_tps == pytest.approx(tokens / (4 * expect))  # all devices in the denominator
    assert res.sync_s == 3.0 and res.lag_max == 0
    assert res.rho_stock == pytest.approx((tokens * 1e-3 / 4) / (L * 0.02 / 2))  # stock-relative rho
    assert cm.Split(devices=4, tp=2).device_count().total == 4  # colocated devices counted once
    assert cm.Split(devices=6, tp=2, rollout_devices=4).device_count().total == 6


def test_stream_max_lag_0_by_hand_and_steady_window():
    """max_lag 0 on a split: no overlap, each window = rollout + update + sync; fill/drain reported apart."""
    K, Gw, n, L = 5, 2, 2, 50
    wins = _windows(K, Gw, n, L)
    model = _model(a=0.01, train_s_tok=2e-3, sync=0.5)
    split = cm.Split(devices=3, tp=1, rollout_devices=1)
    res = cm.simulate(model, wins, split, "async", 0, wi.planner_fn("async"))
    tokens = Gw * n * L
    per = L * 0.01 + tokens * 2e-3 / 2 + 0.5
    assert res.window_s == pytest.approx(per)
    assert res.steady_windows == K - 2
    assert res.fill_s == pytest.approx(per)
    assert res.drain_s == pytest.approx(per)
    assert res.e2e_tps == pytest.approx(tokens / (3 * per))
    assert res.lag_max == 0


def test_lag_overlaps_windows_and_beats_max_lag_0():
    """max_lag 1 lets the next minibatch generate while the trainer updates: the steady window shrinks from
    2 x (rollout + update + sync) towards the larger of the two, and the e2e_tps identity holds (every update holds
    the same tokens here: equal lengths)."""
    wins = _windows(6, 4, 4, 100, M=2)
    model = _model(a=0.01, train_s_tok=1e-3, sync=0.1)
    split = cm.Split(devices=3, tp=1, rollout_devices=1)
    r0 = cm.simulate(model, wins, split, "asp", 0, wi.planner_fn("asp", asp_search="fast"))
    r1 = cm.simulate(model, wins, split, "asp", 1, wi.planner_fn("asp", asp_search="fast"))
    rollout, update = 100 * 0.01, 2 * 4 * 100 * 1e-3 / 2
    # max_lag 0 admits M groups per version: generate M groups, update, sync; twice per window
    assert r0.window_s == pytest.approx(2 * (rollout + update + 0.1))
    assert r1.e2e_tps > 1.2 * r0.e2e_tps
    assert r1.window_s >= 2 * (update + 0.1) - 1e-9  # the trainer is the floor
    assert r1.lag_max <= 1 and r0.lag_max == 0
    mid_tokens = sum(wins.window(w).tokens() for w in range(1, 5))
    assert r1.e2e_tps * 3 * r1.window_s * r1.steady_windows == pytest.approx(mid_tokens)


def test_stream_needs_a_split_and_enough_windows():
    wins = _windows(2, 2, 2, 10)
    with pytest.raises(InputError, match="windows"):
        cm.simulate(_model(), wins, cm.Split(devices=2, tp=1, rollout_devices=1), "asp", 1, wi.planner_fn("asp"))
    with pytest.raises(InputError, match="split"):
        cm.simulate_stream(_model(), _windows(4, 2, 2, 10), cm.Split(devices=2, tp=1), "asp", 1,
                           wi.planner_fn("asp"))


def test_best_per_bound_picks_the_fastest_within_the_bound():
    rows = [{"mode": "colocated", "max_lag": 0, "e2e_tps": 100.0},
            {"mode": "asp", "max_lag": 1, "e2e_tps": 150.0},
            {"mode": "async", "max_lag": 1, "e2e_tps": 140.0},
            {"mode": "asp", "max_lag": 2, "e2e_tps": 210.0}]
    best = cm.best_per_bound(rows, [1, 2])
    assert [b["best"]["e2e_tps"] for b in best] == [150.0, 210.0]
    assert [b["speedup_vs_colocated"] for b in best] == [1.5, 2.1]


def test_presets_state_sources_and_follow_their_formulas():
    for p in PRESETS.values():
        assert p.train_source and p.size_source and p.train_tokens_per_s > 0
        c1, c2 = p.decode_cost(1, A3_DIE), p.decode_cost(2, A3_DIE)
        assert c2.b == pytest.approx(c1.b / 2) and c2.c == pytest.approx(c1.c / 2)
        assert c1.c == pytest.approx(p.kv_bytes_per_token / (A3_DIE.hbm_bw * A3_DIE.eta_mem))
        assert p.kv_budget(8, A3_DIE, 0.9) > p.kv_budget(1, A3_DIE, 0.9) >= 0
    q7 = get_preset("Qwen2.5-7B")
    assert q7.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2
    assert q7.min_tp(A3_DIE, 0.9) == 1 and get_preset("qwen25_32b").min_tp(A3_DIE, 0.9) == 2
    with pytest.raises(InputError, match="--model"):
        get_preset("llama-9000")


@pytest.mark.parametrize("name,devices,tp,rollout,colocated", [
    ("qwen25_7b_A3_asp", 16, 1, 8, 0), ("qwen25_32b_A3_asp", 32, 2, 16, 0), ("qwen25_32b_A2_asp", 32, 2, 16, 0),
    ("qwen3_8b_A3_asp", 16, 1, 8, 0), ("qwen3_30b_a3b_dapo_A3_asp", 16, 8, 16, 1)])
def test_the_five_configs_settings(name, devices, tp, rollout, colocated):
    s = wi.setting_from_config(f"configs/{name}.yaml")
    assert (s.devices, s.tp) == (devices, tp)
    assert s.config_split["rollout_devices"] == rollout and s.config_split["colocated"] == colocated
    assert s.window_groups % s.minibatch == 0
    assert s.device.name == ("A2" if "_A2" in name else "A3")
    model = wi.build_model(s)
    assert model.sync_s > 0 and model.switch_s(devices) > model.switch_s(4 * devices) > 0
    assert all(math.isfinite(v) for v in (model.cost(tp).a, model.cost(tp).b, model.cost(tp).c))

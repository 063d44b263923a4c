"""Two defects a first cluster run would hit in the asynchronous fit, checked against MindSpeed-RL's real code.

1. Methods ASP would add to MindSpeed-RL's worker classes never reach the actor handles (Ray fixes a handle's
   method table when `@ray.remote` decorates the class), so ASP reaches the actors through `__ray_call__`.
2. `metrics_sort` indexes `timing/resharding_to_infer`, which only the colocated rollout writes.
"""
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def test_methods_added_after_decoration_are_missing_and_ray_call_reaches_the_actor(no_ray_held):
    import ray

    class Base:  # defined here so Ray ships the classes by value, as the `train` task receives MSRL's
        def stock_method(self):
            return "stock"

    class Worker(Base):
        def __init__(self):
            self.value = 41

    def asp_function(worker, k):
        return worker.value + k

    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    try:
        actor_cls = ray.remote(num_cpus=0)(Worker)  # decorated at import, as MindSpeed-RL's classes are
        Base.asp_added = lambda self: "added"  # what a patch on the base class did afterwards
        handle = actor_cls.remote()
        with pytest.raises(AttributeError):
            handle.asp_added.remote()
        assert ray.get(handle.__ray_call__.remote(asp_function, 1)) == 42
    finally:
        ray.shutdown()


def test_no_patch_adds_methods_to_msrl_worker_classes():
    from mindspeed_asp.integrations.mindspeed_rl.setup_hook import patch_groups
    added = [t for group in patch_groups().values() for t, _ in group
             if t.startswith("mindspeed_rl.workers.") and t.rsplit(".", 1)[-1].startswith("asp_")]
    assert added == []


def test_async_fit_calls_every_actor_through_ray_call():
    from mindspeed_asp.integrations.mindspeed_rl.async_trainer import AsyncFit, asp_push_weights

    class Remote:
        def __init__(self, log, name):
            self.log, self.name = log, name

        def remote(self, *args):
            self.log.append((self.name, args))
            return len(self.log)

    class Handle:
        def __init__(self, log):
            self.__ray_call__ = Remote(log, "__ray_call__")

    log = []
    fit = AsyncFit.__new__(AsyncFit)
    fit.handlers = [Handle(log), Handle(log)]
    refs = fit._call_actors(asp_push_weights, 3)
    assert refs == [1, 2] and all(name == "__ray_call__" and args == (asp_push_weights, 3) for name, args in log)


def _stage_metrics():
    """What the asynchronous iteration's MindSpeed-RL stages write (update, reward, advantage, ref, old log-p)."""
    from mindspeed_rl.utils.metrics import Metric
    m = Metric()
    for key, value in {"timing/update": [10.5, 10.0], "timing/resharding_to_train": [0.0],
                       "timing/adv": [9.0, 8.5], "end_time/end_adv_time": [9.0],
                       "timing/old_log_p": [9.6, 9.2], "end_time/old_log_p": [9.6],
                       "timing/reference_model": [9.5, 9.1], "start_time/reference_model": [9.1],
                       "end_time/reference": [9.5], "timing/rule_reward": [8.4, 8.0],
                       "start_time/rule_reward": [8.0], "end_time/rule_reward": [8.4]}.items():
        m.update(key, value=value, cumulate=True)
    return m


class _Strategy:
    def __init__(self, metric):
        self.metric = metric

    def update_metrics(self, key, value, cumulate=False):
        self.metric.update(key, value=value, cumulate=cumulate)


def test_metrics_sort_needs_the_colocated_rollout_timing_and_the_async_fit_writes_it():
    import msrl_shim
    msrl_shim.install()
    from mindspeed_rl.utils.utils import metrics_post_processing, metrics_sort
    from mindspeed_asp.integrations.mindspeed_rl.async_trainer import async_timing_metrics
    from mindspeed_asp.runtime.requests import GroupResult, SampleResult

    before = _stage_metrics()
    before.update("timing/rollout", value=[6.5, 0.0], cumulate=True)  # without timing/resharding_to_infer
    with pytest.raises(KeyError, match="resharding_to_infer"):
        metrics_sort(metrics_post_processing(before), 12.0)
    metric = _stage_metrics()
    groups = [GroupResult("0", "0", 0, [SampleResult([5, 6], [-1.0, -1.0], 0, 0, "stop")], [3], 100.0, 100.0, 104.0),
              GroupResult("1", "1", 1, [SampleResult([7], [-1.0], 0, 0, "stop")], [3], 101.0, 101.0, 106.5)]
    async_timing_metrics(_Strategy(metric), groups)
    out = metrics_sort(metrics_post_processing(metric), 12.0)
    assert out["timing/resharding_to_infer"] == 0.0
    assert out["timing/rollout"] == pytest.approx(6.5)  # wall clock, first start to last end
    assert list(out)[:3] == ["timing/all", "timing/update", "timing/rollout"]

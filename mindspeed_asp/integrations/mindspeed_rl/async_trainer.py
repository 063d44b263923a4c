"""An asynchronous replacement of `RayGRPOTrainer.fit`: train from the rollout queue under the max-lag counter.

Stock `fit` runs, per iteration: put prompts -> colocated generate -> reward -> advantage -> ref log-prob ->
old log-prob -> update, all in lockstep. Here a separate pool of vLLM-Ascend instances (rollout_worker.py,
driven by rollout_driver.py) generates continuously; each iteration the trainer

1. takes `global_batch_size` finished groups from the queue, oldest policy version first, and audits each
   group's lag (trainer version - oldest version that produced its tokens); a group over `max_lag` is never
   trained (regenerated or dropped, per `asp.stale_policy`, and counted),
2. writes them into MindSpeed-RL's TransferDock in MindSpeed-RL's row layout (prompts, responses,
   input_ids, lengths, plus ASP's columns: prompt id, behaviour log-probs, policy version),
3. runs MindSpeed-RL's own reward, advantage, reference, old-log-prob and update stages unchanged
   (old log-prob is always recomputed: with lag > 0 the behaviour policy is not the current one),
4. exports the new weights with `MegatronStyleVllmWeightContainer.get_infer_params()` on every Megatron
   rank and broadcasts them over one HCCL group per inference-TP rank to every instance (version += 1),
5. logs MindSpeed-RL's metric names (`e2e_tps` with trainer + rollout NPUs in the denominator,
   `vllm_tps`, `update_tps`, `timing/*`) plus DESIGN.md section 5's `lag/*`, `bubble/*`, `time/*`.
"""
from __future__ import annotations

import socket
import time
from typing import Any, Callable, Dict, List, Sequence


from mindspeed_asp.integrations.mindspeed_rl.data_patches import (
    ASP_PROMPT_ID, POLICY_VERSION, ROLLOUT_LOG_PROB, PlanOrderedBatches)
from mindspeed_asp.integrations.mindspeed_rl.rollout_worker import GroupOutput


# ------------------------------------------------------------------------ pure helpers (CPU-tested)
def audit_groups(groups: Sequence[GroupOutput], version: int, max_lag: int) -> Dict[str, list]:
    """Split groups into trainable and stale by lag = version - group.version; lags of the trainable ones."""
    ok, stale, lags = [], [], []
    for g in groups:
        lag = version - g.version
        if lag > max_lag:
            stale.append(g)
        else:
            ok.append(g)
            lags.extend([lag] * len(g.responses))
    return {"ok": ok, "stale": stale, "lags": lags}


def groups_to_rows(groups: Sequence[GroupOutput], extra: Dict[int, Dict[str, Any]], n: int) -> Dict[str, list]:
    """TransferDock columns for the groups in MindSpeed-RL's layout: group k -> rows [k*n, (k+1)*n).

    `extra[gid]` holds the dataset's additional keys (e.g. `labels`) and the prompt id of a group.
    """
    import torch
    cols: Dict[str, list] = {"prompts": [], "prompt_length": [], "responses": [], "response_length": [],
                             "input_ids": [], ROLLOUT_LOG_PROB: [], POLICY_VERSION: [], ASP_PROMPT_ID: []}
    keys = sorted({k for e in extra.values() for k in e if k != ASP_PROMPT_ID})
    for k in keys:
        cols[k] = []
    for g in groups:
        if len(g.responses) != n:
            raise ValueError(f"group {g.gid} has {len(g.responses)} samples, expected n={n}")
        prompt = torch.tensor(g.prompt_token_ids, dtype=torch.int64)
        for resp, lp in zip(g.responses, g.logprobs):
            r = torch.tensor(resp, dtype=torch.int64)
            cols["prompts"].append(prompt)
            cols["prompt_length"].append(torch.tensor([len(prompt)]))
            cols["responses"].append(r)
            cols["response_length"].append(torch.tensor([len(r)]))
            cols["input_ids"].append(torch.cat([prompt, r]))
            cols[ROLLOUT_LOG_PROB].append(torch.tensor(lp, dtype=torch.float32))
            cols[POLICY_VERSION].append(torch.tensor([g.version]))
            cols[ASP_PROMPT_ID].append(torch.tensor([int(extra.get(g.gid, {}).get(ASP_PROMPT_ID, g.gid))]))
            for k in keys:
                cols[k].append(extra[g.gid][k])
    return cols


OUTPUT_COLUMNS = ("responses", "response_length", "input_ids", ROLLOUT_LOG_PROB, POLICY_VERSION)


def put_groups(put: Callable[[Dict[str, Any], List[int], bool], Any], groups: Sequence[GroupOutput],
               extra: Dict[int, Dict[str, Any]], n: int) -> List[int]:
    """Write finished groups into the TransferDock as MindSpeed-RL's own stages would: the prompt columns
    with `is_prompt=True` (what `fit` puts), then the rollout outputs (what the rollout stage collects).

    `put(data, indexes, is_prompt)` is `DataStrategy.put_experience`; rows are [0, len(groups) * n).
    """
    from mindspeed_rl.utils.pad_process import padding_dict_to_tensor_dict
    rows = groups_to_rows(groups, extra, n)
    indexes = list(range(len(groups) * n))
    put(padding_dict_to_tensor_dict({k: v for k, v in rows.items() if k not in OUTPUT_COLUMNS}), indexes, True)
    put(padding_dict_to_tensor_dict({k: rows[k] for k in OUTPUT_COLUMNS}), indexes, False)
    return indexes


def iteration_metrics(groups: Sequence[GroupOutput], lags: Sequence[int], max_lag: int, instances: int,
                      t_iter: float, wait_s: float, sync_s: float, total_npus: int) -> Dict[str, float]:
    """ASP's metrics of one iteration (DESIGN.md section 5 names) from the trained groups."""
    from mindspeed_asp.runtime.metrics_log import GroupSpan, lag_stats, skewness
    spans = [GroupSpan(g.instance, g.gid, g.start, g.start, g.end, len(g.prompt_token_ids) * len(g.responses),
                       sum(len(r) for r in g.responses), [len(r) for r in g.responses], g.version, 0)
             for g in groups]
    sk = skewness(spans, instances)
    ls = lag_stats(list(lags), max_lag)
    tokens = sum(s.prompt_tokens + s.response_tokens for s in spans)
    rollout_span = (max(g.end for g in groups) - min(g.start for g in groups)) if groups else 0.0
    return {
        "lag/mean": ls["lag/mean"], "lag/p99": ls["lag/p99"], "lag/max": float(ls["lag/max"]),
        "lag/frac_over_bound": ls["lag/frac_over_bound"],
        "bubble/skewness": sk["skew"], "bubble/after90": sk["after90"],
        "bubble/sorting": wait_s / t_iter if t_iter > 0 else 0.0,
        "time/iteration": t_iter, "time/rollout": rollout_span, "time/weight_sync": sync_s,
        "throughput/e2e_tps": tokens / (total_npus * t_iter) if t_iter > 0 else 0.0,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_ip() -> str:
    import ray
    return ray.util.get_node_ip_address()


# ------------------------------------------------------------------------ Megatron-side methods
def asp_init_weight_sender(self, host: str, port: int, world_size: int) -> bool:
    """(Added to ActorHybridWorkerBase.) Join the HCCL group of this infer-TP rank as its sender (rank 0)."""
    import torch
    from mindspeed_asp.integrations.mindspeed_rl.weight_transfer import hccl_communicator, stateless_group
    self._asp_group = stateless_group(host, port, 0, world_size)
    self._asp_comm = hccl_communicator(self._asp_group, torch.device(f"npu:{torch.npu.current_device()}"))
    return True


def asp_push_weights(self, version: int) -> int:
    """(Added to ActorHybridWorkerBase.) Export vLLM-shaped weights on every Megatron rank (a collective
    over the actor world) and broadcast them from the senders; returns bytes sent by this rank."""
    from mindspeed_asp.integrations.mindspeed_rl.weight_transfer import send_state
    sm = self.sharding_manager
    sm.onload_infer_params()
    params = sm.vllm_weight_container.get_infer_params()
    sent = 0
    if getattr(self, "_asp_comm", None) is not None:
        sent = send_state(self._asp_comm, self._asp_group, params, src=0, version=version)
    sm.offload_infer_params()
    return sent


SENDER_METHODS = [
    ("mindspeed_rl.workers.actor_hybrid_worker.ActorHybridWorkerBase.asp_init_weight_sender", asp_init_weight_sender),
    ("mindspeed_rl.workers.actor_hybrid_worker.ActorHybridWorkerBase.asp_push_weights", asp_push_weights),
]


# ------------------------------------------------------------------------ the fit replacement
class AsyncFit:
    """State of one asynchronous run inside the `train` task (the RayGRPOTrainer instance is `trainer`)."""

    def __init__(self, trainer: Any, topo: Any) -> None:
        self.t, self.topo, self.asp = trainer, topo, topo.asp
        self.version = 0
        self.next_gid = 0
        self.extra: Dict[int, Dict[str, Any]] = {}
        self.counts = {"stale_dropped": 0, "stale_regenerated": 0}
        self.workers: List[List[Any]] = []
        self.driver: Any = None

    # -- setup
    def start_pool(self) -> None:
        import ray
        from mindspeed_asp.integrations.mindspeed_rl.rollout_driver import RolloutDriver
        from mindspeed_asp.integrations.mindspeed_rl.rollout_worker import (
            RolloutWorker, ascend_engine_factory, instance_env)
        gen = self.t.actor_worker.generate_config.dict()
        model_path = self.t.actor_worker.megatron_config.tokenizer_name_or_path
        tp, m = self.topo.infer_tp, self.asp.instances
        cls = ray.remote(resources={"NPU": 1}, num_cpus=1)(RolloutWorker)
        for j in range(m):
            port, ranks = free_port(), []
            for r in range(tp):
                env = instance_env(j, r, tp, node_ip(), port)
                ranks.append(cls.options(runtime_env={"env_vars": env}, name=f"asp_rollout_{j}_{r}").remote(
                    j, r, self.topo.n, gen.get("sampling_config", {}),
                    lambda g=gen, p=model_path: ascend_engine_factory(g, p)))
            self.workers.append(ranks)
        # one HCCL group per inference-TP rank: the Megatron rank holding that shard + rank r of every instance
        host = node_ip()
        refs = []
        handlers = self.t.actor_worker.actor_handlers
        for r in range(tp):
            port = free_port()
            refs.append(handlers[r].asp_init_weight_sender.remote(host, port, 1 + m))
            refs += [self.workers[j][r].init_weight_group.remote(host, port, 1 + j, 1 + m) for j in range(m)]
        ray.get(refs)
        policy = "plan" if self.asp.mode == "asp" else "least_loaded"
        capacity = max(1, self.asp.slots // self.topo.n)
        self.driver = ray.remote(num_cpus=0, max_concurrency=8)(RolloutDriver).remote(
            self.workers, policy, self.asp.max_lag, self.topo.gbs, capacity, 16, self.asp.work_stealing)
        self.sync_weights(0)

    def sync_weights(self, version: int) -> float:
        """Pause stepping, broadcast, load, bump the version, resume. Raises on any failure."""
        import ray
        t0 = time.monotonic()
        ray.get(self.driver.pause.remote())
        send = self.t.actor_worker.execute_async_command("asp_push_weights", version)
        recv = [w.receive_weights.remote() for ranks in self.workers for w in ranks]
        sent = ray.get(send)
        got = ray.get(recv)
        if sum(sent) == 0 or any(v != version for v in got):
            from mindspeed_asp.errors import WeightSyncError
            raise WeightSyncError(f"weight sync {version}: sent {sum(sent)} bytes, instances report {got}")
        ray.get(self.driver.set_version.remote(version))
        ray.get(self.driver.resume.remote())
        self.version = version
        return time.monotonic() - t0

    # -- data
    def feed_window(self, data_iters: Any) -> bool:
        """Hand the next batch (one window) to the driver, with plan queues when the plan drives dispatch."""
        import ray
        try:
            batch = next(data_iters)
        except StopIteration:
            return False
        prompts, extra, gids = {}, {}, []
        keys = [k for k in batch if k != "prompts"]
        for k, prompt in enumerate(batch["prompts"]):
            gid = self.next_gid
            self.next_gid += 1
            gids.append(gid)
            prompts[gid] = [int(x) for x in prompt.tolist()]
            extra[gid] = {key: batch[key][k] for key in keys}
            if ASP_PROMPT_ID in extra[gid]:
                extra[gid][ASP_PROMPT_ID] = int(extra[gid][ASP_PROMPT_ID].view(-1)[0])
        self.extra.update(extra)
        queues = None
        if self.asp.mode == "asp" and isinstance(data_iters, PlanOrderedBatches):
            sizes = [len(q) for q in data_iters.last_queues]
            queues, start = [], 0
            for s in sizes:
                queues.append(gids[start:start + s])
                start += s
        ray.get(self.driver.load_window.remote(prompts, {}, queues))
        return True

    # -- one iteration
    def take_trainable(self) -> Dict[str, Any]:
        import ray
        gbs, ok, lags, wait = self.topo.gbs, [], [], 0.0
        while len(ok) < gbs:
            got = ray.get(self.driver.take.remote(gbs - len(ok)))
            wait += got["wait_s"]
            a = audit_groups(got["groups"], self.version, self.asp.max_lag)
            ok += a["ok"]
            lags += a["lags"]
            for g in a["stale"]:
                if self.asp.stale_policy == "regenerate":
                    ray.get(self.driver.requeue.remote(g.gid))
                    self.counts["stale_regenerated"] += 1
                else:
                    ray.get(self.driver.drop.remote(g.gid))
                    self.counts["stale_dropped"] += 1
        return {"groups": ok, "lags": lags, "wait_s": wait}


def asp_fit(self, data_iters: Any) -> None:
    """RayGRPOTrainer.fit for modes `asp`/`async` (separate rollout pool); stock otherwise."""
    from mindspeed_asp.integrations.mindspeed_rl.config_section import topology_from_env
    topo = topology_from_env()
    if topo is None or not topo.separate_pool:
        return _ORIGINAL_FIT["fit"](self, data_iters)
    import ray
    from codetiming import Timer
    from mindspeed_rl.trainer.utils.compute_utils import compute_grpo_data_metrics
    from mindspeed_rl.utils.loggers import Loggers
    from mindspeed_rl.utils.metrics import Metric
    from mindspeed_rl.utils.utils import compute_tps, metrics_post_processing, metrics_sort
    from mindspeed_rl.workers.scheduler.launcher import RayActorGroup

    logger = Loggers("asp_async_trainer")
    run = AsyncFit(self, topo)
    run.start_pool()
    for _ in range(topo.asp.max_lag + 1):  # keep the instances fed up to the lag bound
        run.feed_window(data_iters)
    iteration = self.actor_worker.get_iteration()
    tps_kwargs = dict(self.kwargs)
    tps_kwargs["actor_resource"] = {"num_npus": topo.total_npus}  # trainer + rollout NPUs, like-for-like
    tps_kwargs["use_integrated_worker"] = True
    self.skip_actor_log_prob = False
    self.actor_worker.skip_actor_log_prob = False
    n, gbs = topo.n, topo.gbs
    while iteration < self.train_iters:
        metrics = Metric()
        with Timer(name="iteration", logger=None) as all_timer:
            got = run.take_trainable()
            groups = got["groups"]
            run.feed_window(data_iters)
            put_groups(lambda d, i, p: self.data_strategy.put_experience(d, i, is_prompt=p), groups, run.extra, n)
            rollout_span = max(g.end for g in groups) - min(g.start for g in groups)
            self.data_strategy.update_metrics("timing/rollout", value=[rollout_span, 0.0], cumulate=True)
            rule_reward = []
            for reward_worker in self.reward_list:
                if isinstance(reward_worker, RayActorGroup):
                    reward_worker.compute_rm_score(blocking=self.blocking)
                else:
                    rule_reward.append(reward_worker.compute_rm_score.remote())
            ray.get(rule_reward)
            self.compute_advantage(blocking=True, guarantee_order=self.guarantee_order)
            self.ref_worker.compute_ref_log_prob(blocking=self.blocking)
            self.actor_worker.compute_log_prob(blocking=self.blocking)
            self.actor_worker.wait_all_ref_objs_run_over()
            self.ref_worker.wait_all_ref_objs_run_over()
            self.actor_worker.update(self.kl_ctrl, self.skip_actor_log_prob)
            grpo_data_metrics = compute_grpo_data_metrics(self.transfer_dock, gbs * n, self.tokenizer, gbs * n,
                                                          self.guarantee_order)
            metrics_result = self.data_strategy.get_metrics()
            sync_s = run.sync_weights(run.version + 1)
        metrics_result = metrics_post_processing(metrics_result)
        metrics_result = metrics_sort(metrics_result, all_timer.last)
        metrics_result["timing/weight_sync"] = sync_s
        lmt = self.actor_worker.rl_config.log_max_throughput
        metrics.update(value=metrics_result)
        metrics.update(value=grpo_data_metrics)
        metrics.update("e2e_tps", compute_tps(tps_kwargs, grpo_data_metrics, gbs, n, all_timer.last, lmt))
        metrics.update("update_tps", compute_tps(tps_kwargs, grpo_data_metrics, gbs, n,
                                                 metrics_result["timing/update"], lmt))
        metrics.update("vllm_tps", compute_tps(tps_kwargs, grpo_data_metrics, gbs, n, max(rollout_span, 1e-9), lmt))
        asp_m = iteration_metrics(groups, got["lags"], topo.asp.max_lag, topo.asp.instances, all_timer.last,
                                  got["wait_s"], sync_s, topo.total_npus)
        asp_m.update({f"asp/{k}": float(v) for k, v in run.counts.items()})
        asp_m["asp/policy_version"] = float(run.version)
        metrics.update(value=asp_m)
        iteration += 1
        logger.info(metrics.metric, iteration, self.train_iters)
        self.data_strategy.clear_main()
        if self.tensorboard is not None:
            for k, v in metrics.metric.items():
                self.tensorboard.add_scalar(f"train/{k}", v, iteration)
        if iteration % self.save_interval == 0 or iteration == self.train_iters:
            self.save_checkpoint(iteration)
    ray.get(run.driver.stop.remote())
    logger.info("after asp async grpo training is done")
    ray.shutdown()


_ORIGINAL_FIT: Dict[str, Callable[..., Any]] = {}


def fit_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Registered on RayGRPOTrainer.fit: keeps the original for stock mode and dispatches to asp_fit."""
    _ORIGINAL_FIT["fit"] = orig

    def fit(self, data_iters):
        return asp_fit(self, data_iters)
    fit.__wrapped__ = orig  # type: ignore[attr-defined]
    return fit


TRAINER_PATCHES = [("mindspeed_rl.trainer.grpo_trainer_hybrid.RayGRPOTrainer.fit", fit_wrapper)] + SENDER_METHODS

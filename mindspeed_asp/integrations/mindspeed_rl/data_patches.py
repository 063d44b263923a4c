"""Plan-ordered data path through MindSpeed-RL's own TransferDock (the synchronous ASP variant, max_lag 0).

MindSpeed-RL decides which vLLM instance generates which prompt at two points: the row layout that
`put_prompts_experience` gives a batch (prompt i -> rows [i*n, (i+1)*n)), and the rows each instance leader
pulls, which with `rl_config.guarantee_order: true` come from `BaseWorker.get_dp_range_indexes(use_vllm=True)`.
These patches make both follow the dispatch plan:

1. `PromptDataLoader.__iter__` of the trainer's loader yields each iteration's batch in plan order
   (instance 0's queue, then instance 1's, ...), with the dataset index of every prompt carried as column
   `asp_prompt_id`, and publishes the iteration's layout to a named Ray actor (`PlanCursor`) that every
   worker can read. Only the trainer's loader (see `follows_plan`): any other PromptDataLoader in the
   process (an evaluation loader, a unit test) iterates as stock does.
2. `DataStrategy.build_grpo` adds ASP's columns to the TransferDock; `put_prompts_experience` stores the
   prompt ids in their rows (the layout itself is MindSpeed-RL's).
3. `BaseWorker.get_dp_range_indexes(use_vllm=True)` returns instance j's planned rows, in plan order, cut
   into chunks of exactly `actor_rollout_dispatch_size` rows (MindSpeed-RL's `sync_generate_process`
   indexes `range(0, dispatch_size, n)`, so a short chunk would fail).

Prompt ids are dataset indexes as strings (the ids `asp plan` gives MindSpeed-RL datasets), listed in the
order the run's PromptDataLoader would draw them (`loader_order`: its own sampler, so shuffled with the
run's seed unless `no_shuffle`). The plan's windows are consecutive slices of that order, so iteration i
plans exactly the prompts stock MindSpeed-RL would train in iteration i.

With vLLM data parallelism (MoE, VLLM_DP_SIZE > 1) the per-engine queues are evened out first
(`balance_queues`): vLLM's DP ranks step in lockstep, so every engine must make the same number of
`generate()` calls.

`REWARD_PATCHES` make the rule-reward stage score every row exactly once with any number of `RuleReward`
actors (see `score_rule_rewards_exactly_once`).
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from mindspeed_asp.errors import ConfigError, PlanMismatchError

ASP_PROMPT_ID = "asp_prompt_id"
ROLLOUT_LOG_PROB = "rollout_log_prob"
POLICY_VERSION = "policy_version"
ASP_COLUMNS = [ASP_PROMPT_ID, ROLLOUT_LOG_PROB, POLICY_VERSION]
CURSOR_NAME = "asp_plan_cursor"
CURSOR_NAMESPACE_ENV = "ASP_RAY_NAMESPACE"


@dataclass(frozen=True)
class IterationLayout:
    """One iteration's plan: per instance the ordered prompt ids; n samples per prompt."""

    queues: Sequence[Sequence[str]]
    n: int

    def order(self) -> List[str]:
        """Prompt ids in batch order: instance 0's queue, then instance 1's, ..."""
        return [str(p) for q in self.queues for p in q]

    def rows(self, instance: int) -> List[int]:
        """TransferDock rows of an instance's groups, in plan order (prompt k of the batch owns k*n..k*n+n-1)."""
        start = sum(len(q) for q in self.queues[:instance])
        return list(range(start * self.n, (start + len(self.queues[instance])) * self.n))

    def chunks(self, instance: int, dispatch_size: int) -> List[List[int]]:
        """The instance's rows cut into chunks of exactly `dispatch_size` rows (whole groups)."""
        if dispatch_size <= 0 or dispatch_size % self.n:
            raise ConfigError(f"actor_rollout_dispatch_size {dispatch_size} must be a positive multiple of n={self.n}",
                              key="rl_config.actor_rollout_dispatch_size")
        rows = self.rows(instance)
        if len(rows) % dispatch_size:
            from mindspeed_asp.integrations.mindspeed_rl.config_section import rollout_dispatch_size
            ok = rollout_dispatch_size([len(q) for q in self.queues], self.n, sum(map(len, self.queues)),
                                       len(self.queues))
            raise ConfigError(f"instance {instance} has {len(rows) // self.n} planned groups, which do not split into "
                              f"chunks of {dispatch_size} rows; set actor_rollout_dispatch_size to {ok}",
                              key="rl_config.actor_rollout_dispatch_size")
        return [rows[i:i + dispatch_size] for i in range(0, len(rows), dispatch_size)]

    def row_prompt_ids(self) -> List[str]:
        return [p for p in self.order() for _ in range(self.n)]


class PlanCursor:
    """Holds the layout of the iteration in flight; one named Ray actor per run (see `plan_cursor`).

    The trainer process publishes when it draws a batch; vLLM instance leaders (other processes) read
    their row chunks from it inside `get_dp_range_indexes`.
    """

    def __init__(self) -> None:
        self.iteration = -1
        self.layout: Optional[IterationLayout] = None

    def publish(self, iteration: int, queues: Sequence[Sequence[str]], n: int) -> int:
        self.iteration, self.layout = int(iteration), IterationLayout([list(map(str, q)) for q in queues], int(n))
        return self.iteration

    def chunks(self, instance: int, instances: int, dispatch_size: int) -> List[List[int]]:
        if self.layout is None:
            raise RuntimeError("no iteration published to the ASP plan cursor yet")
        if instances != len(self.layout.queues):
            raise ConfigError(f"MindSpeed-RL runs {instances} vLLM instances but the plan has "
                              f"{len(self.layout.queues)}; build the plan with --instances {instances}",
                              key="asp.instances")
        return self.layout.chunks(instance, dispatch_size)

    def current(self) -> Dict[str, Any]:
        return {"iteration": self.iteration, "order": self.layout.order() if self.layout else []}


def plan_cursor(create: bool = False) -> Any:
    """The run's named PlanCursor actor (created by the trainer process, looked up by workers), or None."""
    import ray
    namespace = os.environ.get(CURSOR_NAMESPACE_ENV) or None
    try:
        return ray.get_actor(CURSOR_NAME, namespace=namespace)
    except ValueError:
        if not create:
            return None
    return ray.remote(num_cpus=0)(PlanCursor).options(name=CURSOR_NAME, namespace=namespace,
                                                      get_if_exists=True).remote()


# ---------------------------------------------------------------------------- the plan
def loader_order(loader: Any) -> List[int]:
    """Dataset indexes in the order `iter(loader)` would draw them this epoch.

    MindSpeed-RL's PromptDataLoader uses `RandomSampler(generator=torch.Generator().manual_seed(seed))`
    unless `no_shuffle` (then `SequentialSampler`). Reading the loader's own sampler gives exactly that
    permutation (and advances its generator as stock's first epoch would).
    """
    return [int(i) for i in iter(loader.sampler)]


def prompt_set_from_dataset(dataset: Any, n: int, origin: str = "mindspeed_rl dataset",
                            order: Optional[Sequence[int]] = None) -> Any:
    """The PromptSet of a MindSpeed-RL prompt dataset: id = dataset index, length = len(input_ids), listed in
    `order` (the loader's draw order, see `loader_order`; dataset order when None).

    `export_prompts.py` writes the same ids, lengths and order for `asp plan`, so the plan's fingerprint
    matches only for the same dataset, seed and shuffling.
    """
    import numpy as np
    from mindspeed_asp.core.problem import PromptSet
    idx = list(range(len(dataset))) if order is None else [int(i) for i in order]
    lens = np.fromiter((len(dataset[i]["input_ids"]) for i in idx), dtype=np.int64, count=len(idx))
    ids = np.array([str(i) for i in idx], dtype=object)
    return PromptSet(prompt_ids=ids, prompt_lens=lens, n=n, origin=origin)


#: The MindSpeed-RL key each setting a plan depends on (`scheduler.plan_file.SETTINGS`) comes from in a training YAML:
#: what `asp_build_plan` (shell/msrl_common.sh) passes to `asp plan`, so the plan-ordered loader can refuse a
#: plan built for other values naming the key to change (the standalone runtime's: runtime/run_config.py).
MSRL_PLAN_SETTING_KEYS = {"n": "rl_config.n_samples_per_prompt", "instances": "asp.instances", "slots": "asp.slots",
                          "kv_budget": "asp.kv_budget_tokens", "minibatch_groups": "asp.minibatch_groups",
                          "groups_per_iteration": "megatron_training.global_batch_size",
                          "max_new_tokens": "generate_config.sampling_config.max_tokens", "max_lag": "asp.max_lag",
                          "work_stealing": "asp.work_stealing", "planner": "asp.planner"}


def msrl_plan_settings(topo: Any) -> Dict[str, Any]:
    """The MindSpeed-RL run's value of every setting its plan depends on (`DispatchPlan.check_settings`), from
    the validated topology (config_section.MsrlTopology): a window is one global batch, the instances are the
    ones that follow the plan (the separate pool's, or MindSpeed-RL's colocated engines at max_lag 0)."""
    asp = topo.asp
    return {"n": int(topo.n), "instances": int(topo.instances), "slots": asp.slots, "kv_budget": asp.kv_budget_tokens,
            "minibatch_groups": asp.minibatch_groups, "groups_per_iteration": int(topo.gbs),
            "max_new_tokens": int(topo.max_tokens), "max_lag": asp.max_lag, "work_stealing": asp.work_stealing,
            "planner": asp.planner}


def open_plan(path: str, instances: int, prompts: Any = None, topo: Any = None) -> Any:
    """Load the plan written by `asp plan` (fingerprint-checked against `prompts` when given). With the run's
    `topo`, every setting the plan depends on is checked against the run's values (`msrl_plan_settings`),
    naming the MindSpeed-RL key that differs: a plan for another batch, n, cap, slots or lag bound would
    otherwise drive the run with queues and tags made for another one."""
    from mindspeed_asp.scheduler.plan_file import DispatchPlan
    try:
        plan = DispatchPlan.load(path, prompts)
    except PlanMismatchError as exc:
        raise PlanMismatchError(f"{exc} (the ids are listed in the loader's draw order, which follows "
                                "megatron_training.seed, no_shuffle and train_iters: export the prompts with the run's "
                                "values)") from None
    if plan.instances != instances:
        raise ConfigError(f"plan {path} is for {plan.instances} instances but the run has {instances}; rebuild "
                          f"it with `asp plan --instances {instances}`", key="asp.instances")
    if topo is not None:
        unchecked = plan.check_settings(msrl_plan_settings(topo), MSRL_PLAN_SETTING_KEYS)
        if unchecked:
            import sys
            print(f"asp: warning: plan {path} does not record {', '.join(unchecked)}, so the run's "
                  f"{', '.join(MSRL_PLAN_SETTING_KEYS[k] for k in unchecked)} cannot be checked against it; rebuild "
                  "it with this version's `asp plan`", file=sys.stderr)
    return plan


def iteration_queues(plan: Any, iteration: int, instances: int) -> List[List[str]]:
    """Per-instance ordered prompt ids of one iteration, from a plan exposing `instance_queue(it, j)`."""
    return [[str(p) for p in plan.instance_queue(iteration, j)] for j in range(instances)]


def balance_queues(queues: Sequence[Sequence[str]]) -> List[List[str]]:
    """The same groups with every instance holding exactly total / instances of them.

    Why: under vLLM data parallelism every engine must make the same number of `generate()` calls (chunks
    have a fixed size), so the plan's unequal counts would hang the DP ranks with fewer chunks. Fewest moves,
    plan order kept: an instance over its share keeps its head and gives up its tail (the planner starts
    long groups first, so the tail is its cheapest work); the given-up groups, in instance order, are
    appended to the instances under their share, in instance order.
    """
    total, m = sum(len(q) for q in queues), len(queues)
    if m == 0 or total % m:
        raise ConfigError(f"{total} planned groups do not split evenly over {m} instances (vLLM data parallelism "
                          "needs equal shares)", key="megatron_training.global_batch_size")
    share = total // m
    spare = [p for q in queues for p in list(q)[share:]]
    out = []
    for q in queues:
        head = [str(p) for p in list(q)[:share]]
        need = share - len(head)
        out.append(head + [str(p) for p in spare[:need]])
        spare = spare[need:]
    return out


def collate_prompts(items: Sequence[Dict[str, Any]], ids: Sequence[str],
                    additional_keys: Sequence[str]) -> Dict[str, Any]:
    """PromptDataLoader's collator output plus the prompt-id column, in the given order."""
    import torch
    batch: Dict[str, Any] = {"prompts": [torch.tensor(it["input_ids"]) for it in items]}
    for key in additional_keys:
        if key == ASP_PROMPT_ID:
            continue
        batch[key] = [torch.tensor(it[key]) for it in items]
    batch[ASP_PROMPT_ID] = [torch.tensor([int(p)]) for p in ids]
    return batch


class PlanOrderedBatches:
    """Iterator of plan-ordered batches over a MindSpeed-RL prompt dataset (replaces `iter(PromptDataLoader)`).

    Iteration i's batch holds exactly the prompts the plan schedules for iteration i; `publish` (the
    PlanCursor, or any callable(iteration, queues, n)) is told the layout before the batch is returned.
    """

    def __init__(self, dataset: Any, plan: Any, instances: int, gbs: int, n: int,
                 additional_keys: Sequence[str] = (), publish: Optional[Callable[..., Any]] = None,
                 start_iteration: int = 0, equal_counts: bool = False) -> None:
        self.dataset, self.plan, self.instances, self.gbs, self.n = dataset, plan, instances, gbs, n
        self.additional_keys = list(additional_keys)
        self.publish = publish
        self.equal_counts = equal_counts  # vLLM data parallelism: see balance_queues
        self.iteration = start_iteration
        self.last_queues: List[List[str]] = []
        self.last_shared = False  # the last iteration's groups wait in one shared queue (DispatchPlan.is_shared)
        self.last_isolated: List[str] = []  # prompt ids the last iteration isolated (DispatchPlan.isolated_ids)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return self

    def isolated_positions(self) -> List[int]:
        """Positions in the last batch (the queues laid end to end) of the groups its plan isolated."""
        iso = set(self.last_isolated)
        return [k for k, p in enumerate(p for q in self.last_queues for p in q) if p in iso]

    def __next__(self) -> Dict[str, Any]:
        try:
            queues = iteration_queues(self.plan, self.iteration, self.instances)
        except (IndexError, KeyError):
            raise StopIteration from None
        ids = [p for q in queues for p in q]
        last = getattr(self.plan, "num_iterations", None)
        if len(ids) < self.gbs and last is not None and self.iteration == last - 1:
            raise StopIteration  # the epoch's short remainder: PromptDataLoader drops it (drop_last=True)
        if len(ids) != self.gbs:
            raise PlanMismatchError(f"plan iteration {self.iteration} holds {len(ids)} prompt groups but "
                                    f"global_batch_size is {self.gbs}; rebuild the plan with the run's batch size")
        if len(set(ids)) != len(ids):
            raise PlanMismatchError(f"plan iteration {self.iteration} schedules a prompt twice")
        if self.equal_counts:
            queues = balance_queues(queues)
            ids = [p for q in queues for p in q]
        size = len(self.dataset)
        items = []
        for p in ids:
            if not p.lstrip("-").isdigit() or not 0 <= int(p) < size:
                raise PlanMismatchError(f"plan prompt id {p!r} is not an index of this dataset (0..{size - 1}); "
                                        "was the plan built for another dataset?")
            items.append(self.dataset[int(p)])
        if self.publish is not None:
            self.publish(self.iteration, queues, self.n)
        self.last_queues = queues
        is_shared = getattr(self.plan, "is_shared", None)
        self.last_shared = bool(is_shared(self.iteration)) if is_shared is not None else False
        isolated_ids = getattr(self.plan, "isolated_ids", None)
        self.last_isolated = list(isolated_ids(self.iteration)) if isolated_ids is not None else []
        self.iteration += 1
        return collate_prompts(items, ids, self.additional_keys)


# ---------------------------------------------------------------------------- patch functions
def put_prompts_experience_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Store `asp_prompt_id` in its rows: add it to the keys MindSpeed-RL copies per sample."""
    def put_prompts_experience(batch, n_samples_per_prompt, dataset_additional_keys=None, indexes=None,
                               add_another_batch=False):
        keys = list(dataset_additional_keys or [])
        if ASP_PROMPT_ID in batch and ASP_PROMPT_ID not in keys:
            keys.append(ASP_PROMPT_ID)
        return orig(batch, n_samples_per_prompt, keys, indexes=indexes, add_another_batch=add_another_batch)
    put_prompts_experience.__wrapped__ = orig  # type: ignore[attr-defined]
    return put_prompts_experience


def build_grpo_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Give the TransferDock ASP's columns (prompt id, behaviour log-probs, policy version)."""
    def build_grpo(self, prompts_num, n_samples_per_prompt, metrics, max_age, gbs_train,
                   addition_columns=None, reuse_image_embeds=False, dataset_additional_keys=None):
        cols = list(addition_columns or [])
        cols += [c for c in ASP_COLUMNS if c not in cols]
        return orig(self, prompts_num, n_samples_per_prompt, metrics, max_age, gbs_train,
                    addition_columns=cols, reuse_image_embeds=reuse_image_embeds,
                    dataset_additional_keys=dataset_additional_keys)
    build_grpo.__wrapped__ = orig  # type: ignore[attr-defined]
    return build_grpo


def build_dapo_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    """DAPO's docks (main and dynamic-sampling) get ASP's columns too."""
    def build_dapo(self, should_filter, max_num_prompt_in_batch, td_max_len, n_samples_per_prompt, metrics,
                   max_age, gbs_train, addition_columns=None, addition_consumers=None, dataset_additional_keys=None):
        cols = list(addition_columns or [])
        cols += [c for c in ASP_COLUMNS if c not in cols]
        return orig(self, should_filter, max_num_prompt_in_batch, td_max_len, n_samples_per_prompt, metrics,
                    max_age, gbs_train, addition_columns=cols, addition_consumers=addition_consumers,
                    dataset_additional_keys=dataset_additional_keys)
    build_dapo.__wrapped__ = orig  # type: ignore[attr-defined]
    return build_dapo


def planned_dp_range_indexes(self: Any, experience_count: int, cursor: Any) -> List[List[int]]:
    """Instance `get_vllm_dp_rank()`'s planned row chunks for the iteration in flight."""
    import ray
    instance, instances = self.get_vllm_dp_rank()
    return ray.get(cursor.chunks.remote(instance, instances, int(experience_count)))


def get_dp_range_indexes_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM rows come from the plan when a PlanCursor is running; training ranks keep MindSpeed-RL's ranges."""
    def get_dp_range_indexes(self, experience_count, use_vllm=False, assign_batch_size=None):
        if use_vllm:
            cursor = plan_cursor(create=False)
            if cursor is not None:
                return planned_dp_range_indexes(self, experience_count, cursor)
        return orig(self, experience_count, use_vllm=use_vllm, assign_batch_size=assign_batch_size)
    get_dp_range_indexes.__wrapped__ = orig  # type: ignore[attr-defined]
    return get_dp_range_indexes


#: Attribute MindSpeed-RL's dataset builder (patched) sets on the train split it returns.
TRAINING_SPLIT_ATTR = "asp_training_split"


def mark_training_split(dataset: Any) -> Any:
    """Mark `dataset` as the run's training split (what the trainer's PromptDataLoader iterates)."""
    if dataset is not None:
        setattr(dataset, TRAINING_SPLIT_ATTR, True)
    return dataset


def is_training_split(dataset: Any) -> bool:
    return bool(getattr(dataset, TRAINING_SPLIT_ATTR, False))


def build_train_valid_test_datasets_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Mark the train split MindSpeed-RL's train tasks build (cli/train_grpo.py, train_dapo.py, train_ppo.py:
    `train_ds, _, _ = build_train_valid_test_datasets(...)`), so the plan applies to the trainer's loader only."""
    def build_train_valid_test_datasets(*args, **kwargs):
        out = orig(*args, **kwargs)
        if isinstance(out, tuple) and out:
            mark_training_split(out[0])
        return out
    build_train_valid_test_datasets.__wrapped__ = orig  # type: ignore[attr-defined]
    return build_train_valid_test_datasets


def plan_covers_dataset(plan: Any, dataset: Any, n: int) -> bool:
    """True when `plan` was built for exactly this dataset (ids and prompt lengths), in whatever draw order.

    The plan's rows list the prompts in the order they were exported (the loader's draw order), so the
    dataset read in that order must give the plan's fingerprint."""
    import numpy as np
    if int(plan.num_groups) != len(dataset):
        return False
    ids = plan.cols["prompt_id"][np.argsort(plan.cols["row"], kind="stable")]
    if not all(str(p).isdigit() for p in ids):
        return False
    order = [int(p) for p in ids]
    if sorted(order) != list(range(len(dataset))):
        return False
    return prompt_set_from_dataset(dataset, n, order=order).fingerprint() == plan.fingerprint


def follows_plan(loader: Any, topo: Any) -> bool:
    """Whether `iter(loader)` is the trainer's loader in mode asp, i.e. must yield the plan's batches.

    Yes for a loader over the run's training split (marked by the patched `build_train_valid_test_datasets`,
    as MindSpeed-RL's train task builds it): for it a missing or mismatched plan is an error. Yes also for any
    loader over exactly the dataset the plan was built for (its ids and lengths); a wrong seed or shuffling
    then fails the plan's order check, naming the cause. Every other loader (an evaluation split, a test's
    own dataset, no plan file) iterates as stock.
    """
    if topo is None or not topo.plan_ordered:  # modes asp and colocated (config_section.MsrlTopology)
        return False
    if is_training_split(loader.dataset):
        return True
    path = topo.asp.plan_path
    if not path or not os.path.isfile(path):
        return False
    from mindspeed_asp.scheduler.plan_file import DispatchPlan
    return plan_covers_dataset(DispatchPlan.load(path), loader.dataset, topo.n)


def prompt_loader_iter_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    """`iter(PromptDataLoader)` yields plan-ordered batches for the trainer's loader when the run's `asp:`
    section asks for them (`follows_plan`); any other loader iterates as stock."""
    def __iter__(self):
        from mindspeed_asp.integrations.mindspeed_rl.config_section import topology_from_env
        topo = topology_from_env()
        if not follows_plan(self, topo):
            return orig(self)
        if not topo.asp.plan_path:
            raise ConfigError("mode asp: the training loader follows a dispatch plan, but no plan is configured; "
                              "build one with `asp plan` and set asp.plan_path", key="asp.plan_path")
        if not os.path.isfile(topo.asp.plan_path):
            from mindspeed_asp.errors import InputError
            raise InputError("plan file not found: mode asp's training loader follows the dispatch plan; build it "
                             "with `asp plan` (shell/msrl_common.sh does on node 0) before training",
                             path=str(topo.asp.plan_path), key="asp.plan_path")
        order = loader_order(self)  # stock's draw order: the plan's windows are slices of it
        plan = open_plan(topo.asp.plan_path, topo.instances,
                         prompt_set_from_dataset(self.dataset, topo.n, order=order), topo=topo)
        publish = None
        if topo.colocated_plan:  # MindSpeed-RL's own engines pull their rows through the cursor
            import ray
            cursor = plan_cursor(create=True)

            audit = getattr(topo.asp, "audit_path", None)

            def publish(iteration, queues, n):
                ray.get(cursor.publish.remote(iteration, queues, n))
                if audit:  # which prompts each engine generates in this iteration, for the run's record
                    import json
                    with open(audit, "a") as fh:
                        fh.write(json.dumps({"plan_iteration": int(iteration),
                                             "queues": [list(map(str, q)) for q in queues]}) + "\n")
        return PlanOrderedBatches(self.dataset, plan, topo.instances, topo.gbs, topo.n,
                                  getattr(self, "asp_additional_keys", ()), publish,
                                  equal_counts=topo.equal_instance_calls)
    __iter__.__wrapped__ = orig  # type: ignore[attr-defined]
    return __iter__


def loader_init_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Remember the loader's additional keys (PromptDataLoader keeps them only inside its collator)."""
    def __init__(self, dataset, global_batch_size, num_workers, seed, dataset_additional_keys, no_shuffle,
                 *args, **kwargs):
        orig(self, dataset, global_batch_size, num_workers, seed, dataset_additional_keys, no_shuffle,
             *args, **kwargs)
        self.asp_additional_keys = list(dataset_additional_keys or [])
    __init__.__wrapped__ = orig  # type: ignore[attr-defined]
    return __init__


# ---------------------------------------------------------------------------- rule rewards
def reward_claim_rows(dispatch_size: Optional[int], n: int, rows: int) -> int:
    """Rows per claim from the dock's locked sampler: a multiple of n (whole groups) dividing the dock's rows
    (its sampler refuses anything else), at most `reward_dispatch_size`."""
    groups = max(1, rows // n)
    want = min(groups, max(1, int(dispatch_size or rows) // n))
    return n * max(d for d in range(1, want + 1) if groups % d == 0)


def score_rule_rewards_exactly_once(actor: Any) -> Any:
    """Run inside a RuleReward actor: its own `compute_rm_score`, claiming rows under the dock's lock.

    Why: with `guarantee_order` stock's loop (rule_reward.py:75-87) takes fixed row ranges sized
    `gbs * n // get_node_nums()` by `dp_rank`, but runs until the *whole* dock is consumed: an actor that
    finishes its range while another is still fetching pops from an empty list (IndexError, which fails
    `ray.get` in `fit`), and ranges only tile the dock when the actor count equals the node count. Without
    `guarantee_order` the same loop asks the dock to pick ready groups under its sampling lock, so every row
    is claimed by exactly one actor whatever their number. Rule rewards are per-row functions written back
    to their own rows, so scores are the same; only which actor scores which row changes.
    """
    rl = actor.rl_config
    if not getattr(rl, "guarantee_order", False):
        return type(actor).compute_rm_score(actor)
    n = int(rl.n_samples_per_prompt)
    view = copy.copy(rl)
    view.guarantee_order = False
    view.reward_dispatch_size = reward_claim_rows(rl.reward_dispatch_size, n,
                                                  int(actor.megatron_config.global_batch_size) * n)
    actor.rl_config = view  # the actor runs one method at a time: the view lives for this call only
    try:
        return type(actor).compute_rm_score(actor)
    finally:
        actor.rl_config = rl


class _ScoreExactlyOnce:
    """`handle.compute_rm_score` look-alike: `.remote()` runs score_rule_rewards_exactly_once in the actor."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def remote(self) -> Any:
        return self.handle.__ray_call__.remote(score_rule_rewards_exactly_once)


class ExactlyOnceRuleReward:
    """A RuleReward actor handle whose `compute_rm_score.remote()` scores every row exactly once.

    Why a handle wrapper and not a patch of `RuleReward.compute_rm_score`: RuleReward is a `@ray.remote`
    class, which Ray ships by value from the process that creates the actors (the `train` task, which got it
    by value from the driver, where no setup hook runs), so a method patched by the hook never reaches the
    actors. The trainer is an ordinary class the hook does patch; every other attribute goes to the handle.
    """

    def __init__(self, handle: Any) -> None:
        self.asp_handle = handle

    @property
    def compute_rm_score(self) -> _ScoreExactlyOnce:
        return _ScoreExactlyOnce(self.asp_handle)

    def __getattr__(self, name: str) -> Any:
        if name == "asp_handle":  # unpickling: not set yet
            raise AttributeError(name)
        return getattr(self.asp_handle, name)


def exactly_once_rule_rewards(reward_list: Optional[Sequence[Any]]) -> Optional[List[Any]]:
    """`reward_list` with every RuleReward actor handle wrapped (model rewards are RayActorGroups: kept)."""
    if reward_list is None:
        return None
    from ray.actor import ActorHandle
    return [ExactlyOnceRuleReward(w) if isinstance(w, ActorHandle) else w for w in reward_list]


def reward_trainer_init_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Every MindSpeed-RL trainer (GRPO, DAPO, PPO, ASP's async fit) calls rule rewards through its reward_list."""
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        self.reward_list = exactly_once_rule_rewards(self.reward_list)
    __init__.__wrapped__ = orig  # type: ignore[attr-defined]
    return __init__


# (target, patch) pairs; setup_hook registers them. Targets are checked against the pinned source by
# tests/contract/test_patch_targets.py.
DATA_PATCHES = [
    ("mindspeed_rl.trainer.utils.transfer_dock.put_prompts_experience", put_prompts_experience_wrapper),
    ("mindspeed_rl.datasets.build_dataset.build_train_valid_test_datasets", build_train_valid_test_datasets_wrapper),
    ("mindspeed_rl.datasets.dataloader.PromptDataLoader.__iter__", prompt_loader_iter_wrapper),
    ("mindspeed_rl.datasets.dataloader.PromptDataLoader.__init__", loader_init_wrapper),
]
# TransferDock columns (data_strategy imports torchvision through its multimodal dock).
DOCK_PATCHES = [
    ("mindspeed_rl.trainer.utils.data_strategy.DataStrategy.build_grpo", build_grpo_wrapper),
    ("mindspeed_rl.trainer.utils.data_strategy.DataStrategy.build_dapo", build_dapo_wrapper),
]
# Instance -> rows. Kept apart because `base_worker` imports the NPU stack (torch_npu, vllm_ascend).
ROW_PATCHES = [
    ("mindspeed_rl.workers.base_worker.BaseWorker.get_dp_range_indexes", get_dp_range_indexes_wrapper),
]
# Rule rewards scored exactly once with any number of RuleReward actors (`trainer.base` imports the trainer
# stack: tensorboard, the worker launcher).
REWARD_PATCHES = [
    ("mindspeed_rl.trainer.base.RayBaseTrainer.__init__", reward_trainer_init_wrapper),
]

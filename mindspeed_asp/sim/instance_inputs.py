"""The instance simulator's inputs, checked once and flattened for its event loop.

Why apart from the simulator (engine.py): what a run may be given is a contract of its own, worth reading in
one place. `check_instance_inputs` refuses, in this order and naming the argument, everything the event loop
could not run or would run wrongly; `InstanceInputs` holds what passed, per group and per sequence (index
g * n + s) as plain lists, the form the event loop indexes one element at a time. The simulator's constructor
then only builds state from it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from mindspeed_asp.sim.step_cost import make_intervals
from mindspeed_asp.core.problem import InstanceSpec

INF = float("inf")
DISPATCH = ("plan", "fifo", "shared")
KV_POLICIES = ("preempt", "reserve")


@dataclass(frozen=True)
class InstanceInputs:
    """What a simulation runs on, validated: sizes, per-sequence lengths, the instance shape, the cost's
    interval sums, the dispatch and the plan's queues."""

    groups: int  # G
    samples: int  # n, sequences per group
    prompt: List[int]  # prompt tokens per sequence g*n+s
    response: List[int]  # true response tokens per sequence g*n+s
    slots: int  # B
    kv_budget: float  # K in tokens, inf when unbounded
    kv_policy: str  # "preempt" or "reserve"
    intervals: object  # step_cost.make_intervals(cost, cost_scale)
    group_load: List[float]  # per group: the work stealing load measure (1.0 each without steal_load)
    isolated: List[bool]  # per group: isolated by the plan (policy.may_steal)
    orders: List[np.ndarray]  # int64 per instance: its groups in plan order
    placed: np.ndarray  # bool [G]: the group is in some instance's order
    dispatch: str  # as asked: "plan", "fifo" or "shared"

    @property
    def shared_queue(self) -> bool:
        """Whether groups come from one queue shared by every instance (fifo: dataset order; shared: the
        plan's order, `policy.shared_queue_order`) instead of each instance's own plan queue."""
        return self.dispatch != "plan"


def check_instance_inputs(orders: Sequence[np.ndarray], lengths: np.ndarray, prompt_lens: np.ndarray,
                          spec: InstanceSpec, cost, *, kv_policy: str = "preempt", cost_scale: float = 1.0,
                          steal_load: Optional[np.ndarray] = None, dispatch: str = "plan",
                          isolated: Optional[Sequence[int]] = None) -> InstanceInputs:
    """Validate a simulation's inputs; ValueError (TypeError for a cost without `step_time`) on the first of:
    an unknown dispatch; lengths not [G, n] with n >= 1, or a response under 1 token; prompt lengths not [G];
    an unknown KV policy; fewer than 1 slot; a KV budget too small for one sequence's prompt + response (it
    could never run); a cost with no `step_time`; steal loads not [G]; a group index outside [0, G) or placed
    on two instances; an isolated group outside [0, G)."""
    if dispatch not in DISPATCH:
        raise ValueError(f"dispatch must be one of {DISPATCH}, got {dispatch!r}")
    L, P = _check_lengths(lengths, prompt_lens)
    G, n = L.shape
    if kv_policy not in KV_POLICIES:
        raise ValueError(f"kv_policy must be 'preempt' or 'reserve', got {kv_policy!r}")
    slots = int(spec.slots)
    if slots < 1:
        raise ValueError("InstanceSpec.slots must be >= 1")
    prompt, response = np.repeat(P, n), L.ravel()
    kv_budget = _check_kv_budget(spec, prompt, response)
    intervals = make_intervals(cost, cost_scale)
    group_load = _group_load(steal_load, G)
    checked, placed = _check_orders(orders, G)
    return InstanceInputs(groups=G, samples=n, prompt=prompt.tolist(), response=response.tolist(), slots=slots,
                          kv_budget=kv_budget, kv_policy=kv_policy, intervals=intervals, group_load=group_load,
                          isolated=_isolated_flags(isolated, G), orders=checked, placed=placed, dispatch=dispatch)


def _check_lengths(lengths: np.ndarray, prompt_lens: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Response lengths as int64 [G, n] (every one >= 1 token) and prompt lengths as int64 [G]."""
    lengths = np.asarray(lengths)
    if lengths.ndim != 2:
        raise ValueError(f"lengths must be [G, n], got shape {lengths.shape}")
    if lengths.shape[1] < 1:
        raise ValueError(f"lengths must hold n >= 1 samples per group, got shape {lengths.shape}")
    if np.any(lengths < 1):
        raise ValueError("every response length must be >= 1 token")
    plens = np.asarray(prompt_lens, dtype=np.int64)
    if plens.shape != (lengths.shape[0],):
        raise ValueError(f"prompt_lens must have shape ({lengths.shape[0]},), got {plens.shape}")
    return lengths.astype(np.int64), plens


def _check_kv_budget(spec: InstanceSpec, prompt: np.ndarray, response: np.ndarray) -> float:
    """The KV budget in tokens (inf when unbounded); the longest sequence must fit with its next token."""
    if spec.kv_budget is None:
        return INF
    budget = float(spec.kv_budget)
    worst = int((prompt + response).max()) if len(prompt) else 0
    if worst + 1 > budget:
        raise ValueError(f"kv_budget {spec.kv_budget} is smaller than one sequence's prompt + response "
                         f"({worst} tokens): that sequence can never run")
    return budget


def _group_load(steal_load: Optional[np.ndarray], G: int) -> List[float]:
    """The steal load per group: the given measure (predicted tokens), else 1.0 each (a group count)."""
    if steal_load is None:
        return [1.0] * G
    load = np.asarray(steal_load, dtype=np.float64)
    if load.shape != (G,):
        raise ValueError(f"steal_load must have shape ({G},), got {load.shape}")
    return load.tolist()


def _check_orders(orders: Sequence[np.ndarray], G: int) -> Tuple[List[np.ndarray], np.ndarray]:
    """Every instance's order as int64, each group on at most one instance; also which groups are placed."""
    placed = np.zeros(G, dtype=bool)
    checked = []
    for j, order in enumerate(orders):
        order = np.asarray(order, dtype=np.int64)
        if len(order) and (order.min() < 0 or order.max() >= G):
            raise ValueError(f"instance {j}: group index out of range [0, {G})")
        if np.any(placed[order]):
            raise ValueError(f"instance {j}: a group is placed twice")
        placed[order] = True
        checked.append(order)
    return checked, placed


def _isolated_flags(isolated: Optional[Sequence[int]], G: int) -> List[bool]:
    """Per group, whether the plan isolated it."""
    flags = [False] * G
    for g in (isolated if isolated is not None else ()):
        if not 0 <= int(g) < G:
            raise ValueError(f"isolated group {g} outside [0, {G})")
        flags[int(g)] = True
    return flags

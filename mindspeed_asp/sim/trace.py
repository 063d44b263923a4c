"""What a simulation of the instances records: per group, per sequence and per instance.

Why a module of its own: the event loop (engine.py), each instance (instance.py) and the dispatcher
(dispatcher.py) write into the same trace, and the pipeline reads it; kept apart, none of them imports
another just to name its result.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from mindspeed_asp.sim.instance_inputs import InstanceInputs


@dataclass
class InstanceTrace:
    """What the instances did: per group, per sequence and per instance (times in seconds).

    Sequence arrays are indexed by `g * n + s`. `seq_start` is the first admission, `seq_version` the policy
    version at first admission (the oldest version that produced any of its tokens), `group_dispatch` the
    time the group's first sequence was admitted and `group_version` the version then.
    """

    n: int
    group_instance: np.ndarray  # int [G]
    group_dispatch: np.ndarray  # float [G]
    group_finish: np.ndarray  # float [G]
    group_version: np.ndarray  # int [G]
    seq_start: np.ndarray  # float [G*n]
    seq_finish: np.ndarray  # float [G*n]
    seq_version: np.ndarray  # int [G*n]
    seq_preemptions: np.ndarray  # int [G*n]
    group_regenerated: np.ndarray  # int [G], times the group was regenerated (stale) before it was trained
    busy: np.ndarray  # float [m], T_j: time spent stepping
    steps: np.ndarray  # int [m], S_j: decode steps
    end: np.ndarray  # float [m], wall-clock time of the instance's last step
    preemptions: np.ndarray  # int [m]
    recompute_tokens: np.ndarray  # int [m], prefill tokens recomputed after preemption
    kv_peak: np.ndarray  # int [m], max resident KV reached
    steals: Optional[np.ndarray] = None  # int [m], groups this instance stole (work stealing)
    group_stolen: Optional[np.ndarray] = None  # bool [G], the group ran on a thief, not its plan instance

    @property
    def makespan(self) -> float:
        """Wall-clock time at which the last group finished."""
        return float(self.group_finish.max()) if len(self.group_finish) else 0.0



def empty_trace(inp: InstanceInputs) -> InstanceTrace:
    """The arrays the run fills in, as an InstanceTrace: every group placed as the plan says (on no instance
    yet with a shared queue), nothing dispatched or finished. `busy` and `steps` are the instances' own
    (`InstanceSim.trace` reads them)."""
    G, n, m = inp.groups, inp.samples, len(inp.orders)
    placement = np.full(G, -1, dtype=np.int64)
    if not inp.shared_queue:
        for j, order in enumerate(inp.orders):
            placement[order] = j
    return InstanceTrace(
        n=n, group_instance=placement, group_dispatch=np.full(G, np.nan), group_finish=np.full(G, np.nan),
        group_version=np.full(G, -1, dtype=np.int64), seq_start=np.full(G * n, np.nan),
        seq_finish=np.full(G * n, np.nan), seq_version=np.full(G * n, -1, dtype=np.int64),
        seq_preemptions=np.zeros(G * n, dtype=np.int64), group_regenerated=np.zeros(G, dtype=np.int64),
        busy=np.zeros(m), steps=np.zeros(m, dtype=np.int64), end=np.zeros(m),
        preemptions=np.zeros(m, dtype=np.int64), recompute_tokens=np.zeros(m, dtype=np.int64),
        kv_peak=np.zeros(m, dtype=np.int64), steals=np.zeros(m, dtype=np.int64),
        group_stolen=np.zeros(G, dtype=bool))

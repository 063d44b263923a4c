"""The names of the planners, and nothing else.

Why a module of its own: the config schema (a base module) refuses an unknown `asp.planner` when the file is
read, and must not import the scheduler to learn the names (imports run one way, docs/design.md#layering).
`scheduler/planners.py` builds its registry under exactly these names and refuses to load if the two differ.
"""
from __future__ import annotations

from typing import Tuple

#: Planners with an algorithm of their own (scheduler/asp_planner.py, scheduler/baselines.py).
BASE_PLANNERS: Tuple[str, ...] = ("asp", "stock", "random", "sorted_asc", "sorted_desc", "round_robin",
                                  "least_loaded", "verl_kk", "lpt", "shared_desc")
#: Other names of a base planner's algorithm (docs/design.md#baselines).
ALIASES: Tuple[str, ...] = ("dataset_order", "fifo")
#: Base planners that also run fed true lengths, as `oracle_<name>`.
ORACLE_OF: Tuple[str, ...] = ("asp", "lpt", "verl_kk")
ORACLE_PREFIX = "oracle_"
#: Every planner name, in the order the registry lists them (and errors name them).
PLANNER_NAMES: Tuple[str, ...] = BASE_PLANNERS + ALIASES + tuple(ORACLE_PREFIX + n for n in ORACLE_OF)

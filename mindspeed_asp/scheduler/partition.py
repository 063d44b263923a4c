"""Number partitioning for balancing prompt groups across instances: LPT, Karmarkar-Karp, local search.

Why hand-written rather than `prtpy`: the planners need (a) seeding with pre-placed tail loads, (b) an
equal-count variant (verl's `equal_size=True`), and (c) 10^5 items x 64 parts in about a second. The m-way
largest differencing method below keeps subsets as linked lists over a shared `next` array, so a merge is a
handful of numpy operations on length-m vectors, and the n single-item partitions are created lazily from the
sorted item stream instead of being materialised up front.

Every function returns `owner`, an int64 array giving the part (instance) of each item.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
from typing import Callable, Optional, Tuple

import numpy as np


def lpt_assign(weights: np.ndarray, m: int, base_loads: Optional[np.ndarray] = None) -> np.ndarray:
    """Longest Processing Time first (Graham 1969): largest item to the least-loaded part.

    Worst case (4/3 - 1/(3m)) * OPT; O(G log G + G log m).
    """
    w = np.asarray(weights, dtype=np.float64)
    owner = np.empty(len(w), dtype=np.int64)
    loads = np.zeros(m) if base_loads is None else np.asarray(base_loads, dtype=np.float64).copy()
    heap = [(float(loads[j]), j) for j in range(m)]
    heapq.heapify(heap)
    order = np.argsort(-w, kind="stable")
    wl = w[order].tolist()
    own = [0] * len(wl)
    pop, push = heapq.heappop, heapq.heappush
    for k, wk in enumerate(wl):
        load, j = pop(heap)
        own[k] = j
        push(heap, (load + wk, j))
    owner[order] = own
    return owner


class _State:
    """One partial m-way partition, kept as Python lists (fast single-element updates).

    `negs` are the negated subset sums in ascending order (so subset 0 is the largest), `heads`/`tails` the
    ends of each subset's linked list of items (-1 = empty), `anchors` the base part a subset grew from.
    """

    __slots__ = ("negs", "heads", "tails", "anchors")

    def __init__(self, negs: list, heads: list, tails: list, anchors: list) -> None:
        self.negs, self.heads, self.tails, self.anchors = negs, heads, tails, anchors

    @property
    def diff(self) -> float:
        return self.negs[-1] - self.negs[0]


def _merge(x: _State, y: _State, nxt: list) -> _State:
    """Differencing step: the largest subset of x joins the smallest of y, and so on; then re-sort."""
    xn, xh, xt, xa = (np.asarray(v) for v in (x.negs, x.heads, x.tails, x.anchors))
    yn, yh, yt, ya = (np.asarray(v)[::-1] for v in (y.negs, y.heads, y.tails, y.anchors))
    both = np.flatnonzero((xh >= 0) & (yh >= 0))
    for k in both.tolist():
        nxt[int(xt[k])] = int(yh[k])
    negs = xn + yn
    heads = np.where(xh >= 0, xh, yh)
    tails = np.where(yt >= 0, yt, xt)
    anchors = np.maximum(xa, ya)
    order = np.argsort(negs, kind="stable")
    return _State(negs[order].tolist(), heads[order].tolist(), tails[order].tolist(), anchors[order].tolist())


def _add_item(x: _State, wk: float, item: int, nxt: list) -> _State:
    """Merge x with a single-item partition: the item joins x's smallest subset (x is consumed)."""
    neg = x.negs.pop()
    head, tail, anchor = x.heads.pop(), x.tails.pop(), x.anchors.pop()
    if tail >= 0:
        nxt[tail] = item
    else:
        head = item
    neg -= wk
    p = bisect.bisect_left(x.negs, neg)
    x.negs.insert(p, neg)
    x.heads.insert(p, head)
    x.tails.insert(p, item)
    x.anchors.insert(p, anchor)
    return x


def karmarkar_karp(weights: np.ndarray, m: int, base_loads: Optional[np.ndarray] = None,
                   equal_size: bool = False) -> np.ndarray:
    """m-way largest differencing method (Karmarkar-Karp 1982), optionally seeded with base loads.

    `base_loads[j]` is work already on part j (placed tail groups); the result keeps part identities so the
    seeded loads stay where they are. `equal_size=True` is the balanced variant (BLDM, as verl's
    `karmarkar_karp(..., equal_size=True)`): states start as consecutive m-tuples of the sorted items, so
    part sizes differ by at most one. O(G log G) merges; a merge with a single item is an O(m) list
    insertion, a merge of two partitions O(m log m) in numpy.
    """
    w = np.asarray(weights, dtype=np.float64)
    G = len(w)
    if m < 1:
        raise ValueError("m must be >= 1")
    if G == 0:
        return np.zeros(0, dtype=np.int64)
    nxt = [-1] * G
    order = np.argsort(-w, kind="stable")
    counter = itertools.count()
    heap: list = []

    def push(state: _State) -> None:
        heapq.heappush(heap, (-state.diff, next(counter), state))

    if base_loads is not None:
        b = np.asarray(base_loads, dtype=np.float64)
        bo = np.argsort(-b, kind="stable")
        push(_State((-b[bo]).tolist(), [-1] * m, [-1] * m, bo.tolist()))

    if equal_size:
        pad = (-G) % m
        tuples = np.concatenate([order, np.full(pad, -1, dtype=np.int64)]).reshape(-1, m)
        for row in tuples:
            negs = np.where(row >= 0, -w[np.maximum(row, 0)], 0.0)
            push(_State(negs.tolist(), row.tolist(), row.tolist(), [-1] * m))
        singles = np.zeros(0, dtype=np.int64)
    else:
        singles = order
    ws = w[singles].tolist()
    items = singles.tolist()
    n_single = len(items)
    pos = 0

    def pair(k1: int, k2: int) -> _State:
        negs = [-ws[k1], -ws[k2]] + [0.0] * (m - 2) if m >= 2 else [-(ws[k1] + ws[k2])]
        if m >= 2:
            heads = [items[k1], items[k2]] + [-1] * (m - 2)
            return _State(negs, heads, list(heads), [-1] * m)
        nxt[items[k1]] = items[k2]
        return _State(negs, [items[k1]], [items[k2]], [-1])

    while len(heap) + (n_single - pos) > 1:
        # The partition with the largest difference is the next single item or the heap's top.
        if pos < n_single and (not heap or ws[pos] >= -heap[0][0]):
            k1 = pos
            pos += 1
            if pos < n_single and (not heap or ws[pos] >= -heap[0][0]):
                pos += 1
                push(pair(k1, pos - 1))
            else:
                push(_add_item(heapq.heappop(heap)[2], ws[k1], items[k1], nxt))
        else:
            x = heapq.heappop(heap)[2]
            if pos < n_single and (not heap or ws[pos] >= -heap[0][0]):
                pos += 1
                push(_add_item(x, ws[pos - 1], items[pos - 1], nxt))
            else:
                push(_merge(x, heapq.heappop(heap)[2], nxt))
    if heap:
        final = heap[0][2]
    else:  # exactly one item
        final = _add_item(_State([0.0] * m, [-1] * m, [-1] * m, [-1] * m), ws[0], items[0], nxt)

    owner = np.full(G, -1, dtype=np.int64)
    part_of_subset = final.anchors if base_loads is not None else list(range(m))
    for sidx in range(m):
        i = final.heads[sidx]
        part = part_of_subset[sidx]
        while i >= 0:
            owner[i] = part
            i = nxt[i]
    return owner


def improve_by_moves(owner: np.ndarray, part_time: Callable[[np.ndarray], float], work: np.ndarray, m: int,
                     max_rounds: int = 0) -> Tuple[np.ndarray, int]:
    """Move/swap local search that lowers the maximum of `part_time` over parts.

    Each round pairs the most and the least loaded part and tries, by the linear `work` proxy, the single move
    and the single swap whose transferred work is closest to half the gap; the candidate is accepted only if
    the exact `part_time` (the fluid estimate, nonlinear through its max term) of both parts gets below the
    old maximum. O(G log G) per round; at most `max_rounds` (default 4m) rounds.
    Returns the improved owner array (a copy) and the number of accepted changes.
    """
    owner = owner.copy()
    work = np.asarray(work, dtype=np.float64)
    times = np.array([part_time(np.flatnonzero(owner == j)) for j in range(m)])
    rounds = max_rounds or 4 * m
    accepted = 0
    for _ in range(rounds):
        hi, lo = int(np.argmax(times)), int(np.argmin(times))
        gap = times[hi] - times[lo]
        if hi == lo or gap <= 1e-12 * max(times[hi], 1e-300):
            break
        gh = np.flatnonzero(owner == hi)
        gl = np.flatnonzero(owner == lo)
        cands = []
        wh = work[gh]
        ok = wh < gap
        if ok.any():
            k = int(np.argmin(np.where(ok, np.abs(wh - gap / 2), np.inf)))
            cands.append(("move", int(gh[k]), -1))
        if len(gl) and len(gh):
            wl_order = np.argsort(work[gl])
            wl_sorted = work[gl][wl_order]
            target = wh - gap / 2
            p = np.clip(np.searchsorted(wl_sorted, target), 0, len(wl_sorted) - 1)
            best = None
            for q in (p, np.maximum(p - 1, 0)):
                d = wh - wl_sorted[q]
                valid = (d > 0) & (d < gap)
                score = np.where(valid, np.abs(d - gap / 2), np.inf)
                kk = int(np.argmin(score))
                if np.isfinite(score[kk]) and (best is None or score[kk] < best[0]):
                    best = (score[kk], int(gh[kk]), int(gl[wl_order[q[kk]]]))
            if best is not None:
                cands.append(("swap", best[1], best[2]))
        improved = False
        for kind, g, h in cands:
            new_owner_g = lo
            owner[g] = new_owner_g
            if kind == "swap":
                owner[h] = hi
            th = part_time(np.flatnonzero(owner == hi))
            tl = part_time(np.flatnonzero(owner == lo))
            if max(th, tl) < times[hi] * (1 - 1e-9):
                times[hi], times[lo] = th, tl
                accepted += 1
                improved = True
                break
            owner[g] = hi
            if kind == "swap":
                owner[h] = lo
        if not improved:
            break
    return owner, accepted


def part_loads(owner: np.ndarray, weights: np.ndarray, m: int) -> np.ndarray:
    """Sum of weights per part."""
    return np.bincount(owner, weights=np.asarray(weights, dtype=np.float64), minlength=m)


def partition_lower_bound(weights: np.ndarray, m: int) -> float:
    """max(sum/m, max, w_(m) + w_(m+1)): no partition into m parts has a smaller maximum."""
    w = np.sort(np.asarray(weights, dtype=np.float64))[::-1]
    if len(w) == 0:
        return 0.0
    lb = max(w.sum() / m, w[0])
    if len(w) > m:
        lb = max(lb, w[m - 1] + w[m])
    return float(lb)

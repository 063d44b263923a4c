"""Length-stratified minibatch tags (docs/design.md#arrival-smoothing and docs/design.md#planning, step 5).

Why stratify: response length correlates with difficulty and correctness, so a minibatch made only of
short (or only of long) groups changes the gradient (RollPacker's "distortion", SortedRL's curriculum). And
the trainer's demand is in tokens, so minibatches with equal predicted tokens keep its step time even.
"""
from __future__ import annotations

import numpy as np


def stratified_minibatches(pred_tokens: np.ndarray, completion: np.ndarray, minibatch: int) -> np.ndarray:
    """Tag each group with a minibatch index; minibatches are numbered in predicted readiness order.

    The groups are cut into `minibatch` length classes by predicted tokens (class c holds the c-th quantile
    slice, sizes differ by at most one). Minibatch k takes the k-th earliest-completing group of every class,
    so each minibatch holds one group per length quantile (about equal predicted tokens) and minibatch k
    is ready when the k-th group of its slowest class is done. All minibatches except the last hold exactly
    `minibatch` groups. O(G log G).
    """
    G = len(pred_tokens)
    tags = np.full(G, -1, dtype=np.int64)
    if G == 0:
        return tags
    M = max(1, min(int(minibatch), G))
    by_len = np.argsort(np.asarray(pred_tokens, dtype=np.float64), kind="stable")
    K = -(-G // M)  # number of minibatches
    # Class sizes: G = M*(K-1) + r with 1 <= r <= M; r classes get K groups, the others K-1.
    r = G - M * (K - 1)
    sizes = np.full(M, K - 1, dtype=np.int64)
    # Give the full-size classes to the longest quantiles: the last (partial) minibatch then lacks only
    # short groups, which keeps its token count closest to the others'.
    sizes[M - r:] = K
    start = 0
    comp = np.asarray(completion, dtype=np.float64)
    for c in range(M):
        members = by_len[start:start + sizes[c]]
        start += sizes[c]
        if len(members) == 0:
            continue
        members = members[np.argsort(comp[members], kind="stable")]
        tags[members] = np.arange(len(members))
    return tags


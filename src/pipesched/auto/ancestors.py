"""Which passes the dependency graph already orders: ancestor sets of an acyclic graph.

The MILP refinement (:mod:`pipesched.auto.milp`) needs a decision variable only for a pair of
passes on one rank that neither comes before the other in the graph; these bitsets answer that
in one shift and mask per pair.
"""

from __future__ import annotations


def ancestor_bits(preds: list[list[int]]) -> list[int]:
    """For each node of an acyclic graph given by its predecessors, the set of every node that
    must come before it, as a Python int's bits (bit ``u`` set: ``u`` is an ancestor)."""
    return _closure(len(preds), preds, _topological(len(preds), preds))


def _closure(n: int, preds: list[list[int]], topo: list[int]) -> list[int]:
    """Ancestor bitsets in topological order."""
    anc = [0] * n
    for v in topo:
        bits = 0
        for u in preds[v]:
            bits |= anc[u] | (1 << u)
        anc[v] = bits
    return anc


def _topological(n: int, preds: list[list[int]]) -> list[int]:
    succs: list[list[int]] = [[] for _ in range(n)]
    indeg = [len(p) for p in preds]
    for v, ps in enumerate(preds):
        for u in ps:
            succs[u].append(v)
    ready = [v for v in range(n) if indeg[v] == 0]
    order = []
    while ready:
        v = ready.pop()
        order.append(v)
        for w in succs[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return order

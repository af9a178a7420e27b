"""The search proper: greedy on the order, refinement by local moves, acceptance on the judge.

1. **Greedy** (search samples): remedies are added in the order of :mod:`.ranking` until the
   target is met (each node on its strongest remedy when all of them on their cheapest fall
   short together), then members the target does not need are pruned, last added first, and
   each member is given the cheapest kind the target allows, in one pass.
2. **Refinement** (search samples, ``search="refine"``): quantization errors interact (two
   errors can cancel, so remedying one alone hurts), so the order is a weak guide. Local
   moves improve the set while any does: drop one member (needless, or one whose remedy
   hurts), give one a cheaper kind, drop a pair, swap a member for a non-member, trade two
   members for one. A move is taken only when it improves (met first, then lower cost,
   then the better value); each class is scored in batches and the best of the first batch
   that improves is taken.
3. **Acceptance** (judging data): the set is scored on samples the search never saw. If it
   falls short there, the next remedies of the order are added in doubling steps until it
   holds, then the set is shrunk again judged on those samples (halving, as delta debugging
   does), so the search stays cheap and the verdict honest.

Every scored set updates the best so far on each data set, so a budget stop keeps it.
"""

from __future__ import annotations

import itertools
import math

from ..tables import threshold_text
from .objective import targets_text
from .result import MIXED, WHAT
from .scoring import cost_of

# Non-members tried in swap moves, and the largest sets tried with pair moves: bounds that
# keep one refinement round near a few hundred evaluations.
SWAP_WIDTH = 8
PAIR_LIMIT = 16
TRADE_LIMIT = 8
TRADE_WIDTH = 4
BATCH = 16


class Search:
    """One search filling ``result``; ``scorer`` scores on the search part, ``judge`` on the
    judging part (the same object when nothing is left to confirm on). ``moves()`` gives the
    ``[(node, kind)]`` order, best first; it is called only when needed (ranking costs)."""

    def __init__(self, result, scorer, judge, costs, moves, mode="refine", full_curve=False):
        self.result, self.S, self.J = result, scorer, judge
        self.costs, self._moves, self.mode, self.full_curve = costs, moves, mode, full_curve
        self.order = None
        self.best_S = self.best_J = None  # (rank, set)
        # the set the search samples chose, before the judge had its say
        self.chosen = None

    # -- bookkeeping ----------------------------------------------------------------------
    def moves(self):
        if self.order is None:
            self.order = list(self._moves())
            self.position = {mv: k for k, mv in enumerate(self.order)}
            self.kinds = {}
            for n, k in self.order:
                self.kinds.setdefault(n, []).append(k)
            # each node's first move is the greedy's; its float move (if any) the strongest
            self.first = [(n, ks[0]) for n, ks in self.kinds.items()]
            self.strongest = [(n, "float" if "float" in ks else ks[0]) for n, ks in self.kinds.items()]
        return self.order

    def rank(self, scorer, chosen, value):
        met = scorer.meets(value)
        cost = cost_of(chosen, self.costs)
        # met beats unmet; among met sets the cheaper, then the better value; among unmet the
        # better value, then the cheaper
        return (met, -cost if met else 0.0, scorer.key(value), -cost)

    def score(self, chosen):
        chosen = frozenset(chosen)
        value = self.S(chosen)
        r = self.rank(self.S, chosen, value)
        if self.best_S is None or r > self.best_S[0]:
            self.best_S = (r, chosen)
        return value

    def judge(self, chosen, stage):
        chosen = frozenset(chosen)
        fresh = chosen not in self.J.memo
        value = self.J(chosen)
        if fresh:
            self.result.confirmations.append({
                "stage": stage, "nodes": len(chosen), "cost": cost_of(chosen, self.costs),
                "search": self.S.memo.get(chosen), "value": value, "met": self.J.meets(value),
                "set": self._named(chosen)})
        r = self.rank(self.J, chosen, value)
        if self.best_J is None or r > self.best_J[0]:
            self.best_J = (r, chosen)
        return value

    def _named(self, chosen):
        return {n: k for n, k in self.sorted(chosen)}

    def sorted(self, chosen):
        """Members most promising first (the order of the moves)."""
        pos = getattr(self, "position", {})
        return sorted(chosen, key=lambda mv: (pos.get(mv, math.inf), mv))

    # -- the phases -----------------------------------------------------------------------
    def run(self):
        base = frozenset()
        value = self.score(base)
        self._point(base, None, value)
        chosen = base
        if not self.S.meets(value):
            self.moves()
            chosen = self.greedy()
            if self.mode == "refine":
                chosen = self.refine(chosen)
        self.chosen = chosen
        if self.J is self.S:
            return
        if self.J.meets(self.judge(chosen, "chosen")):
            return
        self.moves()
        self.escalate(chosen)

    def greedy(self):
        r = self.result
        r.ceiling = self.score(self.strongest)
        if not self.S.meets(r.ceiling):
            what = WHAT[r.remedy] + (" (each at its strongest remedy)" if r.remedy == MIXED else "")
            # the figure is the worst output's: with several, which one stays short is what to act on
            per = {} if self.S.task or len(self.S.specs) < 2 else self.S.pool(self.strongest).per_output()
            short = self.S.objective.short(per)  # each output against its own target where it has one
            r.ceiling_outputs = {o: v for o, (v, _) in short.items()} or None
            own = self.S.objective.targets is not None
            which = "" if not short else " (" + "; ".join(
                [f"output {o!r} {v:.6g}" + (f" of its {threshold_text(t)}" if own else "")
                 for o, (v, t) in short.items()]
                + [f"{o!r} reaches {v:.6g}" for o, v in per.items() if o not in short]) + ")"
            # told before the search ends, so true whatever it finds: a subset can do better
            r.notes.append(f"with every candidate {what} together the {self.S.metric.name} is {r.ceiling:.6g} on the "
                           f"search samples{which}, short of {self._bar}: some remedies cost accuracy "
                           "elsewhere, so the search looks for a subset; where none meets the target, try another "
                           "remedy or check the data and the float model")
        order = self.first
        if order != self.strongest and self.S.meets(r.ceiling) and not self.S.meets(self.score(order)):
            # every node on its cheapest remedy together falls short where all at their
            # strongest meet: walking the cheap order would add every node and meet nothing
            r.notes.append(f"every candidate on its cheapest remedy reaches only {self.S.memo[frozenset(order)]:.6g} "
                           f"on the search samples, short of {self._bar}: the greedy added each "
                           "node's strongest remedy instead, and cheaper kinds were tried after")
            order = self.strongest
        chosen, found = [], None
        for mv in order:
            chosen.append(mv)
            value = self.score(chosen)
            self._point(chosen, mv, value)
            if found is None and self.S.meets(value):
                found = list(chosen)
                if not self.full_curve:
                    break
        if found is None:
            return self.best_S[1]
        chosen = list(found)
        for mv in reversed(found):
            if len(chosen) == 1:
                break
            trial = [x for x in chosen if x != mv]
            if self.S.meets(self.score(trial)):
                chosen = trial
                r.pruned.append(mv[0])
        return self._cheapen(frozenset(chosen), lambda s: self.S.meets(self.score(s)), self._moved)

    def _point(self, chosen, mv, value):
        """A point of the search curve: the set ``chosen`` after adding the move ``mv`` (None:
        the baseline), with each output's value where the outputs have targets of their own."""
        point = {"nodes": len(chosen), "cost": cost_of(chosen, self.costs), "added": mv and mv[0],
                 "kind": mv and mv[1], "value": value}
        if getattr(value, "outputs", None) is not None:
            point["outputs"] = value.outputs
        self.result.curve.append(point)

    @property
    def _bar(self):
        return targets_text(self.S.target, self.S.objective.targets)

    def _cheapen(self, cur, accepts, moved=None):
        """Each member, least promising first, on the cheapest kind of its menu ``accepts``
        still takes (``moved(name, before, after)`` told of each): one pass, so that
        refinement does not spend a round on each."""
        for n, k in self._least_first(cur):
            for k2 in sorted(self.kinds.get(n, ()), key=self.costs.get):
                if self.costs[k2] < self.costs[k]:
                    trial = (cur - {(n, k)}) | {(n, k2)}
                    if accepts(trial):
                        if moved is not None:
                            moved("cheaper kind", cur, trial)
                        cur = trial
                        break
        return cur

    def _moved(self, name, cur, better):
        """Record a refinement: the move ``name`` took the search samples' set ``cur`` to ``better``."""
        self.result.refinements.append({
            "move": name, "removed": self._named(cur - better), "added": self._named(better - cur),
            "nodes": len(better), "cost": cost_of(better, self.costs), "value": self.S.memo[better],
            "before": self.S.memo[cur]})

    def refine(self, chosen):
        cur = frozenset(chosen)
        while True:
            for name, moves in (("drop", self._drops), ("cheaper kind", self._cheaper), ("drop pair", self._pairs),
                                ("swap", self._swaps), ("two for one", self._trades)):
                better = self._first_better(cur, moves(cur))
                if better is not None:
                    self._moved(name, cur, better)
                    cur = better
                    break
            else:
                return cur

    def _first_better(self, cur, candidates):
        best = (self.rank(self.S, cur, self.score(cur)), None)
        candidates = list(dict.fromkeys(c for c in candidates if c != cur))
        for k in range(0, len(candidates), BATCH):
            batch = candidates[k:k + BATCH]
            self.S.prepare(batch)
            for c in batch:
                r = self.rank(self.S, c, self.score(c))
                if r > best[0]:
                    best = (r, c)
            if best[1] is not None:
                return best[1]
        return None

    def _least_first(self, cur):
        return list(reversed(self.sorted(cur)))

    def _drops(self, cur):
        return [cur - {mv} for mv in self._least_first(cur)]

    def _cheaper(self, cur):
        out = []
        for n, k in self._least_first(cur):
            for k2 in self.kinds.get(n, ()):
                if self.costs[k2] < self.costs[k]:
                    out.append((cur - {(n, k)}) | {(n, k2)})
        return out

    def _pairs(self, cur):
        if not 2 <= len(cur) <= PAIR_LIMIT:
            return []
        return [cur - set(pair) for pair in itertools.combinations(self._least_first(cur), 2)]

    def _outside(self, cur, width):
        have = {n for n, _ in cur}
        return [mv for mv in self.first if mv[0] not in have][:width]

    def _swaps(self, cur):
        outside = self._outside(cur, SWAP_WIDTH)
        return [(cur - {mv}) | {o} for mv in self._least_first(cur) for o in outside]

    def _trades(self, cur):
        if not 2 <= len(cur) <= TRADE_LIMIT or not self.S.meets(self.S.memo.get(cur)):
            return []
        outside = self._outside(cur, TRADE_WIDTH)
        return [(cur - set(pair)) | {o} for pair in itertools.combinations(self._least_first(cur), 2)
                for o in outside]

    def escalate(self, chosen):
        """Add the next remedies of the order in doubling steps until the judge accepts."""
        have = {n for n, _ in chosen}
        rest = [mv for mv in self.first if mv[0] not in have]
        steps = []
        m = 1
        while m < len(rest):
            steps.append(chosen | frozenset(rest[:m]))
            m *= 2
        steps.append(chosen | frozenset(rest))
        strongest = frozenset(self.strongest)
        if strongest not in steps:
            steps.append(strongest)
        for trial in steps:
            value = self.score(trial)
            if trial == strongest and self.result.ceiling is None:
                self.result.ceiling = value
            if self.J.meets(self.judge(trial, "escalation")):
                self.shrink(trial)
                return

    def shrink(self, chosen):
        """Remove members in halving blocks, least promising first, while the judge accepts."""
        cur = frozenset(chosen)
        n = 2
        while cur:
            members = self._least_first(cur)
            size = max(1, math.ceil(len(members) / n))
            for k in range(0, len(members), size):
                trial = cur - frozenset(members[k:k + size])
                if self.J.meets(self.judge(trial, "shrink")):
                    cur, n = trial, max(n - 1, 2)
                    break
            else:
                if size == 1:
                    break
                n = min(2 * n, len(cur))
        return self._cheapen(cur, lambda s: self.J.meets(self.judge(s, "cheaper kind")))


def _fmt(v):
    return "n/a" if v is None else f"{v:.6g}"

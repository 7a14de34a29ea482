"""Who leads the control shard, by one node's view, and when a node stops waiting for the region
it deferred the control shard to. Pure.

The rule: the alive region with the lowest name that is not excluded (a region-loss drill's
target until its drill ends). Every node applies it to what it knows, and what nodes know can
differ for a while: a node that does not lead the control shard learns its records only through
replica commit hints. Two nodes that each name the other (a standoff), or a chosen region that
cannot lead at all, would leave the control shard without a leader for good: nobody commits,
so nobody learns the record that would end it.

So every node watches the region it defers to. When that region has not been heard leading the
control shard for ``wait_s`` since the node began deferring to it, the node passes it over: its
choice becomes the next region by the rule, maybe itself. A passed-over region gets its turn
back once it is heard leading the control shard, once the control leader it names changes (it
learned something), or once it is no longer alive. Whoever leads then commits, its commit
position reaches every node's fold, and the views agree again. Safety never rests on this: two
nodes that both lead are fenced by epochs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field

#: region -> (whether it was last heard leading the control shard, the control leader it named)
HeardOf = Callable[[str], tuple[bool, str | None]]


@dataclass
class ControlSuccession:
    self_region: str
    #: how long a node defers to a region that is not heard leading before passing it over
    wait_s: float
    #: passed-over region -> the control leader it named when it was passed over
    passed_over: dict[str, str | None] = field(default_factory=dict)
    #: the region this node defers to, and since when (reset whenever it is heard leading)
    _awaited: tuple[str, float] | None = None

    def choose(self, alive: Sequence[str], excluded: Set[str]) -> str:
        """The control leader by this node's view: the first alive region, by name, neither
        excluded nor passed over; passed-over regions before none at all."""
        for skip in (excluded | self.passed_over.keys(), excluded):
            choice = next((r for r in alive if r not in skip), None)
            if choice is not None:
                return choice
        return alive[0]

    def observe(
        self, now_s: float, alive: Sequence[str], excluded: Set[str], heard_of: HeardOf
    ) -> None:
        """One look (the control loop's tick): give passed-over regions their turn back where
        something changed, then restart or run out the wait for the region deferred to."""
        for region, named in list(self.passed_over.items()):
            leads, names_now = heard_of(region)
            if region not in alive or leads or names_now != named:
                del self.passed_over[region]
        choice = self.choose(alive, excluded)
        if choice == self.self_region:
            self._awaited = None
            return
        leads, named = heard_of(choice)
        if leads or self._awaited is None or self._awaited[0] != choice:
            self._awaited = (choice, now_s)
        elif now_s - self._awaited[1] >= self.wait_s:
            self.passed_over[choice] = named
            self._awaited = None

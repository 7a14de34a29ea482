"""``evacuate``: the target's shards move away in the placement's own steps, as an operator's
evacuation would move them.

* plan: the common preflight (every region up, no other drill, halt off, capacity);
* inject: the driver evacuates the target through the controller; the fault is in place once
  the committed placement evacuates it;
* restore: the driver restores the target through the controller;
* report: each shard's recovery time counts from its own move (a shard restored before its step
  never moved); the canaries are read back once the target is restored.
"""

from regions.drill_kinds.rules import DrillKindRules

KIND = DrillKindRules(name="evacuate", fault="placement")

"""``region-loss``: the target is cut off from every other node, without killing anything.

* plan: the common preflight, with the region-loss capacity arithmetic (``regions.drill_plan``);
* inject: the injecting record itself is the fault: every node black-holes the target while the
  drill injects or holds (``services.control.drills.faults``), and the target fences itself;
* restore: the phase change lifts the black-hole;
* report: recovery time counts from the first record; the canaries are read back once every
  moved shard took a write again.
"""

from regions.drill_kinds.rules import DrillKindRules

KIND = DrillKindRules(name="region-loss", fault="black_hole")

"""``kill``: the target's node process is killed, and started again after the hold.

* plan: the common preflight, and a supervisor that restarts killed processes (a plane run by
  ``convplane up`` in the foreground);
* inject: ``convplane up``'s supervisor kills the target's node at its next look at the drills
  (``services.control.drills.local_kill``); the fault is in place once the target is no longer
  seen up;
* restore: the supervisor starts the node again once the drill has moved on;
* report: recovery time counts from the first record; the canaries are read back once every
  moved shard took a write again.
"""

from regions.drill_kinds.rules import DrillKindRules

KIND = DrillKindRules(name="kill", fault="process", needs_supervisor=True)

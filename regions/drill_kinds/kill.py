"""``kill``: the target's node process is killed, and started again after the hold.

* plan: the common preflight, and a supervisor that restarts killed processes (a plane run by
  ``convplane up`` in the foreground);
* inject: ``convplane up``'s supervisor kills the target's node at its next look at the drills
  (``services.control.drills.local_kill``); the fault is in place once the target is no longer
  seen up;
* restore: the supervisor starts the node again once the drill has moved on;
* report: recovery time counts from the first record; the canaries are read back once every
  moved shard took a write again.

With ``node`` (``DrillSpec.node``) it kills one node of a region of several: the supervisor
kills and restarts that node only; the fault is in place once the node stops answering (its
region does not go down), the measured shards are the node's slot's, a canary counts once
another node served it, and the placement must keep its version (``regions.drills``).
"""

from regions.drill_kinds.rules import DrillKindRules

KIND = DrillKindRules(name="kill", fault="process", needs_supervisor=True)

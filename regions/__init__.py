"""Pure decisions about regions, no I/O: who is up (``membership``), which region leads which
shard (``placement``, and ``control``: the placement's records in the control shard and the
decisions of its leader), the capacity arithmetic of a region loss and a replay
(``capacity_arithmetic``), and drills (``drills``: the state machine;
``drill_plan``: preflight and dry run; ``drill_report``; ``ops_state``: drills, halt switch and
audit folded from the control shard; ``readiness``: each region's loss evaluated as preflight
would, with its drills' age, as a score; ``practice`` and ``practice_state``: scheduled practice
runs, their decision and their records). ``services`` carries the decisions out.

Where a change goes: a new drill kind is a module in ``drill_kinds`` (its fault, its preflight
rule, how its report counts recovery) and its line in that package's registry (its docstring
says so); a new placement rule goes in ``control``, tested on virtual time by the whole-plane
simulation (``services.plane_sim``).
"""

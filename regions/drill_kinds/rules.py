"""What a drill kind declares (one ``DrillKindRules`` in each kind's module). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: how a drill takes its target away, and so how the drill driver injects and restores it:
#:
#: * ``placement``: the driver evacuates the target through the controller (an evacuate record)
#:   and restores it the same way; its shards move in steps, so a shard's recovery time counts
#:   from its own move, and a shard restored before its step never moved;
#: * ``black_hole``: the injecting record is the fault: every node drops what it sends to the
#:   target while the drill injects or holds (``services.control.drills.faults``), and the phase
#:   change lifts it;
#: * ``process``: ``convplane up``'s supervisor kills the target's node and starts it again
#:   (``services.control.drills.local_kill``); nobody hears the target while it is down.
Fault = Literal["placement", "black_hole", "process"]


@dataclass(frozen=True)
class DrillKindRules:
    """A drill kind: its name (the API's ``kind``), its fault (inject, restore, and how the
    report counts recovery) and its own preflight rule."""

    name: str
    fault: Fault
    #: preflight: only a plane whose supervisor restarts killed processes can run it
    needs_supervisor: bool = False

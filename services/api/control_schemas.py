"""Bodies of the control, peer and replay endpoints, for the OpenAPI document.

Answers are open objects (``extra="allow"``): they declare and check the fields clients rely on
and pass through any field a newer node adds, so the document never promises less than the
server sends. Requests are closed and strict, like the public API's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from services.api.event_bodies import integral
from services.api.schemas import ConversationId

REGION_PATTERN = r"^[a-z0-9][a-z0-9-]*$"
REGION_NAME_MAX = 63
REPLAY_IDS_MAX = 1000
SHARD_MAX = 2**31 - 1


def _open(*examples: dict[str, Any]) -> ConfigDict:
    return ConfigDict(extra="allow", json_schema_extra={"examples": list(examples)})


class RegionView(BaseModel):
    model_config = _open()

    name: str
    url: str
    status: Literal["up", "suspected", "down"]
    capacity_weight: float
    suspected_by: list[str] = Field(description="regions that suspect it now")
    evacuated: bool
    shards_assigned: int
    unhealthy_loops: list[str] = Field(
        default_factory=list,
        description="background loops of that region's node that stopped or crash-loop "
        "(as last heard)",
    )
    replica: Literal["admitted", "quarantined", "unknown"] = Field(
        default="unknown",
        description="whether its replica counts: quarantined when its database is not the one "
        "the cluster knows (lost or re-created) until `convplane replica rebuild`",
    )


class Regions(BaseModel):
    model_config = _open(
        {
            "observer": "us-east",
            "regions": [
                {
                    "name": "eu-west",
                    "url": "http://127.0.0.1:8701",
                    "status": "up",
                    "capacity_weight": 1.0,
                    "suspected_by": [],
                    "evacuated": False,
                    "shards_assigned": 21,
                }
            ],
        }
    )

    observer: str = Field(description="the region whose view this is")
    regions: list[RegionView]


class Placement(BaseModel):
    model_config = _open(
        {
            "version": 3,
            "assignment": {"0": "us-east", "1": "eu-west"},
            "down": [],
            "evacuated": [],
            "reason": "initial",
            "control_leader": "us-east",
        }
    )

    version: int = Field(description="increases with every committed placement change")
    assignment: dict[str, str] = Field(description="shard (as a string) -> leading region")
    down: list[str]
    evacuated: list[str]
    reason: str
    control_leader: str = Field(description="the region leading the control shard")


class WarmWorker(BaseModel):
    model_config = _open()

    worker_id: str
    engine_id: str
    engine_url: str | None
    model_revision: str
    warm_since: str
    prompt_tokens: int


class Route(BaseModel):
    model_config = _open(
        {
            "conversation_id": "c-support-42",
            "region": "us-east",
            "shard": 5,
            "epoch": 2,
            "placement_version": 3,
            "worker": None,
        }
    )

    conversation_id: str
    region: str = Field(description="the region that should serve the next turn")
    node: int = Field(
        default=0,
        description="which of the region's nodes leads the conversation's shard (0: its first, "
        "at the region's url; 1..: its more_nodes, in the cluster file's order)",
    )
    node_url: str | None = Field(
        default=None,
        description="that node's client URL: a client that sends the conversation there saves "
        "a hop inside a region of several nodes",
    )
    shard: int
    epoch: int
    placement_version: int
    worker: WarmWorker | None = Field(
        description="the replay worker whose KV for this conversation is warm; null when none"
    )


class Affinity(BaseModel):
    model_config = _open(
        {"conversation_id": "c-support-42", "region": "us-east", "shard": 5, "worker": None}
    )

    conversation_id: str
    region: str
    shard: int
    worker: WarmWorker | None


def _first_node_slots() -> list[int | None]:
    return [0]


class PeerHealth(BaseModel):
    model_config = _open(
        {
            "region": "eu-west",
            "suspects": [],
            "led_shards": [1, 4],
            "placement_version": 3,
            "control_leader": "us-east",
        }
    )

    region: str
    #: which of the region's nodes answered (``RegionConfig.more_nodes``)
    node: int = 0
    #: whether that node leads any of the region's node slots (holds its lease)
    leads_region: bool = True
    #: the region's node slots whose leases that node holds (``services.control.node_slots``)
    slots: list[int] = Field(default_factory=lambda: [0])
    #: whether that node asks for its own slot back from the sibling that holds it
    wants_own_slot: bool = False
    #: per node slot of the region, the node holding it as that node knows (null: none heard
    #: lately), so a peer need not ask each node (``Controller._probe``)
    region_slots: list[int | None] = Field(default_factory=_first_node_slots)
    #: the shards the region's nodes lead, as that node knows
    region_led_shards: list[int] = Field(default_factory=list)
    suspects: list[str]
    led_shards: list[int]
    placement_version: int
    control_leader: str
    unhealthy_loops: list[str] = Field(default_factory=list)


class ReplayStatus(BaseModel):
    model_config = _open({"region": "us-east", "mode": "in_process"})

    region: str
    mode: str
    served_model_revisions: list[str] = Field(
        default_factory=list,
        description="the model revisions this region's engines serve; none: no replay here",
    )
    not_replayed: dict[str, Any] = Field(
        default_factory=dict,
        description="moved conversations no engine here can replay, by reason (no_engine, "
        "model_unserved) and by unserved model revision: counted, never queued",
    )


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ReplayConversations(_Closed):
    """Replay these conversations of one tenant (conversation ids are namespaced by tenant;
    each must be led by this region; the answer says, per id)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"tenant_id": "acme", "conversation_ids": ["c-support-42"]}]
        }
    )

    tenant_id: Annotated[str, Field(min_length=1, max_length=128)]
    conversation_ids: list[ConversationId] = Field(max_length=REPLAY_IDS_MAX)


class ReplayShard(_Closed):
    """Replay every recent conversation of a shard this region leads (503 ``not_leader``
    naming the leader otherwise)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"shard": 5}]})

    shard: Annotated[int, Field(ge=0, le=SHARD_MAX), BeforeValidator(integral)] = Field(
        description="below the cluster's shard count"
    )


ReplayRequest = Annotated[
    ReplayConversations | ReplayShard, Field(description="exactly one of the two forms")
]


class ReplayAccepted(BaseModel):
    model_config = _open(
        {"conversations": {"c-support-42": "queued"}},
        {"shard": 5, "accepted": 12, "outside_window": 3, "rejected_full": 0, "superseded": 0},
    )

    conversations: dict[str, str] | None = Field(
        default=None,
        description="per conversation id: queued, outside_window, backlog_full, not_found or "
        "not_led_here (leader: <region>)",
    )
    shard: int | None = None
    accepted: int | None = None

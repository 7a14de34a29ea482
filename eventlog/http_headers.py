"""The HTTP header names of convplane's wire protocol, spelled once: the REST API, the nodes'
peer calls and every client in this repository (replay workers, the CLI, the chaos harness,
the console) use these. Here, in the innermost package, because replay's REST client needs
them and may import nothing but ``eventlog``. HTTP header names are case-insensitive; ASGI
hands them over lower-cased (the ``*_RAW`` forms)."""

#: set by a node on a request it forwards to the leading region (only peers may send it)
FORWARDED_HEADER = "X-Convplane-Forwarded"
#: the peer secret on node-to-node calls
PEER_AUTH_HEADER = "X-Convplane-Peer-Auth"
#: the region a peer call comes from (the caller's own), checked against its certificate
SOURCE_REGION_HEADER = "X-Convplane-Source-Region"
#: the time the caller gives the request, in milliseconds from its arrival (a budget, not a
#: clock time: no clock needs to agree); a forward passes on what is left of it
DEADLINE_HEADER = "X-Convplane-Deadline-Ms"
#: the tenant a replay service key reads a transcript on behalf of
TENANT_HEADER = "X-Convplane-Tenant"
#: the region that served an answer
SERVED_BY_HEADER = "X-Convplane-Served-By"
#: makes an append safe to retry: a retry with the same key and body gets the original result
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
#: ``true`` on the answer to such a retry (200, the original result)
IDEMPOTENT_REPLAYED_HEADER = "Idempotent-Replayed"
#: the client's id for a request (the request log's ``request_id``; replay's engine calls)
REQUEST_ID_HEADER = "X-Request-Id"

FORWARDED_HEADER_RAW = FORWARDED_HEADER.lower().encode()
SERVED_BY_HEADER_RAW = SERVED_BY_HEADER.lower().encode()
IDEMPOTENCY_KEY_HEADER_RAW = IDEMPOTENCY_KEY_HEADER.lower().encode()

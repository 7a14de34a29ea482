"""Headers nodes send each other with a forwarded request."""

FORWARDED_HEADER = "X-Convplane-Forwarded"
PEER_AUTH_HEADER = "X-Convplane-Peer-Auth"
DEADLINE_HEADER = "X-Convplane-Deadline-Ms"

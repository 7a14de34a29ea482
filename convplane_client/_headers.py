"""The HTTP header names of convplane's wire protocol that a chat application meets. Copied
from the server's ``eventlog.http_headers`` rather than imported: this package is a client of
the REST API only and ships without the server (``tests/unit/test_client_headers.py`` holds the
two spellings together)."""

#: the request's time budget in milliseconds; forwards carry what is left of it
DEADLINE_HEADER = "X-Convplane-Deadline-Ms"
#: the region that served an answer (the conversation's leader, for a forwarded request)
SERVED_BY_HEADER = "X-Convplane-Served-By"
#: makes an append safe to retry: a retry with the same key and body gets the original result
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
#: ``true`` on the answer to such a retry (200, the original result)
IDEMPOTENT_REPLAYED_HEADER = "Idempotent-Replayed"
#: seconds to wait before retrying (429, 503, 504)
RETRY_AFTER_HEADER = "Retry-After"

"""``TranscriptSource`` over the region's REST API (``replay.transcripts``): what a worker in its
own process (``convplane worker``) reads transcripts through."""

from __future__ import annotations

from urllib.parse import quote

import httpx

from eventlog.errors import InvalidRequest, NotFound
from eventlog.http_headers import TENANT_HEADER
from replay.read_grant import READ_GRANT_HEADER
from replay.transcripts import PagedTranscriptSource, TranscriptEvent, TranscriptUnavailable


class HttpTranscriptSource(PagedTranscriptSource):
    """Reads a transcript from the region's REST API, page by page.

    ``GET {region_url}/v1/conversations/{id}/events?after_seq=&limit=`` with the region's worker
    key as a bearer token, the tenant in ``X-Convplane-Tenant`` and the job's read grant in
    ``X-Convplane-Replay-Grant`` (``replay.read_grant``). The answer is the API's
    ``EventPage``: ``{"events": [...]}``, each event with ``seq``, ``type`` and ``payload``.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        api_key: str,
        *,
        page_limit: int = 200,
        events_max: int = 20_000,
    ) -> None:
        super().__init__(page_limit=page_limit, events_max=events_max)
        self._client = client  # base_url = the region's URL; owned by the caller
        self._api_key = api_key

    async def page(
        self, tenant_id: str, conversation_id: str, after_seq: int, read_grant: str
    ) -> list[TranscriptEvent]:
        try:
            response = await self._client.get(
                f"/v1/conversations/{quote(conversation_id, safe='')}/events",
                params={"after_seq": after_seq, "limit": self._page_limit},
                headers={
                    "Authorization": f"Bearer {self._api_key}",
                    TENANT_HEADER: tenant_id,
                    READ_GRANT_HEADER: read_grant,
                },
            )
        except httpx.HTTPError as exc:
            raise TranscriptUnavailable(f"region API unreachable: {exc!r}") from exc
        if response.status_code == 404:
            raise NotFound(f"conversation {conversation_id} not found")
        if response.status_code == 429 or response.status_code >= 500:
            raise TranscriptUnavailable(f"region API answered {response.status_code}")
        if response.status_code != 200:
            raise InvalidRequest(
                f"region API answered {response.status_code}: {response.text[:200]}"
            )
        try:
            body = response.json()
            return [
                TranscriptEvent(int(e["seq"]), str(e["type"]), dict(e["payload"]))
                for e in body["events"]
            ]
        except (ValueError, KeyError, TypeError) as exc:
            raise TranscriptUnavailable(f"region API answered an unexpected body: {exc!r}") from exc

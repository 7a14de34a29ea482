"""Read grants (``replay.read_grant``): only the plane's signature over exactly this job's
tenant, conversation, region and expiry lets a worker key read a transcript."""

from __future__ import annotations

import pytest

from eventlog.errors import Forbidden
from replay.read_grant import ReadGrant, sign, verify

KEY = b"k" * 32


def job_grant(key: bytes = KEY) -> str:
    return sign(key, job_id="b/t1/c.1/3", tenant_id="t1", conversation_id="c.1", region="b",
                expires_ms=5_000)  # fmt: skip


def test_a_grant_reads_its_own_conversation_until_it_expires() -> None:
    grant = job_grant()
    assert verify(KEY, grant, tenant_id="t1", conversation_id="c.1", now_ms=4_999) == ReadGrant(
        "b/t1/c.1/3", "b", 5_000
    )
    with pytest.raises(Forbidden, match="expired"):
        verify(KEY, grant, tenant_id="t1", conversation_id="c.1", now_ms=5_000)


@pytest.mark.parametrize(
    ("tenant_id", "conversation_id", "key"),
    [("t2", "c.1", KEY), ("t1", "c.2", KEY), ("t1", "c.1", b"x" * 32)],
)
def test_a_grant_reads_nothing_else(tenant_id: str, conversation_id: str, key: bytes) -> None:
    with pytest.raises(Forbidden):
        verify(key, job_grant(), tenant_id=tenant_id, conversation_id=conversation_id,
               now_ms=0)  # fmt: skip


@pytest.mark.parametrize(
    "forged",
    [
        None,
        "",
        "v1.x.b.5000",
        "v2" + job_grant()[2:],
        job_grant().replace(".b.", ".a."),  # another region
        job_grant().replace(".5000.", ".9000."),  # a later expiry
        "v1.!!!.b.5000." + "0" * 64,
        "v1." + "A" * 2000,
    ],
)
def test_a_forged_or_altered_grant_is_refused(forged: str | None) -> None:
    with pytest.raises(Forbidden):
        verify(KEY, forged, tenant_id="t1", conversation_id="c.1", now_ms=0)

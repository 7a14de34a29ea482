"""Routes of API keys on a running plane (operator keys; the list also viewer keys).

* ``POST /v1/admin/keys`` ``{tenant_id, name?, role?, expires_in_s?, reason}``: 201 with the new
  key, shown this once (``name`` defaults to the tenant id; 409 when the name is taken).
* ``POST /v1/admin/keys/{name}/rotate`` ``{new_name?, grace_s?, expires_in_s?, reason}``: 201
  with a new key for the same tenant and role; the old one works ``grace_s`` longer.
* ``DELETE /v1/admin/keys/{name}?reason=``: revoke (control-shard and cluster-file keys).
* ``GET /v1/admin/keys``: every key's name, tenant, role, expiry and state (never a hash).

Each change commits one ``control.key`` record with its audit entry (``services.control.key_admin``),
committed by the control shard's leader (other nodes forward there); every node applies it
within ``services.api.auth.KEY_APPLIED_WITHIN_S``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from eventlog.errors import Unavailable
from regions.drills import REASON_CHARS_MAX
from regions.keys import NAME_CHARS_MAX, KeyRecord, Role
from services.api.context import RequestContext, app_services, request_context
from services.api.openapi import OPERATORS, errors
from services.api.roles import OBSERVER_ROLES, OPERATOR_ROLES, require_role
from services.control.key_admin import KEY_LIFETIME_MAX_S, ROTATION_GRACE_MAX_S, KeyAdmin, Operator

key_router = APIRouter(prefix="/v1/admin/keys", tags=[OPERATORS])
Context = Annotated[RequestContext, Depends(request_context)]
#: names are checked by ``regions.keys.check_name`` (a reserved name gets its own message)
KeyNamePath = Annotated[str, Path(min_length=1, max_length=NAME_CHARS_MAX)]
#: how long the old key works after a rotation when the request does not say
ROTATION_GRACE_DEFAULT_S = 3600.0


class CreateKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant_id: str = Field(min_length=1, max_length=NAME_CHARS_MAX)
    name: str | None = Field(default=None, min_length=1, max_length=NAME_CHARS_MAX)
    role: Role = "tenant"
    expires_in_s: float | None = Field(default=None, gt=0, le=KEY_LIFETIME_MAX_S)
    reason: str = Field(min_length=1, max_length=REASON_CHARS_MAX)


class RotateKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    new_name: str | None = Field(default=None, min_length=1, max_length=NAME_CHARS_MAX)
    grace_s: float = Field(default=ROTATION_GRACE_DEFAULT_S, ge=0, le=ROTATION_GRACE_MAX_S)
    expires_in_s: float | None = Field(default=None, gt=0, le=KEY_LIFETIME_MAX_S)
    reason: str = Field(min_length=1, max_length=REASON_CHARS_MAX)


def _admin(request: Request) -> KeyAdmin:
    admin = app_services(request.app).key_admin
    if admin is None:
        raise Unavailable("key administration needs the control plane, not running on this node")
    return admin


def _operator(ctx: RequestContext, reason: str) -> Operator:
    require_role(ctx.tenant, OPERATOR_ROLES)
    tenant = ctx.tenant
    return Operator(by=tenant.tenant_id, role=tenant.role, reason=reason, key_name=tenant.name)


def _created(key: str, record: KeyRecord) -> JSONResponse:
    body = {
        "api_key": key,
        "name": record.name,
        "tenant_id": record.tenant_id,
        "role": record.role,
        "expires_at_ms": record.expires_at_ms,
    }
    return JSONResponse(body, status_code=201)


@key_router.post("", status_code=201, responses=errors(409))
async def create_key(ctx: Context, body: CreateKey) -> Any:
    """Create a key (operator keys): shown once in the answer, in effect at every node within
    the bound the module states. 400: a bad or reserved name; 409: the name is taken."""
    who = _operator(ctx, body.reason)
    admin = _admin(ctx.request)

    async def create() -> Any:
        key, record = await admin.create(
            body.tenant_id, body.name or body.tenant_id, body.role, body.expires_in_s, who
        )
        return _created(key, record)

    return await ctx.run(create, is_write=True)


@key_router.post("/{name}/rotate", status_code=201, responses=errors(404, 409))
async def rotate_key(ctx: Context, name: KeyNamePath, body: RotateKey) -> Any:
    """A new key for the same tenant and role (operator keys); the old one keeps working for
    `grace_s`, then is refused. `new_name` defaults to `<name>-<random hex>`."""
    who = _operator(ctx, body.reason)
    admin = _admin(ctx.request)
    new_name = body.new_name or f"{name[: NAME_CHARS_MAX - 9]}-{ctx.api.rng.getrandbits(32):08x}"

    async def rotate() -> Any:
        key, record = await admin.rotate(name, new_name, body.grace_s, who, body.expires_in_s)
        return _created(key, record)

    return await ctx.run(rotate, is_write=True)


@key_router.delete("/{name}", responses=errors(404))
async def revoke_key(
    ctx: Context,
    name: KeyNamePath,
    reason: Annotated[str, Query(min_length=1, max_length=REASON_CHARS_MAX)] = "revoked",
) -> Any:
    """Revoke a key (operator keys): refused at every node from the bound on."""
    who = _operator(ctx, reason)
    admin = _admin(ctx.request)

    async def revoke() -> dict[str, Any]:
        await admin.revoke(name, who)
        return {"name": name, "revoked": True}

    return await ctx.run(revoke, is_write=True)


@key_router.get("")
async def list_keys(ctx: Context) -> Any:
    """Every key: name, tenant, role, source (control shard or cluster file), expiry, state
    (operator or viewer keys; never a key or its hash)."""
    require_role(ctx.tenant, OBSERVER_ROLES)
    admin = _admin(ctx.request)

    async def read() -> dict[str, Any]:
        await admin.read_barrier()
        return {"keys": admin.listing()}

    return await ctx.run(read, is_write=False)

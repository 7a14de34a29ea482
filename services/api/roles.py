"""Roles of API keys: who may do what.

Every key in the cluster file has a role (``regions.keys.Role``; keys written before roles
existed are ``tenant``): ``tenant`` keys are chat applications, ``operator`` keys run drills,
evacuate/restore regions, flip the halt switch and create keys, ``viewer`` keys read regions,
placement, drills, reports and the audit log and change nothing. A key without the role an
endpoint needs gets 403 ``forbidden``.
"""

from __future__ import annotations

from eventlog.errors import Forbidden
from regions.keys import Role
from services.config import TenantConfig

#: endpoints that change the plane's operation
OPERATOR_ROLES: tuple[Role, ...] = ("operator",)
#: endpoints that show it (drills, reports, audit)
OBSERVER_ROLES: tuple[Role, ...] = ("operator", "viewer")
#: methods a viewer key may use anywhere
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def require_role(tenant: TenantConfig, roles: tuple[Role, ...]) -> None:
    if tenant.role not in roles:
        raise Forbidden(f"this endpoint needs a key with role {' or '.join(roles)}")


def require_read_only_viewer(tenant: TenantConfig, method: str) -> None:
    """A viewer key reads; it never writes, on any endpoint."""
    if tenant.role == "viewer" and method.upper() not in READ_METHODS:
        raise Forbidden("a viewer key is read-only")

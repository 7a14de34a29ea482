"""``convplane keys create|rotate|revoke|list``: API keys and their roles.

On a running plane (the default) each command calls ``/v1/admin/keys`` with an operator key
(``--url``/``--key``, or a local plane's ``--state-dir``): the change is a control-shard record
with its audit entry, in effect at every node within ``KEY_APPLIED_WITHIN_S``, no restart.

``keys create --cluster-file F`` instead adds the key to the cluster file, for a plane that is
not running (nodes load the file when they start). It records the creation in the audit log
first (``--audit-url``/``--audit-key``, or the local plane beside the file) unless
``--no-audit``; when that fails, or the name is bad, reserved or taken, nothing is written.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from services.cli.drill import DEFAULT_STATE_DIR, Json, Key, ReasonOpt, StateDir, Url, api_for
from services.cli.output import EXIT_REFUSED, EXIT_USAGE, echo_json, fail

keys_app = typer.Typer(help="API keys and their roles.", no_args_is_help=True)

NameArg = Annotated[str, typer.Argument(help="The key's name.")]
ExpiresOpt = Annotated[
    float | None, typer.Option(help="The key stops working this many seconds from now.")
]


def _print_key(answer: Any) -> None:
    typer.echo(answer["api_key"])  # stdout: the key alone, shown this once
    expiry = answer["expires_at_ms"]
    print(
        f"key {answer['name']}: {answer['role']} of tenant {answer['tenant_id']}, "
        f"{'no expiry' if expiry is None else f'expires at {expiry} ms'}; in effect at every "
        "node within seconds",
        file=sys.stderr,
    )


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="The key's tenant id.")],
    name: Annotated[
        str | None, typer.Option(help="The key's name (default: the tenant id).")
    ] = None,
    role: Annotated[str, typer.Option(help="One of tenant, operator, viewer.")] = "tenant",
    expires_in_s: ExpiresOpt = None,
    reason: ReasonOpt = "new key",
    state_dir: StateDir = Path(".state/plane"),
    url: Url = None,
    key: Key = None,
    cluster_file: Annotated[
        Path | None, typer.Option(help="Add the key to this cluster file instead (plane down).")
    ] = None,
    audit_url: Url = None,
    audit_key: Key = None,
    no_audit: Annotated[
        bool, typer.Option("--no-audit", help="With --cluster-file: add the key unrecorded.")
    ] = False,
) -> None:
    """Create a key and print it (once: only its SHA-256 is kept)."""
    if cluster_file is not None:
        _create_in_file(cluster_file, tenant, name, role, reason, audit_url, audit_key, no_audit)
        return
    body = {
        "tenant_id": tenant,
        "name": name or tenant,
        "role": role,
        "reason": reason,
        "expires_in_s": expires_in_s,
    }
    _print_key(api_for(state_dir, url, key).call("POST", "/v1/admin/keys", body))


@keys_app.command("rotate")
def keys_rotate(
    name: NameArg,
    new_name: Annotated[str | None, typer.Option(help="The new key's name.")] = None,
    grace_s: Annotated[float, typer.Option(help="How long the old key keeps working.")] = 3600.0,
    expires_in_s: ExpiresOpt = None,
    reason: ReasonOpt = "rotation",
    state_dir: StateDir = Path(".state/plane"),
    url: Url = None,
    key: Key = None,
) -> None:
    """A new key for the same tenant and role; the old one stops after --grace-s."""
    body: dict[str, Any] = {"grace_s": grace_s, "reason": reason, "expires_in_s": expires_in_s}
    if new_name:
        body["new_name"] = new_name
    api = api_for(state_dir, url, key)
    _print_key(api.call("POST", f"/v1/admin/keys/{name}/rotate", body))


@keys_app.command("revoke")
def keys_revoke(
    name: NameArg,
    reason: ReasonOpt = "revoked",
    state_dir: StateDir = Path(".state/plane"),
    url: Url = None,
    key: Key = None,
) -> None:
    """Revoke a key: refused at every node within seconds."""
    api = api_for(state_dir, url, key)
    api.call("DELETE", f"/v1/admin/keys/{name}", params={"reason": reason})
    typer.echo(f"key {name} revoked; refused at every node within seconds")


@keys_app.command("list")
def keys_list(
    state_dir: StateDir = DEFAULT_STATE_DIR, url: Url = None, key: Key = None, as_json: Json = False
) -> None:
    """Every key's name, tenant, role, source, expiry and state (never a key)."""
    answer = api_for(state_dir, url, key).call("GET", "/v1/admin/keys")
    if as_json:
        echo_json(answer)
        return
    for k in answer["keys"]:
        state = "revoked" if k.get("revoked") else "live" if k.get("live") else "expired"
        expiry = k.get("expires_at_ms")
        typer.echo(
            f"{k['name']:<24} {k.get('tenant_id') or '-':<16} {k.get('role') or '-':<9} "
            f"{k['source']:<13} {state:<8} "
            f"{'no expiry' if expiry is None else f'expires at {expiry} ms'}"
        )


def _create_in_file(
    cluster_file: Path,
    tenant: str,
    name: str | None,
    role: str,
    reason: str,
    audit_url: str | None,
    audit_key: str | None,
    no_audit: bool,
) -> None:
    from pydantic import ValidationError

    from services.config import TenantConfig, api_key_sha256, load_cluster, write_cluster

    cluster = load_cluster(cluster_file)
    key = "cp_" + secrets.token_urlsafe(24)
    try:
        added = TenantConfig(
            tenant_id=tenant,
            api_key_sha256=api_key_sha256(key),
            role=role,  # type: ignore[arg-type]
            key_name=name,
        )
        updated = cluster.model_copy(update={"tenants": [*cluster.tenants, added]})
        updated = type(cluster).model_validate(updated.model_dump())
    except ValidationError as exc:
        errors = "; ".join(str(e["msg"]) for e in exc.errors())
        raise fail("invalid_request", f"no key added: {errors}", exit_code=EXIT_REFUSED) from exc
    if no_audit:
        print("not recorded in the audit log (--no-audit)", file=sys.stderr)
    else:
        try:
            api = api_for(cluster_file.parent, audit_url, audit_key)
        except typer.Exit:
            raise fail(
                "usage",
                "no key added: nowhere to audit it",
                exit_code=EXIT_USAGE,
                hint="give --audit-url and --audit-key, or --no-audit",
            ) from None
        api.call(
            "POST",
            "/v1/audit",
            {"action": "key.create", "target": f"{tenant} ({role})", "reason": reason},
        )
        print("recorded in the audit log", file=sys.stderr)
    write_cluster(cluster_file, updated)
    typer.echo(key)
    print(
        f"added a {role} key for tenant {tenant} to {cluster_file}; nodes load it when they "
        "start (on a running plane, create keys without --cluster-file)",
        file=sys.stderr,
    )


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")

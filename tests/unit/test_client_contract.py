"""The client copies what it shares with the server (it may not import the server): these
tests hold the copies to the originals."""

from __future__ import annotations

import inspect

import convplane_client
import eventlog.errors
import services.api.errors
from convplane_client import _errors as client_errors
from convplane_client import _headers as client_headers
from eventlog import http_headers


def test_header_names_are_the_servers() -> None:
    for name in ("DEADLINE_HEADER", "SERVED_BY_HEADER", "IDEMPOTENCY_KEY_HEADER",
                 "IDEMPOTENT_REPLAYED_HEADER"):  # fmt: skip
        assert getattr(client_headers, name) == getattr(http_headers, name)


def _server_codes() -> set[str]:
    codes = set()
    for module in (eventlog.errors, services.api.errors):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, eventlog.errors.ConvplaneError):
                codes.add(cls.code)
    return codes


def test_every_error_class_of_the_client_names_a_code_the_server_sends() -> None:
    client_codes = {cls.code for cls in client_errors._BY_CODE.values()}
    # two 409 codes are raised next to the rules that own them (eventlog.conversation_state)
    assert client_codes - _server_codes() <= {"conversation_exists", "unknown_attempt"}
    assert "outcome_unknown" in client_codes and "no_quorum" in client_codes


def test_the_public_api_is_what_init_exports() -> None:
    for name in convplane_client.__all__:
        assert hasattr(convplane_client, name), name

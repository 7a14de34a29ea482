"""The HTTP edge of a region node: the REST routes, their schemas and errors, admission,
authentication and roles, forwarding to the leader's region, and the OpenAPI document.

The edge is built on the core (``services.control``, ``services.replay``)
and never the reverse; the app itself is assembled in ``services.bootstrap.app``
(``create_app(settings)``).

Where a change goes: a new endpoint in a ``*_routes`` module here (its schema in ``schemas`` or
``control_schemas``, its errors in the OpenAPI document: ``tests/e2e/test_openapi_contract.py``
checks both), included by ``services.bootstrap.app``.
"""

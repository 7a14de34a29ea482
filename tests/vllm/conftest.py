"""The real-vLLM tier's servers: one well and one badly configured vLLM (CPU build), each
started once per session. Building the environment or starting a server that fails makes the
tests that need it fail with the reason (never skip): ``make vllm-env`` prepares it ahead."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.vllm.servers import BADLY_CONFIGURED, WELL_CONFIGURED, VllmServer, vllm_server


@pytest.fixture(scope="session")
def well_configured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    with vllm_server(tmp_path_factory.mktemp("vllm"), "well", WELL_CONFIGURED) as server:
        print(f"\nvLLM (well configured) healthy in {server.start_duration_s:.0f}s")
        yield server


@pytest.fixture(scope="session")
def badly_configured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    with vllm_server(tmp_path_factory.mktemp("vllm"), "bad", BADLY_CONFIGURED) as server:
        print(f"\nvLLM (badly configured) healthy in {server.start_duration_s:.0f}s")
        yield server

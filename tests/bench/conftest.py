"""Shared fixtures of the HTTP benchmark tests: a real reference server on a loopback port."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ddtree.bench.http_client import wait_for_health
from ddtree.bench.schema import ServerSpec
from ddtree.bench.session import ServerProcess, free_port, server_command, start_server, stop_server


@contextlib.contextmanager
def _reference_server(pair: Path, method: str, log: Path) -> Iterator[ServerProcess]:
    port = free_port()
    srv = start_server(server_command(ServerSpec(model=str(pair), method=method, budget=16), "127.0.0.1", port),
                       log, port=port)
    try:
        wait_for_health(srv.url, 180, process=srv.process, log_path=log)
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="session")
def reference_server() -> Callable[[Path, str, Path], contextlib.AbstractContextManager[ServerProcess]]:
    """`with reference_server(pair, method, log) as srv:` a healthy `ddtree serve` (budget 16), always stopped."""
    return _reference_server


@pytest.fixture(scope="module")
def prompts(tiny_pair: Path) -> Path:
    return tiny_pair / "prompts" / "heldout.jsonl"

"""Suite-wide guards."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest

from common import settings_loader

pytest_plugins = ["tests.support.prometheus"]


@pytest.fixture(autouse=True)
def _no_settings_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's exported GPU_STEWARD_* must not configure the code under test (settings_loader.load()
    reads the environment; a test that wants a variable sets it itself)."""
    for key in list(os.environ):
        if key.upper().startswith(settings_loader.ENV_PREFIX):
            monkeypatch.delenv(key)


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks running: a leaked task outlives its test and hides bugs.

    Autouse fixtures are set up first and torn down last, so the test's other fixtures have cleaned
    up by the time this looks. Leaked tasks are cancelled and awaited here, so the loop closes cleanly.
    """
    before = asyncio.all_tasks()
    yield
    leaked = asyncio.all_tasks() - before - {asyncio.current_task()}
    if leaked:
        for task in leaked:
            task.cancel()
        await asyncio.gather(*leaked, return_exceptions=True)
        pytest.fail(f"test leaked {len(leaked)} asyncio task(s): {sorted(t.get_name() for t in leaked)}")

"""A `gpu-steward` process in an integration test: started from this checkout, waited on over HTTP, and
killed at the end of the `with` if the test did not stop it.

    process = await processes.spawn("descheduler", "--cluster", str(STATE), "--metrics-port", str(port))
    with processes.reaped(process):
        await processes.wait_until_ok(session, f"http://127.0.0.1:{port}/readyz", process)
        seconds, log = await processes.terminate(process)
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import signal
import sys
import time
from collections.abc import Iterator

import aiohttp

REPO = pathlib.Path(__file__).resolve().parents[2]
# Importing the Kubernetes client alone takes seconds on a busy 2-core machine.
START_SECONDS = 60


async def spawn(*args: str) -> asyncio.subprocess.Process:
    """`python -m gpu_steward ARGS...` in the repository, its stdout and stderr on pipes."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpu_steward", *args,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


@contextlib.contextmanager
def reaped(process: asyncio.subprocess.Process) -> Iterator[asyncio.subprocess.Process]:
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()


async def wait_until_ok(session: aiohttp.ClientSession, url: str, process: asyncio.subprocess.Process) -> None:
    """GET `url` until it answers 200; fails if the process exits first or `START_SECONDS` pass."""
    async with asyncio.timeout(START_SECONDS):
        while process.returncode is None:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise AssertionError(f"{url}: the process exited with {process.returncode} before answering 200")


async def terminate(process: asyncio.subprocess.Process) -> tuple[float, str]:
    """SIGTERM, then wait (at most 15 s) for the exit: the seconds it took to exit, and its stderr."""
    process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=15)
    return time.monotonic() - signalled, stderr.decode()

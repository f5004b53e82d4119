"""A private asyncio loop on its own thread for every backend call the console makes.

`backend` has a few synchronous calls inside async functions (the Chroma
heartbeat in `ops.status`, the chromadb client). Running them on Textual's
loop would freeze keys and mouse for as long as a hung Chroma takes to time
out, so the console hands every backend coroutine to this loop and awaits the
result. All aiosqlite connections the console opens live here too, which
keeps them (and `Database`'s asyncio lock) bound to one loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackendLoop:
    """One daemon thread running one asyncio loop until `stop()`."""

    def __init__(self, name: str = "rem-console-backend") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False
        self._stopping = False

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def start(self) -> BackendLoop:
        if not self._started:
            self._thread.start()
            self._started = True
        return self

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the backend loop; cancelling the caller cancels it there too."""
        if self._stopping:
            coro.close()  # never started: close it rather than leave it un-awaited
            raise asyncio.CancelledError("the console is shutting down")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return await asyncio.wrap_future(future)

    def run_blocking(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        """Block the calling thread on `coro` (shutdown only, never from the UI loop)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _cancel_all(self) -> None:
        await asyncio.sleep(0)  # let coroutines submitted just now become tasks first
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel whatever is still running there, then stop the loop and its thread."""
        self._stopping = True
        if not self._started:
            self._loop.close()
            return
        if self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._cancel_all(), self._loop).result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()

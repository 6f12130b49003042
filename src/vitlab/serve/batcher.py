"""Dynamic batching: requests that arrive together are classified together.

The first waiting request opens a batch; the batch closes when it holds `max_batch` requests, when `max_wait_ms`
have passed, or at once when no other request is on its way (`more_coming`, e.g. requests still being read or
decoded: a lone client must not wait for company that cannot come), and runs on the inference thread, off the
event loop, while the next batch fills. Each request waits
on its own future, which only its own row of the result settles, so an answer never carries another request's
result. A request whose client left before its batch ran is dropped from the batch.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any


class DynamicBatcher:
    def __init__(
        self,
        run_batch: Callable[[Sequence[Any]], Sequence[Any]],
        max_batch: int,
        max_wait_ms: float,
        executor: concurrent.futures.Executor,
        on_batch: Callable[[int, float], None] | None = None,
        more_coming: Callable[[], bool] | None = None,
    ) -> None:
        """run_batch(items) -> one result per item, called on `executor`; on_batch(size, seconds) after each;
        more_coming() -> whether requests not yet submitted are under way (None: always wait the full time)."""
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError("max_batch must be >= 1 and max_wait_ms >= 0")
        self.run_batch, self.max_batch, self.max_wait = run_batch, max_batch, max_wait_ms / 1000
        self.executor, self.on_batch = executor, on_batch
        self.more_coming = more_coming or (lambda: True)
        self.pending: collections.deque[tuple[Any, asyncio.Future]] = collections.deque()
        self.wakeup = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.stopping = False

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name="vitlab-batcher")

    async def stop(self) -> None:
        """Finish what is queued, then end."""
        self.stopping = True
        self.wakeup.set()
        if self.task is not None:
            await self.task

    async def submit(self, item: Any) -> Any:
        if self.stopping:
            raise RuntimeError("the server is shutting down")
        future = asyncio.get_running_loop().create_future()
        self.pending.append((item, future))
        self.wakeup.set()
        return await future

    async def _wait(self, timeout: float | None) -> bool:
        """Until a request arrives (True) or `timeout` seconds pass (False). Waiting on an Event, unlike on a
        queue's get, loses nothing when the timeout cancels it."""
        self.wakeup.clear()
        try:
            await asyncio.wait_for(self.wakeup.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.pending:
                if self.stopping:
                    return
                await self._wait(None)
                continue
            deadline = loop.time() + self.max_wait
            while len(self.pending) < self.max_batch and not self.stopping and self.more_coming():
                left = deadline - loop.time()
                if left <= 0 or not await self._wait(left):
                    break
            batch = [self.pending.popleft() for _ in range(min(self.max_batch, len(self.pending)))]
            batch = [(item, future) for item, future in batch if not future.done()]  # done: its client left
            if not batch:
                continue
            started = loop.time()
            try:
                results = await loop.run_in_executor(self.executor, self.run_batch, [item for item, _ in batch])
            except Exception as error:  # noqa: BLE001 - every waiting request learns of the failure
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            if self.on_batch is not None:
                self.on_batch(len(batch), loop.time() - started)
            for (_, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)

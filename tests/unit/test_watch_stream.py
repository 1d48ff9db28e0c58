"""A watch's connection is read by a thread (:func:`queue_processor.rest.read_watch`): however early its reader
closes it, the connection is shut and the thread ends, even when the server's answer comes after the close."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from queue_processor.kube import KubeClient


class QuietAnswer:
    """A watch's answer with no event yet: its stream blocks until the connection is shut or closed."""

    status = 200
    data = b""

    def __init__(self) -> None:
        self.ended = threading.Event()

    def stream(self, size: int) -> Any:
        self.ended.wait()
        return iter(())

    def shutdown(self) -> None:
        self.ended.set()

    def close(self) -> None:
        self.ended.set()


class SlowServer:
    """An ApiClient whose answer comes only once the test lets it (:attr:`answer`)."""

    user_agent = "tests"

    def __init__(self) -> None:
        self.connecting, self.answer, self.response = threading.Event(), threading.Event(), QuietAnswer()

    def param_serialize(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        return ("GET", "/api/v1/pods", {}, None, None)

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        self.connecting.set()
        self.answer.wait()
        return type("Answered", (), {"response": self.response})()


async def test_a_watch_closed_while_it_connects_shuts_the_answer_that_comes_after() -> None:
    server = SlowServer()
    kube = KubeClient(server, qps=100, burst=100)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()

    async def read() -> None:
        async with contextlib.aclosing(kube.watch("/api/v1/pods", "1", timeout_s=60)) as chunks:
            async for _ in chunks:
                pass

    reading = asyncio.create_task(read())
    assert await loop.run_in_executor(None, server.connecting.wait, 30)  # a hang guard, it measures nothing
    reading.cancel()  # the watcher stops while the connection is being made
    await asyncio.gather(reading, return_exceptions=True)
    server.answer.set()
    assert await loop.run_in_executor(None, server.response.ended.wait, 30)  # shut, not read until it ends
    kube.close(wait=False)

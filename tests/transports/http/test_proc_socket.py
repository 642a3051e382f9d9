"""transports/http/proc_socket.py: one proc/* client over a WebSocket, driven here through an
in-memory ASGI channel (the server's side of the socket) over a real supervisor and handler."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from starlette.types import Message
from starlette.websockets import WebSocket

from procpilot.config import load_settings
from procpilot.engine.supervisor import Supervisor
from procpilot.transports.http.proc_socket import ProcConnection
from procpilot.transports.serve import make_supervisor, proc_handler_factory
from tests.daemon import TOKENS, daemon_env, write_config


@pytest.fixture
async def supervisor(tmp_path: Path) -> AsyncIterator[Supervisor]:
    settings = load_settings(write_config(tmp_path, TOKENS), env=daemon_env(tmp_path))
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    async with make_supervisor(settings) as sup:
        yield sup


class Client:
    """The far end of the socket: frames it sends, frames it has been sent."""

    def __init__(self) -> None:
        self.to_server: asyncio.Queue[Message] = asyncio.Queue()
        self.to_client: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.to_server.put_nowait({"type": "websocket.connect"})
        # Set: a frame's send blocks until release, and goes on blocking a while after it is
        # cancelled (a socket flushing as it closes): `stuck` says one is in there, `told` that
        # it has been cancelled.
        self.hold = False
        self.stuck, self.told, self.release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def receive(self) -> Message:
        return await self.to_server.get()

    async def send(self, message: Message) -> None:
        if message["type"] == "websocket.send" and self.hold:
            self.stuck.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.told.set()
                await self.release.wait()
                raise
        if message["type"] == "websocket.send":
            self.to_client.put_nowait(json.loads(message["text"]))

    def request(self, message: dict[str, Any]) -> None:
        self.to_server.put_nowait({"type": "websocket.receive", "text": json.dumps(message)})

    async def until(self, kind: str) -> list[dict[str, Any]]:
        seen = [await asyncio.wait_for(self.to_client.get(), 30)]
        while seen[-1]["type"] != kind:
            seen.append(await asyncio.wait_for(self.to_client.get(), 30))
        return seen


async def test_a_spawn_streams_its_output_and_exit_then_the_client_leaves(supervisor: Supervisor) -> None:
    client = Client()
    ws = WebSocket({"type": "websocket", "path": "/v1/proc", "headers": []}, client.receive, client.send)
    await ws.accept()
    handler = proc_handler_factory()(supervisor, "agent-a")
    connection = ProcConnection(ws, supervisor, "agent-a", handler)
    closing = asyncio.Event()
    running = asyncio.ensure_future(connection.run(closing))

    client.request({"type": "proc/spawn/req", "id": "1", "cmd": ["sh", "-c", "echo hi"]})
    seen = await client.until("proc/exit/event")
    spawned = next(m for m in seen if m["type"] == "proc/spawn/resp")
    assert spawned["id"] == "1" and spawned["proc_id"]
    output = "".join(m["data"] for m in seen if m["type"] == "proc/read/event")
    assert output == "hi\n"  # pushed live, before the exit (the connection's ordering promise)
    assert seen[-1]["proc_id"] == spawned["proc_id"] and seen[-1]["exit_code"] == 0

    client.request({"type": "proc/nonsense", "id": "2"})
    error = (await client.until("proc/error"))[-1]
    assert error["id"] == "2" and error["error"]["code"]

    client.to_server.put_nowait({"type": "websocket.disconnect", "code": 1000})
    await asyncio.wait_for(running, 30)  # the client left: the connection ends, its tasks with it
    assert not connection.tasks and not connection.outbox


async def test_a_connection_cancelled_while_it_ends_its_tasks_ends_cancelled(supervisor: Supervisor) -> None:
    """The client left; the connection cancels its writer, which takes a while to stop. A
    cancellation of the connection itself meanwhile is not mistaken for the writer's."""
    client = Client()
    ws = WebSocket({"type": "websocket", "path": "/v1/proc", "headers": []}, client.receive, client.send)
    await ws.accept()
    connection = ProcConnection(ws, supervisor, "agent-a", proc_handler_factory()(supervisor, "agent-a"))
    running = asyncio.ensure_future(connection.run(asyncio.Event()))
    client.hold = True
    client.request({"type": "proc/spawn/req", "id": "1", "cmd": ["true"]})
    await client.stuck.wait()  # the writer is sending the answer
    client.to_server.put_nowait({"type": "websocket.disconnect", "code": 1000})
    await client.told.wait()  # the connection has cancelled its writer and waits for it to end
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    client.release.set()

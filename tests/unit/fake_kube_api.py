"""A fake Kubernetes API server on loopback that speaks LIST and WATCH of the pods of one namespace, the
way the real one answers (apimachinery's watch protocol: a chunked stream of JSON lines `{"type": ADDED |
MODIFIED | DELETED | ERROR, "object": ...}`; an expired resourceVersion is an ERROR event carrying a
Status with code 410, `staging/src/k8s.io/apiserver/pkg/endpoints/handlers/watch.go` and
`apimachinery/pkg/api/errors` `NewResourceExpired`). Each response closes its connection, so every
request the client makes is seen here (`requests`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

Json = dict[str, Any]


def pod(name: str, ip: str | None = "10.1.0.7", phase: str = "Running") -> Json:
    status: Json = {"phase": phase}
    if ip is not None:
        status["podIP"] = ip
    return {
        "metadata": {"name": name, "namespace": "inference", "labels": {"app": "sglang"}},
        "status": status,
    }


def _status(code: int, reason: str, message: str) -> Json:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FakeKubeApi:
    def __init__(self, namespace: str = "inference") -> None:
        self.namespace = namespace
        self.pods: dict[str, Json] = {}
        self.version = 100
        self.requests: list[tuple[str, dict[str, str]]] = []  # ("list" | "watch", query)
        self.authorizations: list[str] = []  # the Authorization header of each request
        self.refuse: int | None = None  # answer every request with this status (403: no RBAC)
        self._watchers: list[asyncio.Queue[Json | None]] = []
        self._watch_opened = asyncio.Event()
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.url = ""

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[FakeKubeApi]:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        try:
            yield self
        finally:
            self._server.close()
            for queue in self._watchers:
                queue.put_nowait(None)
            await asyncio.gather(*self._handlers, return_exceptions=True)  # every open stream ended
            await self._server.wait_closed()

    # -- what the cluster does -----------------------------------------------------------------------

    def put(self, item: Json, *, announce: bool = True) -> None:
        """Create or change a pod; watchers see ADDED or MODIFIED unless `announce` is False (a change
        made while no watch ran, or one the server compacted away)."""
        name = item["metadata"]["name"]
        change = "MODIFIED" if name in self.pods else "ADDED"
        self.pods[name] = self._versioned(item)
        if announce:
            self._send({"type": change, "object": self.pods[name]})

    def delete(self, name: str, *, announce: bool = True) -> None:
        gone = self.pods.pop(name)
        if announce:
            self._send({"type": "DELETED", "object": self._versioned(gone)})

    def expire_watches(self) -> None:
        """The watched resourceVersion is too old now: every open watch gets a 410 and ends."""
        self._send(
            {"type": "ERROR", "object": _status(410, "Expired", "too old resource version: 101 (180)")}
        )
        for queue in self._watchers:
            queue.put_nowait(None)

    async def wait_watching(self) -> None:
        """Until a watch request is open (changes made before it would be in its listing anyway)."""
        await self._watch_opened.wait()

    def _versioned(self, item: Json) -> Json:
        self.version += 1
        return {**item, "metadata": {**item["metadata"], "resourceVersion": str(self.version)}}

    def _send(self, event: Json) -> None:
        for queue in self._watchers:
            queue.put_nowait(event)

    # -- HTTP -----------------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            target = head.split(" ", 2)[1]
            headers = dict(line.split(": ", 1) for line in head.split("\r\n")[1:] if ": " in line)
            self.authorizations.append({k.lower(): v for k, v in headers.items()}.get("authorization", ""))
            parts = urlsplit(target)
            query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
            expected = f"/api/v1/namespaces/{self.namespace}/pods"
            watch = query.get("watch") in ("true", "1")
            self.requests.append(("watch" if watch else "list", query))
            if parts.path != expected:
                await self._answer(writer, 404, _status(404, "NotFound", f"{parts.path} not found"))
            elif self.refuse is not None:
                user = "system:serviceaccount:warmer:warmer"
                message = f'pods is forbidden: User "{user}" cannot list "pods" in "{self.namespace}"'
                await self._answer(writer, self.refuse, _status(self.refuse, "Forbidden", message))
            elif watch:
                await self._stream(writer)
            else:
                items = list(self.pods.values())
                body = {
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self.version)},
                }
                await self._answer(writer, 200, {**body, "items": items})
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, writer: asyncio.StreamWriter, code: int, body: Json) -> None:
        data = json.dumps(body).encode()
        writer.write(
            f"HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()

    async def _stream(self, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[Json | None] = asyncio.Queue()
        self._watchers.append(queue)
        self._watch_opened.set()
        try:
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: close\r\n\r\n"
            )
            await writer.drain()
            while (event := await queue.get()) is not None:
                line = json.dumps(event).encode() + b"\n"
                writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        finally:
            self._watchers.remove(queue)

"""The ASGI app of one sim process: boxes under `/box/{index}`, the control routes under `/_sim`.

Engine routes: `{base_url}/<engine path>` with `base_url = http://HOST:PORT/box/{index}`; every request is
counted per box and route before it is answered (a box that is down still counts what reached it).

Control routes (never counted as engine traffic):
- GET  /_sim/fleet                       the boxes' ids and base URLs, the engine kind, the box config
- GET  /_sim/stats                       requests per box by class (control/work/tokenize) and in total
- GET  /_sim/box/{index}                 one box's state: epoch, restarts, cache contents, requests by route
- POST /_sim/box/{index}/restart         {"down_seconds": s}: a new process (empty cache, new epoch)
- POST /_sim/restart                     {"boxes": [index, ...], "down_seconds": s}: many at once
- POST /_sim/box/{index}/health          {"mode": "ok" | "slow" | "fail", "delay_seconds": s}
- POST /_sim/health                      {"boxes": [index, ...], "mode": ..., "delay_seconds": s}
- POST /_sim/box/{index}/lookup          {"tokens": [...]} or {"text": "..."}: leading tokens held
                                         (no effect on recency), for tests that ask "is it cached?"

A plain ASGI callable, no framework: thousands of boxes polled every few seconds make the per-request
overhead the sim's whole cost.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from testbed.simfleet.box import BoxConfig, HealthMode, SimBox
from testbed.simfleet.engines import NOT_FOUND, EngineRoutes, Reply
from testbed.simfleet.tokens import SimTokenizer

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class SimFleetApp:
    """Boxes `first .. first + count - 1` of a fleet, all of one engine kind and config."""

    def __init__(
        self,
        config: BoxConfig,
        *,
        count: int,
        first: int = 0,
        id_prefix: str = "sim-",
        base_url: str = "http://127.0.0.1:0",
        tokenizer: SimTokenizer | None = None,
    ) -> None:
        if count < 1 or first < 0:
            raise ValueError("count must be >= 1 and first >= 0")
        self.config = config
        self.first = first
        self.id_prefix = id_prefix
        self.base_url = base_url.rstrip("/")
        self.boxes = {i: SimBox(i, f"{id_prefix}{i}", config) for i in range(first, first + count)}
        self.engine = EngineRoutes(config.engine, tokenizer or SimTokenizer())

    def box_url(self, index: int) -> str:
        return f"{self.base_url}/box/{index}"

    def fleet(self) -> dict[str, Any]:
        return {
            "engine": self.config.engine.value,
            "model": self.config.model,
            "slots": self.config.slots,
            "boxes": [{"id": box.box_id, "base_url": self.box_url(i)} for i, box in self.boxes.items()],
        }

    def stats(self) -> dict[str, Any]:
        per_box = {box.box_id: box.class_counts() for box in self.boxes.values()}
        totals: Counter[str] = Counter()
        routes: Counter[str] = Counter()
        for box in self.boxes.values():
            routes.update(box.routes)
        for counts in per_box.values():
            totals.update(counts)
        restarts = sum(box.restarts for box in self.boxes.values())
        return {"boxes": per_box, "totals": dict(totals), "routes": dict(routes), "restarts": restarts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await _read_body(receive)
        reply = await self.dispatch(scope["method"], scope["path"], body, _headers(scope))
        await send(
            {
                "type": "http.response.start",
                "status": reply.status,
                "headers": [
                    (b"content-type", reply.content_type.encode()),
                    (b"content-length", str(len(reply.body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": reply.body})

    async def dispatch(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Reply:
        if path.startswith("/box/"):
            index_text, _, rest = path[5:].partition("/")
            box = self._box(index_text)
            if box is None:
                return NOT_FOUND
            route = "/" + rest
            box.count(method, route)
            return await self.engine.answer(box, method, route, body, headers)
        if path.startswith("/_sim/"):
            try:
                return self._control(method, path[6:].split("/"), json.loads(body) if body else {})
            except (ValueError, TypeError, KeyError) as exc:
                return Reply.json({"error": f"bad control request: {exc}"}, 400)
        return NOT_FOUND

    def _box(self, index_text: str) -> SimBox | None:
        return self.boxes.get(int(index_text)) if index_text.isdigit() else None

    def _control(self, method: str, parts: list[str], body: dict[str, Any]) -> Reply:
        if method == "GET" and parts == ["fleet"]:
            return Reply.json(self.fleet())
        if method == "GET" and parts == ["stats"]:
            return Reply.json(self.stats())
        if method == "POST" and parts in (["restart"], ["health"]):
            targets = [self._known(i) for i in body["boxes"]]  # all checked before any is touched
            for target in targets:
                self._act(target, parts[0], body)
            return Reply.json({"boxes": [target.box_id for target in targets]})
        if len(parts) >= 2 and parts[0] == "box":
            box = self._box(parts[1])
            if box is None:
                return Reply.json({"error": f"no box {parts[1]!r} in this process"}, 404)
            if method == "GET" and len(parts) == 2:
                return Reply.json(box.state())
            if method == "POST" and len(parts) == 3 and parts[2] in ("restart", "health"):
                self._act(box, parts[2], body)
                return Reply.json(box.state())
            if method == "POST" and parts[2:] == ["lookup"]:
                return Reply.json({"cached_tokens": box.cache.peek(self._lookup_ids(body))})
        return NOT_FOUND

    def _known(self, index: object) -> SimBox:
        box = self.boxes.get(index) if isinstance(index, int) else None
        if box is None:
            raise KeyError(f"no box {index!r} in this process")
        return box

    def _act(self, box: SimBox, action: str, body: dict[str, Any]) -> None:
        if action == "restart":
            box.restart(down_seconds=float(body.get("down_seconds", 0.0)))
        else:
            box.health = HealthMode(body.get("mode", "ok"))
            box.health_delay_seconds = float(body.get("delay_seconds", 0.0))

    def _lookup_ids(self, body: dict[str, Any]) -> list[int]:
        if isinstance(body.get("text"), str):
            return self.engine.tokenizer.encode(body["text"], add_special=True)
        tokens = body["tokens"]
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise ValueError("'tokens' must be a list of token ids")
        return tokens


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _headers(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope.get("headers", [])}


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return

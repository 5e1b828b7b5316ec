"""GatewayPort for the SGLang router / SGLang Model Gateway: warm boxes in as workers, cold ones out.

Two worker APIs exist (sgl-project/sglang, `sgl-router/src/server.rs`):

- current (`workers`): `POST /workers` with `{"url": ...}` answers 202 and adds the worker in the
  background (the gateway first probes the worker); `GET /workers` lists
  `{"workers": [{"id", "url", "is_healthy", ...}], ...}`; `DELETE /workers/{id}` removes one.
  sglang-router 0.3.2 (the wheel we test against) takes the worker's UUID `id` there and answers 400
  for anything else; earlier gateways took the URL-encoded worker URL, which is used when the
  listing carries no `id`.
- older (`legacy`): `POST /add_worker?url=...`, `POST /remove_worker?url=...`,
  `GET /list_workers` -> `{"urls": [...]}`. 0.3.2 no longer serves these (404).

What 0.3.2 asks of a worker before it takes it (seen against the real wheel): `GET /health` must
answer 200 (its periodic health check uses the same path); it then tries `/server_info`,
`/get_server_info`, `/model_info`, `/get_model_info` for metadata, and a 404 on all of them is
fine (the worker's model is then "unknown"). A llama-server box therefore qualifies as is once its
model is loaded (its `/health` is 503 while loading). Adding a URL that is already a worker is
accepted with 202 and then fails in the background, so `register` checks the listing first.
An add whose worker is unreachable keeps being retried by the router in the background: it can
still land after `register` gave up with a GatewayError. Callers must therefore treat `registered()`
as the truth on every pass and deregister any listed box they do not consider ready.

The SGLang Model Gateway (smg, lightseekorg/smg @ 73da68ca9472bbc0ff5f63d31a8a21fbb8696359) answers a
duplicate `POST /workers` with 409 `WORKER_ALREADY_EXISTS` (model_gateway/src/worker/service.rs
`WorkerServiceError::Conflict`): that is success here (the worker is there; the listing confirms it).
Its worker spec takes `runtime_type` (crates/protocols/src/worker.rs `RuntimeType`: sglang, vllm, trtllm,
mlx, tokenspeed, external; lowercase), defaulting to sglang for a local worker it cannot classify
(workflow/steps/local/create_worker.rs). SGLang and vLLM boxes are registered with their runtime; a
llama.cpp or generic box gets none, because no runtime value names llama-server, and an unknown value
would fail the request. sglang-router 0.3.2 ignores the field (measured: any value is accepted with 202
and not listed), so sending it is harmless there.

Listed is not routed. A worker stays listed while the gateway will not send it traffic: sglang-router 0.3.2
keeps a worker whose health checks fail with `"is_healthy": false` (measured: it has no
`--remove-unhealthy-workers` option; its `GET /workers` entry carries `id`, `url`, `is_healthy`, `load`,
... and no status), and smg keeps a worker whose status went Failed (terminal unless it runs
`--remove-unhealthy-workers`); smg's `WorkerInfo` (crates/protocols/src/worker.rs
@ 006b681ef9f022f095e4be594922ba788b153045) carries `is_healthy` and a `job_status` whose `status` is
"pending", "processing" or "failed". `listing()` reports each listed URL with whether the gateway can use
it (`usable_entry`): not `is_healthy: false`, no `status` other than ready/healthy/active, no failed job.
`register` replaces an unusable registration (remove, then add) instead of taking "listed" for done, and
waits until the new one is listed usable.

How a cold box is kept out. Both gateways health-check their workers themselves and send traffic again
to a worker whose `/health` passes again, so a box that restarts while still registered would be
re-admitted cold, before warmer re-warms it (measured against 0.3.2: a registered llama-server that is
stopped and started again gets the router's traffic back with no call from warmer). Warmer therefore
never leaves a box registered through a restart: gateway sync (warmer.service.fleet.gateway_sync) removes a
box as soon as it stops being ready (unhealthy, new epoch, not verified warm), and adds it back only once
its current epoch is verified warm. The window left open is a restart faster than one health poll of the
reconciler, bounded by its poll interval: the next poll sees the new epoch (server fingerprint, counters)
and the box is withdrawn. Warm requests go straight to the box, so a cache-aware router policy's own
prefix tree does not know about them (HTTP workers); warmer's own routes carry the prefix affinity.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Literal
from urllib.parse import quote

import httpx

from warmer.core.errors import GatewayError
from warmer.core.model import BoxSpec, EngineKind

ApiStyle = Literal["workers", "legacy", "auto"]


# smg `RuntimeType` values for the engines that have one (see the module docstring).
RUNTIME_TYPES: dict[EngineKind, str] = {EngineKind.SGLANG: "sglang", EngineKind.VLLM: "vllm"}


def _same_url(url: str) -> str:
    return url.strip().rstrip("/")


_USABLE_STATUSES = frozenset({"ready", "healthy", "active"})


def usable_entry(entry: dict[str, object]) -> bool:
    """Whether the gateway routes to this listed worker (see the module docstring); an entry that says
    nothing (the legacy listing) is taken as usable."""
    if entry.get("is_healthy") is False:
        return False
    status = entry.get("status")
    if isinstance(status, str) and status.strip().lower() not in _USABLE_STATUSES:
        return False
    job = entry.get("job_status")
    return not (isinstance(job, dict) and str(job.get("status", "")).lower() == "failed")


class SglangRouterGateway:
    """Registers boxes with an SGLang router over an injected client; waits until the change shows.

    `api_style="auto"` uses `/workers` and falls back to the legacy endpoints when the router
    answers 404 there. `settle_timeout` bounds the wait for a background add/remove to appear in
    the listing; a box that never appears (e.g. the router cannot reach its /health) is a
    GatewayError rather than a silent success.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        *,
        api_style: ApiStyle = "auto",
        api_key: str | None = None,
        request_timeout: float = 5.0,
        settle_timeout: float = 30.0,
        poll_interval: float = 0.2,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._base = _same_url(base_url)
        self._style: ApiStyle = api_style
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = request_timeout
        self._settle_timeout = settle_timeout
        self._poll_interval = poll_interval
        self._sleep = sleep
        self._monotonic = monotonic

    @property
    def api_style(self) -> ApiStyle:
        """The API in use; `auto` until the first call has found out."""
        return self._style

    async def _request(self, method: str, path: str, **kwargs: object) -> httpx.Response:
        url = f"{self._base}{path}"
        try:
            return await self._client.request(
                method,
                url,
                headers=self._headers,
                timeout=self._timeout,
                **kwargs,  # type: ignore[arg-type]
            )
        except httpx.HTTPError as exc:
            raise GatewayError(
                f"gateway {method} {path}: {type(exc).__name__}: {exc}", transient=True
            ) from exc

    @staticmethod
    def _fail(response: httpx.Response, what: str) -> GatewayError:
        body = response.text[:300]
        transient = response.status_code >= 500 or response.status_code == 429
        return GatewayError(f"gateway {what}: HTTP {response.status_code}: {body}", transient=transient)

    async def _workers(self) -> list[dict[str, object]]:
        """The router's worker entries, as `{"url": ..., "id": ...?}`; settles the API style."""
        if self._style in ("workers", "auto"):
            response = await self._request("GET", "/workers")
            if response.status_code == 404 and self._style == "auto":
                self._style = "legacy"
            elif response.status_code != 200:
                raise self._fail(response, "list workers")
            else:
                if self._style == "auto":
                    self._style = "workers"
                return self._parse_workers(response)
        response = await self._request("GET", "/list_workers")
        if response.status_code != 200:
            raise self._fail(response, "list workers (legacy)")
        try:
            urls = response.json()["urls"]
        except (ValueError, KeyError, TypeError) as exc:
            raise GatewayError(f"gateway /list_workers answered an unexpected body: {exc}") from exc
        if not isinstance(urls, list):
            raise GatewayError("gateway /list_workers: `urls` is not a list")
        return [{"url": str(url)} for url in urls]

    @staticmethod
    def _parse_workers(response: httpx.Response) -> list[dict[str, object]]:
        try:
            entries = response.json()["workers"]
        except (ValueError, KeyError, TypeError) as exc:
            raise GatewayError(f"gateway /workers answered an unexpected body: {exc}") from exc
        if not isinstance(entries, list):
            raise GatewayError("gateway /workers: `workers` is not a list")
        out: list[dict[str, object]] = []
        for entry in entries:
            if isinstance(entry, dict) and isinstance(entry.get("url"), str):
                out.append(entry)
        return out

    async def registered(self) -> set[str]:
        """Base URLs (no trailing slash) the router lists, usable or not."""
        return set(await self.listing())

    async def listing(self) -> dict[str, bool]:
        """Each listed base URL (no trailing slash) and whether the router can route to it; a URL listed
        twice is usable when one of its entries is."""
        out: dict[str, bool] = {}
        for entry in await self._workers():
            url = _same_url(str(entry["url"]))
            out[url] = out.get(url, False) or usable_entry(entry)
        return out

    async def _settle(self, url: str, *, present: bool) -> None:
        """Until the URL is listed usable (present) or not listed at all."""
        deadline = self._monotonic() + self._settle_timeout
        while True:
            listed = await self.listing()
            if (listed.get(url) is True) if present else (url not in listed):
                return
            if self._monotonic() >= deadline:
                state = "appear in" if present else "leave"
                raise GatewayError(
                    f"gateway: worker {url} did not {state} the worker list "
                    f"within {self._settle_timeout:.0f}s",
                    transient=True,
                )
            await self._sleep(self._poll_interval)

    async def register(self, box: BoxSpec) -> None:
        """Make `box` a worker; returns once the router lists it usable. Already a usable worker: nothing
        to do; listed but unusable (unhealthy, Failed): the registration is replaced."""
        url = _same_url(box.base_url)
        usable = (await self.listing()).get(url)
        if usable is True:
            return
        if usable is False:
            await self.deregister(box)
        if self._style == "legacy":
            response = await self._request("POST", "/add_worker", params={"url": url})
            if response.status_code != 200:
                raise self._fail(response, f"add worker {url} (legacy)")
        else:
            body: dict[str, str] = {"url": url}
            runtime = RUNTIME_TYPES.get(box.engine)
            if runtime is not None:
                body["runtime_type"] = runtime
            response = await self._request("POST", "/workers", json=body)
            # 409: smg already has a worker at this URL (e.g. added by an earlier pass whose listing
            # had not shown it yet): success, confirmed by the listing below.
            if response.status_code not in (200, 201, 202, 409):
                raise self._fail(response, f"add worker {url}")
        await self._settle(url, present=True)

    async def deregister(self, box: BoxSpec) -> None:
        """Stop routing to `box`; returns once the router no longer lists it. Not a worker: no-op."""
        url = _same_url(box.base_url)
        entries = [entry for entry in await self._workers() if _same_url(str(entry["url"])) == url]
        if not entries:
            return
        if self._style == "legacy":
            response = await self._request("POST", "/remove_worker", params={"url": url})
            if response.status_code != 200:
                raise self._fail(response, f"remove worker {url} (legacy)")
        else:
            for entry in entries:
                worker_id = entry.get("id")
                key = str(worker_id) if isinstance(worker_id, str) and worker_id else quote(url, safe="")
                response = await self._request("DELETE", f"/workers/{key}")
                if response.status_code not in (200, 202, 204, 404):
                    raise self._fail(response, f"remove worker {url}")
        await self._settle(url, present=False)

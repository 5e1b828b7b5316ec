"""Engine boxes from the Kubernetes API: the pods matching a label selector in one namespace, listed and
then watched, through lightkube.

Why lightkube (against kr8s and kubernetes_asyncio): typed resources (`Pod`) that type-check under mypy
--strict, an asyncio client on httpx's API with the in-cluster config, rotating service-account tokens
(`tokenFile`, re-read like client-go) and a watch that keeps its resourceVersion across reconnects, in a
small 1.x package whose dependencies warmer mostly has already. kubernetes_asyncio is the generated
OpenAPI client: 3 MB of code, aiohttp and a second HTTP stack. kr8s is httpx-based too but still 0.x, with
untyped `Box` objects and six more dependencies (cryptography, python-box, python-jsonpath, ...).

The pattern is client-go's list-then-watch: a LIST gives every current pod and the resourceVersion to
watch from; the WATCH then streams ADDED/MODIFIED/DELETED changes. When the server has compacted that
version away (410 Gone) the pods deleted meanwhile would never be announced, so the watch is dropped and
the namespace listed again. Any other failure raises `DiscoveryUnavailable`; the caller backs off and
starts over with a LIST.

The Pod fields read: `status.phase` ("Running", PodRunning) and `status.podIP` (empty until allocated)
from kubernetes/api core/v1/types.go @ 10b39a39bcee995dfe7cd5e8e7b922be5e46f1e2 (PodStatus, lines
5609 and 5654); `metadata.name` and `metadata.deletionTimestamp` (set once the pod is terminating) from
kubernetes/apimachinery pkg/apis/meta/v1/types.go @ eed236ceee2c19c2753a3d93ac0631dc20750454 (ObjectMeta).

Readiness of the pod is deliberately NOT required: an engine pod whose readiness probe is warmer's own
`/v1/boxes/{id}/ready` only becomes Ready after warmer has warmed it, so it must be a box before that.
"""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from lightkube import AsyncClient, KubeConfig, operators
from lightkube.core.exceptions import ApiError, ConfigError, LoadResourceError
from lightkube.resources.core_v1 import Pod

from warmer.core.errors import DiscoveryUnavailable
from warmer.core.label_selector import parse_label_selector
from warmer.core.model import BoxSpec, EngineKind

GONE = 410  # the watched resourceVersion is too old: list again
_FAILURES = (httpx2.HTTPError, ConfigError, LoadResourceError, ValueError)

Selector = dict[str, str | operators.Operator[Any] | Iterable[Any] | None]


def lightkube_selector(text: str) -> Selector:
    """A Kubernetes label selector string as lightkube's label -> operator map; ValueError if invalid (or if
    it names a label twice, which the map cannot hold)."""
    selector: Selector = {}
    for requirement in parse_label_selector(text):
        key, values = requirement.key, list(requirement.values)
        if key in selector:
            raise ValueError(f"label selector names {key!r} twice")
        match requirement.operator:
            case "=":
                selector[key] = operators.equal(values[0])
            case "!=":
                selector[key] = operators.not_equal(values[0])
            case "in":
                selector[key] = operators.in_(values)
            case "notin":
                selector[key] = operators.not_in(values)
            case "exists":
                selector[key] = operators.exists()
            case "!exists":
                selector[key] = operators.not_exists()
    return selector


@dataclass(frozen=True, slots=True)
class PodTemplate:
    """What every discovered pod becomes as a box (the API says only where it is)."""

    engine: EngineKind
    model: str
    port: int
    scheme: str = "http"
    slots: int = 1
    group: str = ""


class KubernetesPods:
    """The engine pods of a namespace by label selector as boxes (id = pod name): listed, or watched."""

    def __init__(
        self, client: AsyncClient, *, namespace: str, label_selector: str, template: PodTemplate
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._selector = lightkube_selector(label_selector)
        self._template = template

    async def list_boxes(self) -> list[BoxSpec]:
        """The running, not terminating pods with an IP, sorted by name."""
        boxes, _ = await self._list()
        return sorted(boxes.values(), key=lambda box: box.id)

    async def watch_boxes(self) -> AsyncIterator[list[BoxSpec]]:
        """Every box now, then the whole set again after each change the watch shows. Lists again by
        itself when the watch expires (410 Gone); raises DiscoveryUnavailable on any other failure."""
        while True:
            boxes, version = await self._list()
            yield sorted(boxes.values(), key=lambda box: box.id)
            try:
                async for change, pod in self._client.watch(
                    Pod, namespace=self._namespace, labels=self._selector, resource_version=version
                ):
                    name = pod.metadata.name if pod.metadata is not None else None
                    if not name:
                        continue
                    box = None if change == "DELETED" else self._box(pod)
                    if boxes.get(name) == box:
                        continue
                    if box is None:
                        boxes.pop(name, None)
                    else:
                        boxes[name] = box
                    yield sorted(boxes.values(), key=lambda box: box.id)
            except ApiError as exc:
                if exc.status.code == GONE:
                    continue  # compacted away: what was deleted meanwhile is only seen by listing again
                raise _unavailable("watch", exc) from exc
            except _FAILURES as exc:
                raise _unavailable("watch", exc) from exc
            # The watch ended without an error (lightkube reconnects by itself): list again.

    async def _list(self) -> tuple[dict[str, BoxSpec], str | None]:
        try:
            listing = self._client.list(Pod, namespace=self._namespace, labels=self._selector)
            pods = [pod async for pod in listing]
            version = listing.resourceVersion
        except _FAILURES as exc:
            raise _unavailable("list", exc) from exc
        boxes = {box.id: box for box in (self._box(pod) for pod in pods) if box is not None}
        return boxes, version

    def _box(self, pod: Pod) -> BoxSpec | None:
        metadata, status = pod.metadata, pod.status
        if metadata is None or status is None:
            return None
        name, ip = metadata.name, status.podIP
        if not name or not ip or metadata.deletionTimestamp is not None or status.phase != "Running":
            return None
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return None
        host = f"[{address}]" if address.version == 6 else str(address)
        template = self._template
        return BoxSpec(
            id=name,
            base_url=f"{template.scheme}://{host}:{template.port}",
            engine=template.engine,
            model=template.model,
            slots=template.slots,
            group=template.group,
        )


def api_client(api_url: str, *, token_file: Path | None, ca_file: Path | None, namespace: str) -> AsyncClient:
    """A client of the API server at `api_url`: the service-account token re-read from `token_file` as the
    kubelet rotates it (none when the file is absent, e.g. outside a pod: the server decides), the
    server's certificate checked against `ca_file` (None: the system's trust store)."""
    cluster: dict[str, object] = {"server": api_url}
    if ca_file is not None:
        cluster["certificate-authority"] = str(ca_file)
    user = {"tokenFile": str(token_file)} if token_file is not None and token_file.is_file() else {}
    config = KubeConfig.from_dict(
        {
            "clusters": [{"name": "warmer", "cluster": cluster}],
            "users": [{"name": "warmer", "user": user}],
            "contexts": [
                {"name": "warmer", "context": {"cluster": "warmer", "user": "warmer", "namespace": namespace}}
            ],
            "current-context": "warmer",
        }
    )
    # No proxy from the environment: the API server is reached directly, like the engines.
    return AsyncClient(config, trust_env=False, timeout=httpx2.Timeout(10.0, read=None))


def _unavailable(what: str, exc: Exception) -> DiscoveryUnavailable:
    """The failure named the way an operator acts on it: the API's own status and message when it answered
    (a 403 names the missing RBAC), else the transport error."""
    if isinstance(exc, ApiError):
        status = exc.status
        return DiscoveryUnavailable(f"Kubernetes API {what} answered {status.code}: {status.message}")
    return DiscoveryUnavailable(f"Kubernetes API {what} failed: {type(exc).__name__}: {exc}")

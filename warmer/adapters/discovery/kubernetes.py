"""Engine boxes from the Kubernetes API: the pods matching a label selector in one namespace.

`GET /api/v1/namespaces/{namespace}/pods?labelSelector=...` with the pod's service-account token. The
PodList fields read: `status.phase` ("Running", PodRunning) and `status.podIP` (empty until allocated)
from kubernetes/api core/v1/types.go @ 10b39a39bcee995dfe7cd5e8e7b922be5e46f1e2 (PodStatus, lines
5609 and 5654); `metadata.name` and `metadata.deletionTimestamp` (set once the pod is terminating) from
kubernetes/apimachinery pkg/apis/meta/v1/types.go @ eed236ceee2c19c2753a3d93ac0631dc20750454 (ObjectMeta).

Readiness of the pod is deliberately NOT required: an engine pod whose readiness probe is warmer's own
`/v1/boxes/{id}/ready` only becomes Ready after warmer has warmed it, so it must be a box before that.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from warmer.core.errors import DiscoveryUnavailable
from warmer.core.model import BoxSpec, EngineKind


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
    """Lists the engine pods of a namespace by label selector as boxes (id = pod name)."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        api_url: str,
        namespace: str,
        label_selector: str,
        template: PodTemplate,
        token: Callable[[], str | None],
        timeout_seconds: float = 10.0,
    ) -> None:
        self._http = http
        self._url = f"{api_url.rstrip('/')}/api/v1/namespaces/{quote(namespace, safe='')}/pods"
        self._selector = label_selector
        self._template = template
        self._token = token  # read per call: projected service-account tokens rotate
        self._timeout = timeout_seconds

    async def list_boxes(self) -> list[BoxSpec]:
        """The running, not terminating pods with an IP, sorted by name."""
        headers = {"Accept": "application/json"}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            response = await self._http.get(
                self._url, params={"labelSelector": self._selector}, headers=headers, timeout=self._timeout
            )
        except httpx.HTTPError as exc:
            raise DiscoveryUnavailable(f"Kubernetes API unreachable: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            reason = _status_message(response)
            raise DiscoveryUnavailable(f"Kubernetes API answered {response.status_code}: {reason}")
        try:
            body = response.json()
            items = body["items"]
        except (ValueError, KeyError, TypeError) as exc:
            raise DiscoveryUnavailable(f"Kubernetes API answered without a PodList: {exc}") from exc
        if not isinstance(items, list):
            raise DiscoveryUnavailable("Kubernetes API answered a PodList whose items is not a list")
        boxes = [box for box in (self._box(item) for item in items) if box is not None]
        return sorted(boxes, key=lambda box: box.id)

    def _box(self, pod: Any) -> BoxSpec | None:
        if not isinstance(pod, dict):
            return None
        metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
        name, ip = metadata.get("name"), status.get("podIP")
        if not isinstance(name, str) or not name or not isinstance(ip, str) or not ip:
            return None
        if metadata.get("deletionTimestamp") or status.get("phase") != "Running":
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


def _status_message(response: httpx.Response) -> str:
    """The `message` of a Kubernetes Status body, else the start of the text."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    message = body.get("message") if isinstance(body, dict) else None
    return str(message) if message else response.text[:200]

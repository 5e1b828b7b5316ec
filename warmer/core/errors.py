"""Error types that cross layers. Adapters raise these; services decide what they mean."""

from __future__ import annotations

from enum import StrEnum


class WarmerError(Exception):
    """Base of every error warmer raises on purpose."""


class EngineError(WarmerError):
    """An engine call failed: transport, status, or a body we cannot trust."""

    def __init__(self, box_id: str, message: str, *, transient: bool = False) -> None:
        super().__init__(f"{box_id}: {message}")
        self.box_id = box_id
        self.transient = transient


class EngineUnavailable(EngineError):
    """The engine did not answer, or answered 5xx / 503-while-starting (worth retrying)."""

    def __init__(self, box_id: str, message: str) -> None:
        super().__init__(box_id, message, transient=True)


class EngineSlow(EngineUnavailable):
    """The engine took the connection but did not answer within the time limit: busy, not known to be
    down (a refused connection or a 5xx is `EngineUnavailable` itself)."""


class HealthFailure(StrEnum):
    """How a box's health poll failed: each points an operator somewhere else."""

    REFUSED = "refused"  # nothing listens on the port: the engine process is down or restarting
    CONNECT_TIMEOUT = "connect_timeout"  # no answer to the connection: host down, or packets dropped
    UNREACHABLE = "unreachable"  # another transport failure: name not resolved, connection reset
    TIMEOUT = "timeout"  # the connection was taken but the answer came too late: busy
    HTTP_STATUS = "http_status"  # it answered, with another status than 200: starting, overloaded
    UNHEALTHY = "unhealthy"  # the engine said it is not ready in its own way
    EPOCH = "epoch"  # health answered, but the process identity could not be read
    STALE = "stale"  # another replica holds the box and its last observation is older than the bound


class EngineDown(EngineUnavailable):
    """The box's health check failed; `kind` says how (refused, connect timeout, an HTTP status...)."""

    def __init__(self, box_id: str, kind: HealthFailure, message: str) -> None:
        super().__init__(box_id, message)
        self.kind = kind


class MalformedResponse(EngineError):
    """The engine answered, but the body is not what its documented shape promises."""


class CacheFieldMissing(MalformedResponse):
    """The body lacks the field that reports cached tokens (e.g. a server flag is off)."""


class ImplausibleReport(EngineError):
    """The engine's report cannot be true of what was sent (e.g. cached tokens of a prompt made up this
    moment): its cache reports are not evidence of anything."""


class NotSupported(EngineError):
    """The engine kind cannot do this (e.g. tokenize chat messages); fall back to local rendering."""


class ConfigError(WarmerError):
    """Configuration is invalid; `problems` lists each as (field path, message)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{path}: {msg}" for path, msg in problems))


class StoreError(WarmerError):
    """The warm-state store refused a write (e.g. a record for a box or epoch it does not know)."""


class LeaseLost(StoreError):
    """A write of a box's rows by a replica the database no longer names as the box's live lease holder:
    refused inside its transaction, so nothing of it was written (another replica owns the box now)."""


class StoreUnavailable(StoreError):
    """The database did not answer or was locked past its timeout (worth retrying)."""


class GatewayError(WarmerError):
    """The router in front of the boxes refused or failed a worker change; `transient` if worth retrying."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class DiscoveryUnavailable(WarmerError):
    """The service discovery backend (the Kubernetes API) did not answer with a usable listing."""

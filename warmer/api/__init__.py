"""The HTTP API: a FastAPI app factory over `ApiServices`. A thin shell: no domain logic lives here."""

from warmer.api.app import ApiServices, Liveness, Readiness, create_app

__all__ = ["ApiServices", "Liveness", "Readiness", "create_app"]

"""Where engine boxes are found at run time, besides the configured list."""

from warmer.adapters.discovery.kubernetes import KubernetesPods, PodTemplate, api_client

__all__ = ["KubernetesPods", "PodTemplate", "api_client"]

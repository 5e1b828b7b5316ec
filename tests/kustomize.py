"""The manifests `kubectl apply -k` would apply, rendered by the real `kubectl kustomize` (kustomize is
built into kubectl; the project's machines have it), and overlays composed of deploy/kubernetes's
components for the tests to render every combination."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
KUBERNETES = REPO / "deploy" / "kubernetes"
BASE = KUBERNETES / "base"
COMPONENTS = ("postgresql", "discovery", "monitoring", "network-policy")

Manifest = dict[str, Any]


class KustomizeError(RuntimeError):
    """kubectl kustomize refused the kustomization (its own message says why)."""


def render(directory: Path) -> list[Manifest]:
    """Every resource the kustomization in `directory` produces, as kubectl kustomize renders it."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise KustomizeError("kubectl is not installed: the deploy tests render with `kubectl kustomize`")
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False, timeout=60
    )
    if result.returncode != 0:
        raise KustomizeError(f"kubectl kustomize {directory}: {result.stderr.strip()}")
    return [document for document in yaml.safe_load_all(result.stdout) if document is not None]


def compose(root: Path, components: Sequence[str], namespace: str | None = None) -> Path:
    """An overlay in `root` over the base with `components` (names under deploy/kubernetes/components),
    placed in `namespace` the way the example overlay does it (a NamespaceTransformer that keeps the
    discovery RBAC in the engines' namespace)."""
    root.mkdir(parents=True, exist_ok=True)
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(BASE, root)],
        "components": [os.path.relpath(KUBERNETES / "components" / name, root) for name in components],
    }
    if namespace is not None:
        transformer = {
            "apiVersion": "builtin",
            "kind": "NamespaceTransformer",
            "metadata": {"name": "warmer-namespace", "namespace": namespace},
            "unsetOnly": True,
            "setRoleBindingSubjects": "allServiceAccounts",
        }
        kustomization["transformers"] = [yaml.safe_dump(transformer)]
    (root / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return root

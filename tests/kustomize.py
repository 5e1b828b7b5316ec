"""A small renderer for the subset of kustomize that deploy/kubernetes uses, so tests see the manifests
`kubectl apply -k` would apply.

kustomize itself is a Go binary that no Python package ships (PyPI's `kustomize` writes kustomization
files, it does not build them), and CI installs only what the project's own files install. Anything
outside the subset (generators, name prefixes, inline or targeted patches, ...) is an error here rather
than being silently ignored, so the renderer can never drift from kustomize without a failing test.

The subset: `resources` (files and kustomization directories), `patches` (files of strategic-merge
patches, matched by kind and name; `$patch: delete` removes the resource; `null` removes a field; lists
of containers, volumes, env, ... merge by their Kubernetes merge keys) and `images` (newName/newTag on
pod template containers and init containers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

_KEYS = {"apiVersion", "kind", "resources", "patches", "images"}
# The patchMergeKey of the list fields the manifests patch (Kubernetes API types, `patchMergeKey` tags).
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "envFrom": None,  # atomic in the API types: replaced whole
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}

Manifest = dict[str, Any]


class KustomizeError(ValueError):
    """The kustomization uses something outside the supported subset, or a patch matches nothing."""


def render(directory: Path) -> list[Manifest]:
    """Every resource the kustomization in `directory` produces, patched and with images set."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - _KEYS
    if unknown:
        raise KustomizeError(f"{directory}: unsupported kustomization fields {sorted(unknown)}")
    resources: list[Manifest] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        resources += render(path) if path.is_dir() else _documents(path)
    for patch in kustomization.get("patches", []):
        if set(patch) != {"path"}:
            raise KustomizeError(f"{directory}: only `path:` patches are supported, got {sorted(patch)}")
        for document in _documents(directory / patch["path"]):
            resources = _apply_patch(resources, document, directory / patch["path"])
    for image in kustomization.get("images", []):
        for resource in resources:
            _set_image(resource, image)
    seen: set[tuple[str, str]] = set()
    for resource in resources:
        key = _identity(resource)
        if key in seen:
            raise KustomizeError(f"{directory}: duplicate resource {key}")
        seen.add(key)
    return resources


def _documents(path: Path) -> list[Manifest]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document is not None]


def _identity(resource: Manifest) -> tuple[str, str]:
    return resource["kind"], resource["metadata"]["name"]


def _apply_patch(resources: list[Manifest], patch: Manifest, source: Path) -> list[Manifest]:
    matches = [index for index, resource in enumerate(resources) if _identity(resource) == _identity(patch)]
    if len(matches) != 1:
        raise KustomizeError(f"{source}: patch target {_identity(patch)} matched {len(matches)} resources")
    (index,) = matches
    if patch.get("$patch") == "delete":
        return resources[:index] + resources[index + 1 :]
    merged = _merge(resources[index], patch)
    return [*resources[:index], merged, *resources[index + 1 :]]


def _merge(base: Any, patch: Any, field: str = "") -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        result = dict(base)
        for key, value in patch.items():
            if value is None:
                result.pop(key, None)
            elif key in result:
                result[key] = _merge(result[key], value, key)
            else:
                result[key] = _merge({}, value, key) if isinstance(value, dict) else value
        return result
    merge_key = _MERGE_KEYS.get(field)
    if isinstance(base, list) and isinstance(patch, list) and merge_key is not None:
        result_list = list(base)
        for item in patch:
            positions = [i for i, old in enumerate(result_list) if old.get(merge_key) == item.get(merge_key)]
            if item.get("$patch") == "delete":
                result_list = [old for i, old in enumerate(result_list) if i not in positions]
            elif positions:
                result_list[positions[0]] = _merge(result_list[positions[0]], item)
            else:
                result_list.append(item)
        return result_list
    return patch


def _set_image(resource: Manifest, image: dict[str, str]) -> None:
    unknown = set(image) - {"name", "newName", "newTag"}
    if unknown:
        raise KustomizeError(f"unsupported image fields {sorted(unknown)}")
    pod = resource.get("spec", {}).get("template", {}).get("spec", {})
    for container in [*pod.get("containers", []), *pod.get("initContainers", [])]:
        name, _, tag = str(container.get("image", "")).partition(":")
        if name != image["name"]:
            continue
        name = image.get("newName", name)
        tag = image.get("newTag", tag)
        container["image"] = f"{name}:{tag}" if tag else name

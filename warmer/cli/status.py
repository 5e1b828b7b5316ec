"""`warmer status [--json]`: what the running daemon says about its boxes and routes.

Asks the daemon's own API (`GET /v1/boxes`, `GET /v1/routes`) at the configured host and port, as an
operator expects: the answer is live (health, epoch, in-flight warm-ups), which the database alone cannot
give. Uses the first configured bearer token when the API requires one.
"""

from __future__ import annotations

import json
from typing import Any

import click
import httpx

from warmer.cli.exits import Exit, fail
from warmer.cli.group import CliState, pass_state
from warmer.config.settings import Settings
from warmer.root.http import sync_http_client


def daemon_url(settings: Settings) -> str:
    """The API address to call: a wildcard bind is reached over loopback."""
    host = settings.api.host
    if host in ("0.0.0.0", "", "::"):  # a wildcard bind: connect over loopback
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{settings.api.port}"


def _seconds(value: object) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.2f}s"


def health_cell(box: dict[str, Any]) -> str:
    """The HEALTH column: up, up with late answers in a row, or DOWN and how (refused, http_status...)."""
    late = box.get("health_slow_polls") or 0
    if not box["healthy"]:
        kind = box.get("health_error_kind")
        return f"DOWN ({kind})" if kind else "DOWN"
    return f"up, {late} late" if late else "up"


def render_table(boxes: list[dict[str, Any]], routes: dict[str, dict[str, Any]]) -> str:
    """The readable form: one line per box, then one line per agent. With several replicas, a HOLDER
    column names the replica holding each box's lease (`*` when it is the one answering)."""
    replicas = any(box.get("lease_holder") for box in boxes)
    header = (
        "BOX",
        "HEALTH",
        "EPOCH",
        "WARM-UP",
        "READY",
        "WEIGHT",
        "PREFIXES",
        "TO READY",
        "ENGINE",
        "OVERHEAD",
        *(("HOLDER",) if replicas else ()),
    )
    rows: list[tuple[str, ...]] = [header]
    for box in boxes:
        ready = box["ready"]
        prefixes = box["prefixes"]
        warm = sum(1 for p in prefixes if p["state"] in ("warm", "stale") and p["trusted"])
        ttr = box.get("time_to_ready") or {}
        overhead = ttr.get("overhead_fraction")
        rows.append(
            (
                box["id"],
                health_cell(box),
                (box["epoch"] or "-")[-24:],
                box["warmup"],
                "yes" if ready["ready"] else "no",
                f"{ready['weight']:.2f}",
                f"{warm}/{len(prefixes)}",
                # resumed: an earlier daemon readied this epoch; this one only re-verified it
                "resumed" if ttr.get("resumed") else _seconds(ttr.get("time_to_ready_seconds")),
                _seconds(ttr.get("engine_seconds")),
                "-" if overhead is None else f"{overhead:.1%}",
                *((_holder(box),) if replicas else ()),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    for box in boxes:
        if not box["ready"]["ready"] and box["ready"]["reasons"]:
            lines.append(f"  {box['id']} not ready: {'; '.join(box['ready']['reasons'])}")
    lines.append("")
    lines.append("AGENT ROUTES (only boxes where the agent's prefix is verified warm)")
    for agent_id, entry in sorted(routes.items()):
        found = ", ".join(f"{r['box_id']} ({r['weight']:.2f})" for r in entry["routes"]) or "none"
        note = f"  [{entry['error']}]" if entry.get("error") else ""
        lines.append(f"  {agent_id}: {found}{note}")
    return "\n".join(lines)


def _holder(box: dict[str, Any]) -> str:
    holder = box.get("lease_holder")
    return "-" if not holder else f"{holder}{' *' if box.get('held_here') else ''}"


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print boxes and routes as one JSON object.")
@click.option("--url", default=None, help="Daemon API base URL (default: from the config's [api] host/port).")
@pass_state
def status(state: CliState, as_json: bool, url: str | None) -> None:
    """Boxes (health, epoch, restart warm-up, readiness, weight, prefixes, time to ready vs engine time)
    and per-agent routes, from the running daemon.

    \b
    warmer --config config/example.toml status
    warmer --config config/example.toml status --json | jq '.routes'

    Exit status 4 when the daemon cannot be reached.
    """
    settings = state.load_settings()
    base = url.rstrip("/") if url else daemon_url(settings)
    headers = {}
    if settings.api.tokens:
        headers["authorization"] = f"Bearer {settings.api.tokens[0].get_secret_value()}"
    try:
        with sync_http_client(base_url=base, headers=headers) as client:
            boxes_response = client.get("/v1/boxes")
            routes_response = client.get("/v1/routes")
    except httpx.HTTPError as exc:
        fail(Exit.UNAVAILABLE, f"cannot reach the daemon at {base}: {exc}")
    for response in (boxes_response, routes_response):
        if response.status_code != 200:
            fail(
                Exit.UNAVAILABLE, f"{response.request.url.path}: HTTP {response.status_code}: {response.text}"
            )
    boxes = boxes_response.json()["boxes"]
    routes = routes_response.json()["routes"]
    if as_json:
        click.echo(json.dumps({"boxes": boxes, "routes": routes}, indent=2))
    else:
        click.echo(render_table(boxes, routes))

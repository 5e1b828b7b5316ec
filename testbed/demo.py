"""`python -m testbed demo`: the daemon on embedded defaults against a local fleet of real llama-server boxes.

Builds what it needs (llama-server once per machine, the generated model), starts the boxes on free
loopback ports, writes a config for them under `state/demo/` (embedded SQLite there too), and runs
`warmer serve` in the foreground until Ctrl-C / SIGTERM, then stops every box.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from testbed.fleet import LlamaBox, LlamaFleet, loopback_port

REPO = Path(__file__).resolve().parent.parent
DEMO_MODEL = "tiny-demo"
DEMO_PORT = 8470  # the API's default port, as the README's curl lines use; another one only when taken


def _say(message: str) -> None:
    print(f"demo: {message}", file=sys.stderr, flush=True)


def demo_config(boxes: list[LlamaBox], *, state_dir: Path, port: int) -> str:
    """A complete warmer config for the running boxes: embedded SQLite, short timings, the example agents."""
    lines = [
        "# Written by `python -m testbed demo` for the boxes it started; not meant to be edited.",
        "[database]",
        f"state_dir = {json.dumps(str(state_dir))}",
        "",
        "[api]",
        'host = "127.0.0.1"',
        f"port = {port}",
        "",
        "[reconcile]",
        "interval_seconds = 2.0",
        "health_poll_seconds = 2.0",
        "ramp_seconds = 30.0",
        "",
        "[fleet]",
        f"agents_dir = {json.dumps(str(REPO / 'config' / 'agents'))}",
        "",
    ]
    for box in boxes:
        lines += [
            "[[fleet.boxes]]",
            f'id = "{box.id}"',
            f'base_url = "{box.base_url}"',
            'engine = "llamacpp"',
            f'model = "{DEMO_MODEL}"',
            f"slots = {box.slots}",
            "",
        ]
    return "\n".join(lines)


def run_demo(*, boxes: int = 2, slots: int = 2, state_root: Path | None = None) -> int:
    from testbed.__main__ import build

    binary, model = build()
    state_dir = (state_root or REPO / "state" / "demo").resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    stop = False

    def request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    fleet = LlamaFleet(boxes, binary=binary, model=model, slots=slots, log_dir=state_dir / "boxes")
    with fleet:
        port = loopback_port(DEMO_PORT)
        if port != DEMO_PORT:
            _say(f"port {DEMO_PORT} is taken: the API listens on {port} instead")
        config = state_dir / "warmer.toml"
        config.write_text(demo_config(fleet.boxes, state_dir=state_dir, port=port))
        api = f"http://127.0.0.1:{port}"
        _say(f"{boxes} llama-server boxes up: " + ", ".join(f"{b.id}={b.base_url}" for b in fleet.boxes))
        _say(f"config {config}; database {state_dir / 'warmer.db'}; box logs {state_dir / 'boxes'}")
        _say(f"API {api}: try  curl {api}/v1/boxes   curl {api}/v1/routes   curl {api}/metrics")
        warmer = Path(sys.executable).with_name("warmer")
        shown = os.path.relpath(warmer) if warmer.is_relative_to(Path.cwd()) else str(warmer)
        _say(f"status:  {shown} --config {config} status")
        if os.environ.get("WARMER_API__WEBHOOK_SECRET"):
            _say("deploy webhook: on (signed with WARMER_API__WEBHOOK_SECRET)")
        else:
            _say("deploy webhook: off; start with WARMER_API__WEBHOOK_SECRET=<secret> make demo to enable it")
        daemon = subprocess.Popen([str(warmer), "--config", str(config), "serve"], env=dict(os.environ))
        try:
            while not stop and daemon.poll() is None:
                time.sleep(0.5)
        finally:
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
        _say(f"daemon exited with {daemon.returncode}; stopping boxes")
    return 0 if stop else (daemon.returncode or 1)

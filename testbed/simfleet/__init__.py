"""A simulated fleet: thousands of engine boxes in one (or a few) asyncio processes on loopback, each with
its own base URL (`http://127.0.0.1:PORT/box/{index}`), speaking the llama.cpp, vLLM or SGLang shapes
warmer's adapters read, each with an LRU prefix cache sized in tokens, a prefill rate, slots, a process
identity that changes on restart, health that can be made slow or failing, and counters of every request.

- `SimFleetApp` (app.py): the ASGI app of one process, usable in-process over `httpx.ASGITransport`.
- `simfleet_in_process` (run.py): the same on a loopback socket, served by the caller's event loop.
- `running_simfleet` (run.py): N boxes in K subprocesses, as a context manager; `SimFleet` drives them.
- `python -m testbed simfleet --boxes 1000 --engine llamacpp`: the same from the shell (cli.py).
"""

from testbed.simfleet.app import SimFleetApp
from testbed.simfleet.box import BoxConfig, HealthMode, SimBox, SimEngine
from testbed.simfleet.cache import PrefixCache
from testbed.simfleet.run import SimFleet, fleet_toml, running_simfleet, simfleet_in_process

__all__ = [
    "BoxConfig",
    "HealthMode",
    "PrefixCache",
    "SimBox",
    "SimEngine",
    "SimFleet",
    "SimFleetApp",
    "fleet_toml",
    "running_simfleet",
    "simfleet_in_process",
]

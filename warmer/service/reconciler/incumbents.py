"""Where each agent is now, for sticky placement: read from the shared warm records, not from this process's
own history.

Placement keeps an agent on the boxes it holds (`place(..., previous=...)`), so an agent is not moved, and
its caches lost, each time the fleet changes. What "the boxes it holds" means decides whether several
replicas agree. Each replica used to take it from its own routing, which grows out of its own earlier
placements: two replicas that saw the boxes become eligible in a different order during start-up kept
different groups for good, and the one whose group named a box whose lease holder had placed the agent
elsewhere waited forever for a prefix nobody would warm (the box never ready there, the agent's routes short).

Here it is a fact every replica reads alike: the boxes where the lease holder holds the agent's current
prefix in the box's current epoch, or is putting it there now (records `warm`, `stale` or `warming`), in
the agent's own rendezvous order (a pure function of the ids). Same records, same eligible boxes and same
demand give the same placement on every replica (`PlacementState` equals a full `place` of its inputs), and
a holder's placement is what its records show, so the others follow what it does. Trust does not enter:
a record a new holder has not re-probed yet still says where the cache most likely is (routes still wait
for the probe). A prefix the engine evicted or a warm that failed is no reason to stay: the agent is placed
again by its ranking, usually on the same box.
"""

from __future__ import annotations

from collections.abc import Mapping

from warmer.core.model import WarmRecord, WarmState
from warmer.core.placement.ranking import rendezvous_order
from warmer.core.planner import PrefixRef, WarmKey

_HELD = frozenset({WarmState.WARM, WarmState.STALE, WarmState.WARMING})


class SharedIncumbents:
    """Agent -> the boxes holding its current prefix now, each agent's boxes in its rendezvous order (the
    order is recomputed only for agents whose set of boxes changed)."""

    def __init__(self, hash_buckets: int) -> None:
        self._buckets = hash_buckets
        self._orders: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {}

    def of(
        self,
        refs: Mapping[str, PrefixRef],
        records: Mapping[WarmKey, WarmRecord],
        epochs: Mapping[str, str],
    ) -> dict[str, tuple[str, ...]]:
        """`records`: the store's rows as last read; `epochs`: each box's current epoch."""
        by_prefix: dict[str, set[str]] = {}
        for (box_id, epoch, prefix_hash), record in records.items():
            if record.state in _HELD and epochs.get(box_id) == epoch:
                by_prefix.setdefault(prefix_hash, set()).add(box_id)
        found: dict[str, tuple[str, ...]] = {}
        orders: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {}
        for agent_id, ref in refs.items():
            boxes = by_prefix.get(ref.hash)
            if not boxes:
                continue
            held = frozenset(boxes)
            known = self._orders.get(agent_id)
            if known is None or known[0] != held:
                known = (held, tuple(rendezvous_order(agent_id, held, self._buckets)))
            orders[agent_id] = known
            found[agent_id] = known[1]
        self._orders = orders
        return found

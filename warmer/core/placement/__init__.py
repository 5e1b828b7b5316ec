"""Prefix-affinity placement: every agent gets an ordered group of boxes of its model.

Why rendezvous (HRW) hashing: each agent ranks boxes by a stable pseudo-random score, so adding or removing
a box only moves the agents whose top of the ranking that box enters or leaves — the caches elsewhere stay
useful. `ranking` explains the two-level ranking and why it is kept between calls, `greedy` the capped,
coverage-first fill, `counted` its single pass by agent counts where no other cap can refuse (the usual
case at fleet scale), `incremental` the placement that follows one edit at a time, `handover` the
move-before-switch from one placement to the next.
"""

from warmer.core.placement.greedy import place
from warmer.core.placement.handover import Handover, Movement, fit_to_capacity, handover, movement
from warmer.core.placement.hashing import mix64, stable_seed
from warmer.core.placement.incremental import PlacementState
from warmer.core.placement.types import AgentDemand, Placement, PlacementConfig, UnplacedReason

__all__ = [
    "AgentDemand",
    "Handover",
    "Movement",
    "Placement",
    "PlacementConfig",
    "PlacementState",
    "UnplacedReason",
    "fit_to_capacity",
    "handover",
    "mix64",
    "movement",
    "place",
    "stable_seed",
]

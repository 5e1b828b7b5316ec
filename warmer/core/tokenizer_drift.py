"""Tokenizer drift: the same prefix text tokenizing to a materially different count after an engine or model
upgrade (seen in the field: +8% from a tokenizer regression), reported as a lint finding.

Pure: the history of counts is passed in (the store persists it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from warmer.core.lint import Finding, SpecPlace
from warmer.core.model import prefix_hash
from warmer.core.prefix import StablePrefix

DEFAULT_DRIFT_THRESHOLD = 0.05


@dataclass(frozen=True, slots=True)
class TokenCountObservation:
    """One recorded tokenization of a prefix.

    Keyed by `text_hash` (the prefix TEXT's identity, `prefix_hash(text)` without ids): a token-id hash
    changes precisely when the tokenizer does, so it cannot be the key that detects it.
    """

    text_hash: str
    model: str
    engine_version: str
    token_count: int
    at: float = 0.0

    @classmethod
    def of(cls, stable: StablePrefix, engine_version: str, at: float = 0.0) -> TokenCountObservation:
        return cls(prefix_hash(stable.text), stable.model, engine_version, stable.token_count, at)


def drift_baseline(
    history: Sequence[TokenCountObservation], current: TokenCountObservation
) -> TokenCountObservation | None:
    """What `current` is compared with: the newest observation of the same prefix text and model under
    another engine version (None when there is none, or it counted no tokens)."""
    earlier = [
        h
        for h in history
        if h.text_hash == current.text_hash
        and h.model == current.model
        and h.engine_version != current.engine_version
    ]
    if not earlier:
        return None
    previous = max(earlier, key=lambda h: h.at)
    return previous if previous.token_count > 0 else None


def detect_tokenizer_drift(
    history: Sequence[TokenCountObservation],
    current: TokenCountObservation,
    *,
    threshold: float = DEFAULT_DRIFT_THRESHOLD,
) -> Finding | None:
    """A finding when the same prefix text of the same model now tokenizes to a materially different count.

    Compares with the most recent earlier observation of (text_hash, model) under a different engine
    version; `threshold` is the relative change that counts as material (default 5%).
    """
    previous = drift_baseline(history, current)
    if previous is None:
        return None
    change = (current.token_count - previous.token_count) / previous.token_count
    if abs(change) < threshold:
        return None
    return Finding(
        code="tokenizer-drift",
        severity="error",
        message=(
            f"the same prefix tokenizes to {current.token_count} tokens on {current.engine_version} vs "
            f"{previous.token_count} on {previous.engine_version} ({change:+.1%}) for model {current.model}"
        ),
        location=f"prefix text {current.text_hash}",
        places=(SpecPlace("spec"),),
        advice="check the engine's tokenizer after the upgrade (e.g. tokenizer_class in "
        "tokenizer_config.json); a regression makes every prefill longer",
    )

"""What test doubles of warmer's seams need to know, in one place (as `structlog.testing` does for structlog).

A fake engine has to tell a probe from a warm: the executor (`warmer.service.engine_work.warming`) verifies a
prefix by sending it again with a unique suffix that starts with `PROBE_MARK`. The executor takes the mark
from here, so a fake or a benchmark that decodes it with `is_probe` cannot drift from what is sent.
"""

from __future__ import annotations

PROBE_MARK = "\n#probe"


def probe_suffix(nonce: str) -> str:
    """The suffix the executor appends to a prefix to probe it: the mark and a fresh nonce."""
    return f"{PROBE_MARK} {nonce}"


def is_probe(suffix: str) -> bool:
    """Whether a prefix request with this suffix is a probe (otherwise it is a warm)."""
    return suffix.startswith(PROBE_MARK)

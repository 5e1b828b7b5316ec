"""Signed deploy webhooks: signing, verification, and the rule for URLs an event may introduce.

Header (Stripe-style, so the timestamp is covered by the signature):
``X-Warmer-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>``, where the signed message is
``f"{t}.".encode() + raw_body``. Several ``v1=`` entries may be sent while secrets rotate, and the
receiver may hold several secrets: any (secret, v1) match is accepted. A timestamp outside the
tolerance is rejected even with a valid signature, so a captured request cannot be replayed later;
within the tolerance the event id (idempotency key) makes a replay change nothing.
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import hmac
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from warmer.core.errors import WarmerError

SIGNATURE_HEADER = "X-Warmer-Signature"
SIGNATURE_SCHEME = "v1"
DEFAULT_TOLERANCE_SECONDS = 300.0
_MAX_HEADER_LENGTH = 4096
_HEX_SHA256 = re.compile(r"[0-9a-f]{64}")


def _mac(secret: str, timestamp: int, body: bytes) -> str:
    message = f"{timestamp}.".encode() + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign_body(body: bytes, secrets: Sequence[str] | str, timestamp: int) -> str:
    """The header value for `body`: one `v1=` per secret (send two while rotating)."""
    keys = [secrets] if isinstance(secrets, str) else list(secrets)
    if not keys or any(not key for key in keys):
        raise ValueError("at least one non-empty secret is required")
    if timestamp < 0:
        raise ValueError("timestamp must be unix seconds")
    return ",".join([f"t={timestamp}", *(f"{SIGNATURE_SCHEME}={_mac(key, timestamp, body)}" for key in keys)])


class SignatureOutcome(enum.StrEnum):
    OK = "ok"
    MALFORMED_HEADER = "malformed_header"  # missing, unparsable, no timestamp or no v1
    BAD_SIGNATURE = "bad_signature"  # no secret reproduces any v1 (forged, tampered, re-timestamped)
    STALE = "stale"  # signature fine but the timestamp is outside the tolerance (replay)


@dataclass(frozen=True, slots=True)
class SignatureCheck:
    outcome: SignatureOutcome
    detail: str = ""
    timestamp: int | None = None

    @property
    def ok(self) -> bool:
        return self.outcome is SignatureOutcome.OK


def _parse_header(header: str) -> tuple[int, list[str]] | str:
    """(timestamp, v1 signatures), or a message saying what is wrong with the header."""
    if len(header) > _MAX_HEADER_LENGTH:
        return "header too long"
    timestamp: int | None = None
    signatures: list[str] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            return f"element {part.strip()!r} is not key=value"
        if key == "t":
            if timestamp is not None:
                return "more than one t="
            if not value.isdigit():
                return "t= must be unix seconds"
            timestamp = int(value)
        elif key == SIGNATURE_SCHEME:
            if not _HEX_SHA256.fullmatch(value):
                return "v1= must be 64 lowercase hex digits"
            signatures.append(value)
        # other schemes (future v2=...) are ignored, as Stripe does
    if timestamp is None:
        return "no t= timestamp"
    if not signatures:
        return "no v1= signature"
    return timestamp, signatures


def verify_signature(
    body: bytes,
    header: str | None,
    secrets: Sequence[str],
    *,
    now: float,
    tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS,
) -> SignatureCheck:
    """Check a webhook's signature header against the raw body, in constant time per comparison."""
    keys = [key for key in secrets if key]
    if not keys:
        raise ValueError("no webhook secret configured")
    if not header:
        return SignatureCheck(SignatureOutcome.MALFORMED_HEADER, f"missing {SIGNATURE_HEADER} header")
    parsed = _parse_header(header)
    if isinstance(parsed, str):
        return SignatureCheck(SignatureOutcome.MALFORMED_HEADER, parsed)
    timestamp, signatures = parsed
    matched = False
    for key in keys:
        expected = _mac(key, timestamp, body)
        for given in signatures:
            # no early exit: every pair is compared so timing does not reveal which secret matched
            matched |= hmac.compare_digest(expected, given)
    if not matched:
        return SignatureCheck(SignatureOutcome.BAD_SIGNATURE, "no configured secret matches", timestamp)
    age = now - timestamp
    if abs(age) > tolerance_seconds:
        return SignatureCheck(
            SignatureOutcome.STALE,
            f"timestamp is {age:+.0f}s from now (tolerance {tolerance_seconds:.0f}s)",
            timestamp,
        )
    return SignatureCheck(SignatureOutcome.OK, "", timestamp)


# --------------------------------------------------------------------------- event validation


class InvalidEvent(WarmerError):
    """A webhook payload that fails validation; `problems` lists (field path, message)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{path}: {msg}" for path, msg in problems))


_HOST = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")


def normalize_box_url(url: str) -> str:
    """`scheme://host:port[/path]` with lowercase host and explicit port; ValueError if unusable.

    Userinfo, query and fragment are refused outright: a box base URL never needs them and they
    are the usual ways to make an allowlist pattern match a URL that goes somewhere else.
    """
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise ValueError("scheme must be http or https")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ValueError("credentials in the URL are not allowed")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise ValueError("query and fragment are not allowed")
    host = parts.hostname
    if not host:
        raise ValueError("URL has no host")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("port is not a number in 1-65535") from None
    try:
        address = ipaddress.ip_address(host)
        host_text = f"[{address}]" if address.version == 6 else str(address)
    except ValueError:
        if not _HOST.fullmatch(host):
            raise ValueError(f"host {host!r} is not a valid host name") from None
        host_text = host
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    path = parts.path.rstrip("/")
    if ".." in path.split("/"):
        raise ValueError("path must not contain '..'")
    return f"{parts.scheme}://{host_text}:{port}{path}"


@dataclass(frozen=True, slots=True)
class _UrlPattern:
    """One allowlist pattern split into the parts of a normalized URL; each part is matched on its own."""

    scheme: str
    host_labels: tuple[str, ...]  # dot-separated; `*` stays inside one label
    numeric_host: bool  # every literal label is digits (`10.0.3.*`): only an IPv4 address may match
    port: str
    path_segments: tuple[str, ...]  # slash-separated; `*` stays inside one segment

    @classmethod
    def parse(cls, pattern: str) -> _UrlPattern:
        scheme, sep, rest = pattern.strip().partition("://")
        if not sep or not scheme:
            raise ValueError(f"pattern {pattern!r} needs scheme://host[:port][/path]")
        authority, slash, path = rest.partition("/")
        if authority.startswith("["):  # IPv6 literal: [addr]:port
            host, _, after = authority.partition("]")
            host += "]"
            port = after.removeprefix(":")
        else:
            host, _, port = authority.partition(":")
        if not host:
            raise ValueError(f"pattern {pattern!r} has no host")
        port = port or ("443" if scheme == "https" else "80")
        # an IPv6 literal is one part, matched without its brackets (which a glob would read as a set)
        labels = (host[1:-1].lower(),) if host.startswith("[") else tuple(host.lower().split("."))
        numeric = all(label.isdigit() for label in labels if not _is_glob(label)) and any(
            _is_glob(label) for label in labels
        )
        segments = tuple(path.rstrip("/").split("/")) if slash and path.rstrip("/") else ()
        return cls(scheme.lower(), labels, numeric, port, segments)

    def matches(self, normalized: str) -> bool:
        parts = urlsplit(normalized)
        host = parts.hostname or ""
        if not fnmatch.fnmatchcase(parts.scheme, self.scheme):
            return False
        if not fnmatch.fnmatchcase(str(parts.port), self.port):
            return False
        if self.numeric_host:
            try:
                if ipaddress.ip_address(host).version != 4:
                    return False
            except ValueError:
                return False
        labels = (host,) if ":" in host else tuple(host.split("."))
        if not _segments_match(labels, self.host_labels):
            return False
        path = parts.path.rstrip("/")
        segments = tuple(path.split("/")[1:]) if path else ()
        return _segments_match(segments, self.path_segments)


def _is_glob(text: str) -> bool:
    return any(char in text for char in "*?[")


def _segments_match(parts: Sequence[str], patterns: Sequence[str]) -> bool:
    """Same number of parts, each matching its glob: a wildcard never spans a `.` of the host or a `/`."""
    if len(parts) != len(patterns):
        return False
    return all(fnmatch.fnmatchcase(part, pattern) for part, pattern in zip(parts, patterns, strict=True))


@dataclass(frozen=True, slots=True)
class BoxUrlPolicy:
    """Which base URLs a `box.added` event may register (from settings); empty allows none.

    Patterns are written like a normalized URL, ``scheme://host[:port][/path]``, with shell-glob wildcards
    (``*``, ``?``, ``[...]``), e.g. ``http://10.0.3.*:30000`` or ``http://*.gpu.internal:8000``. The URL is
    parsed and each part is matched on its own: the scheme, each dot-separated host label, the port, each
    slash-separated path segment. So a wildcard never reaches across a `.` of the host, the `:` before the
    port or a `/` (``http://*.gpu.internal:18093`` does not admit ``http://127.0.0.1:9/.gpu.internal:18093``),
    and a host pattern of numbers and wildcards (``10.0.3.*``) admits only IPv4 addresses, never a DNS name
    such as ``10.0.3.evil.example``. A pattern without a port means the scheme's default port.
    An event can only make the daemon call URLs an operator listed here; anything else is rejected with the
    field named.
    """

    patterns: tuple[str, ...] = ()

    def check(self, url: str) -> str | None:
        """None when `url` is allowed, else why not."""
        try:
            normalized = normalize_box_url(url)
        except ValueError as exc:
            return str(exc)
        if not self.patterns:
            return "no box URL patterns are configured, so events cannot add boxes"
        for pattern in self.patterns:
            try:
                parsed = _UrlPattern.parse(pattern)
            except ValueError:
                continue  # settings validation reports a malformed pattern; here it admits nothing
            if parsed.matches(normalized):
                return None
        return f"{normalized} matches none of the allowed box URL patterns"


def check_box_url_pattern(pattern: str) -> None:
    """ValueError naming what is wrong with an allowlist pattern (for settings validation)."""
    _UrlPattern.parse(pattern)

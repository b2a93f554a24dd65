"""Typed errors: every failure the client reports is a LatheError.

The server answers errors as {"error": {"code", "message", "field"}}; a failed call's status
carries the same object (plus "resumed_from_step" for "session_restarted"). `error_from` maps
either to the most specific class below.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional


class LatheError(Exception):
    """Base of every error this client raises.

    status: the HTTP status (None for a failed call, whose GET answered 200, or a local check);
    code, message, field: the server's error object, when there was one.
    """

    def __init__(self, message: str, *, status: Optional[int] = None, code: Optional[str] = None,
                 field: Optional[str] = None, body: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.field = field
        self.body = body

    def __str__(self) -> str:
        parts = [self.message]
        if self.field:
            parts.append(f"(field {self.field})")
        if self.code:
            parts.append(f"[{self.code}]")
        if self.status:
            parts.append(f"HTTP {self.status}")
        return " ".join(parts)


class InvalidRequest(LatheError):
    """400, or a call that failed with code "invalid": `field` names what was wrong."""


class AuthError(LatheError):
    """401/403: a missing, wrong or revoked API key."""


class NotFound(LatheError):
    """404: an unknown id, or another tenant's."""


class Conflict(LatheError):
    """409 (e.g. the session has ended) or 422 (an Idempotency-Key reused with another body)."""


class RateLimited(LatheError):
    """429: retry_after is the server's Retry-After in seconds (None when it sent none)."""

    def __init__(self, message: str, *, retry_after: Optional[float] = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class Unavailable(RateLimited):
    """503: the server could not take the request now (e.g. the broker did not acknowledge it).

    For a POST this does not prove the request had no effect; the client never repeats one."""


class ServerError(LatheError):
    """Any other 5xx."""


class ConnectionFailed(LatheError):
    """No HTTP answer at all (refused, reset, timed out). For a POST the server may or may not
    have taken the request: check the session's state before sending it again."""


class CallFailed(LatheError):
    """A session call whose status came back "failed" with a code not mapped more precisely.
    seq: the call's sequence number in its session."""

    def __init__(self, message: str, *, seq: Optional[int] = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.seq = seq


class InvalidCall(CallFailed, InvalidRequest):
    """A call that failed with code "invalid" (what only the worker can see, e.g. a token id
    outside the vocabulary). The session stays usable."""


class SessionRestarted(CallFailed):
    """The session's worker was lost and the session resumed from its last saved state, at
    optimizer step `resumed_from_step`; this call (and what followed it) did not take effect."""

    def __init__(self, message: str, *, resumed_from_step: Optional[int] = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.resumed_from_step = resumed_from_step


def _error_obj(body: Any) -> Mapping[str, Any]:
    if isinstance(body, Mapping):
        e = body.get("error")
        if isinstance(e, Mapping):
            return e
    return {}


def error_from(status: int, body: Any, retry_after: Optional[float] = None) -> LatheError:
    """The error for an HTTP answer with status >= 400 whose JSON body (or None) is body."""
    e = _error_obj(body)
    code, field = e.get("code"), e.get("field")
    message = e.get("message") or (body if isinstance(body, str) and body else f"HTTP {status}")
    kw = {"status": status, "code": code, "field": field, "body": body}
    if status == 400:
        return InvalidRequest(message, **kw)
    if status in (401, 403):
        return AuthError(message, **kw)
    if status in (404, 410):
        return NotFound(message, **kw)
    if status == 409 and code == "idempotency_key_in_use":  # the key's first POST is still being taken: retry
        return Unavailable(message, retry_after=retry_after, **kw)
    if status in (409, 422):
        return Conflict(message, **kw)
    if status == 429:
        return RateLimited(message, retry_after=retry_after, **kw)
    if status == 503:
        return Unavailable(message, retry_after=retry_after, **kw)
    if status >= 500:
        return ServerError(message, **kw)
    return LatheError(message, **kw)


def call_error(seq: Optional[int], error: Any) -> CallFailed:
    """The error for a call whose status is "failed" with the given error object."""
    e = error if isinstance(error, Mapping) else {}
    code, field = e.get("code"), e.get("field")
    message = e.get("message") or f"call {seq} failed"
    kw = {"seq": seq, "code": code, "field": field, "body": error}
    if code == "session_restarted":
        step = e.get("resumed_from_step")
        return SessionRestarted(message, resumed_from_step=step if isinstance(step, int) else None, **kw)
    if code == "invalid":
        return InvalidCall(message, **kw)
    return CallFailed(message, **kw)

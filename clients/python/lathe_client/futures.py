"""CallFuture: the pending result of one session call, fetched by long polling."""
from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Generic, Optional, TypeVar
from urllib.parse import quote

from .errors import CallFailed, LatheError, call_error

if TYPE_CHECKING:
    from .transport import Http

T = TypeVar("T")

POLL_WAIT_S = 30  # what each long poll asks the server to wait (the contract allows 1..60)


class CallTimeout(LatheError, TimeoutError):
    """result(timeout=...) ran out before the call finished; the call goes on on the server."""


class CallFuture(Generic[T]):
    """The result of call `seq` of a session. Sending the call did not wait for it; result()
    does, by polling GET /v1/sessions/{id}/calls/{seq}?wait=30 until the call is done or failed.

    Any thread may call result(); the outcome is fetched once and kept."""

    def __init__(self, http: "Http", session_id: str, seq: int, kind: str, request_id: Optional[str],
                 convert: Callable[[Dict[str, Any]], T]) -> None:
        self._http = http
        self.session_id = session_id
        self.seq = seq
        self.kind = kind
        self.request_id = request_id
        self._convert = convert
        self._lock = threading.Lock()
        self._outcome: Optional[tuple] = None  # ("ok", value, raw) or ("err", exception, raw)
        self.duration_ms: Optional[float] = None

    def __repr__(self) -> str:
        state = "pending" if self._outcome is None else ("done" if self._outcome[0] == "ok" else "failed")
        return f"<CallFuture {self.session_id}:{self.seq} {self.kind} {state}>"

    def _poll(self, wait: int) -> bool:
        """One GET; True once the outcome is known."""
        path = f"/v1/sessions/{quote(self.session_id, safe='')}/calls/{self.seq}"
        _, body = self._http.request("GET", path, query={"wait": wait}, timeout=wait + 30.0, idempotent=True)
        status = body.get("status") if isinstance(body, dict) else None
        if status == "pending":
            return False
        if status == "done":
            result = body.get("result")
            if not isinstance(result, dict):
                result = {}
            value = self._convert(result)
            with self._lock:
                self.duration_ms = body.get("duration_ms")
                self._outcome = ("ok", value, body)
            return True
        if status == "failed":
            with self._lock:
                self._outcome = ("err", call_error(self.seq, body.get("error")), body)
            return True
        raise LatheError(f"call {self.seq}: unexpected status {status!r} in {body!r}")

    def done(self) -> bool:
        """True when the call has finished (done or failed); asks the server without waiting."""
        return self._outcome is not None or self._poll(0)

    def result(self, timeout: Optional[float] = None) -> T:
        """The call's result; raises its typed error (SessionRestarted, InvalidCall, CallFailed)
        when it failed, CallTimeout when timeout seconds passed first. When the server cannot be
        reached (ConnectionFailed, after a few tries) the call goes on there: calling result()
        again resumes waiting."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._outcome is None:
            if deadline is None:
                wait = POLL_WAIT_S
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CallTimeout(f"call {self.seq} ({self.kind}) not finished after {timeout} s")
                wait = min(POLL_WAIT_S, math.ceil(left))
            self._poll(wait)
        kind, value, _ = self._outcome
        if kind == "err":
            raise value
        return value

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """The call's error (a CallFailed), or None when it succeeded. Errors reaching the server
        (ConnectionFailed, ...) and CallTimeout are raised, not returned."""
        try:
            self.result(timeout)
        except CallFailed as e:
            return e
        return None

    @property
    def raw(self) -> Optional[Dict[str, Any]]:
        """The last GET's JSON once the call has finished, else None."""
        return None if self._outcome is None else self._outcome[2]

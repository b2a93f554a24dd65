"""The HTTP layer: one request, JSON in and out, errors mapped, timeouts always.

Only requests marked idempotent are retried, a bounded number of times, on 429/503 (after
Retry-After), on connection failures, and on 409 idempotency_key_in_use (the same key's first
request is still being recorded): GETs, tokenize/detokenize, and POSTs that carry an
Idempotency-Key (a session's calls, a job submitted with a key), which the server answers with
what the first one made instead of making a second. Anything else that fails raises at once:
repeating a POST without a key that may have been taken could make a second one.

One opt-in exception, retry_429: Lathe's API answers 429 from its rate limiter before it looks
at the request, so a 429 means "not taken" and the POST may be sent again after Retry-After.
The sessions contract does not say so in words, hence off by default. 503 and connection
failures are never retried for a POST without a key: the request may have been taken.
"""
from __future__ import annotations

import email.message
import hashlib
import http.client
import json
import math
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, Optional, Tuple

from .errors import ConnectionFailed, LatheError, RateLimited, error_from

DEFAULT_URL = "http://127.0.0.1:8080"
USER_AGENT = "lathe-client-python/0.1"


def dumps(obj: Any) -> bytes:
    """Strict JSON: NaN and infinities are refused here (the server would refuse them too)."""
    try:
        return json.dumps(obj, allow_nan=False, separators=(",", ":")).encode()
    except ValueError as e:
        raise LatheError(f"cannot send as JSON: {e} (NaN or infinity in the request)", code="invalid") from e


def _retry_after(headers: Optional[email.message.Message]) -> Optional[float]:
    if headers is None:
        return None
    v = headers.get("Retry-After")
    if v is None:
        return None
    try:
        s = float(v)
    except ValueError:
        return None  # an HTTP date: not sent by Lathe; treat as unknown
    return s if math.isfinite(s) and s >= 0 else None


class Http:
    """A base URL, an API key and a TLS context; no other state, safe to share between threads
    (each request opens its own connection)."""

    def __init__(self, base_url: str, api_key: Optional[str], ca_file: Optional[str] = None,
                 timeout: float = 60.0, max_retries: int = 4, max_retry_wait: float = 30.0,
                 retry_429: bool = False) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry_429 = retry_429
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_retry_wait = max_retry_wait
        self._ssl: Optional[ssl.SSLContext] = None
        if self.base_url.startswith("https://"):
            self._ssl = ssl.create_default_context(cafile=ca_file)
        self._opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=self._ssl) if self._ssl else urllib.request.HTTPHandler())

    def url(self, path: str, query: Optional[Dict[str, Any]] = None) -> str:
        u = self.base_url + path
        if query:
            u += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        return u

    def _once(self, method: str, url: str, data: Optional[bytes], content_type: Optional[str],
              timeout: float, extra: Optional[Dict[str, str]]) -> Tuple[int, Any, Any]:
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        req.add_header("User-Agent", USER_AGENT)
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        if content_type:
            req.add_header("Content-Type", content_type)
        for k, v in (extra or {}).items():
            req.add_header(k, v)
        try:
            resp = self._opener.open(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            raise error_from(e.code, body, _retry_after(e.headers)) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as e:  # refused, reset, timeout, TLS
            reason = getattr(e, "reason", e)
            raise ConnectionFailed(f"{method} {url}: {reason}") from e
        return resp.status, resp.headers, resp

    def request(self, method: str, path: str, body: Any = None, *, query: Optional[Dict[str, Any]] = None,
                raw: Optional[bytes] = None, content_type: Optional[str] = None, timeout: Optional[float] = None,
                idempotent: bool = False, headers: Optional[Dict[str, str]] = None) -> Tuple[int, Any]:
        """Sends one request and returns (status, parsed JSON body or None). body is sent as
        JSON; raw as given with content_type. Raises a LatheError for status >= 400."""
        data, ctype = raw, content_type
        if body is not None:
            data, ctype = dumps(body), "application/json"
        elif data is None and method in ("POST", "PUT"):
            data = b""  # an explicit Content-Length: 0
        url = self.url(path, query)
        t = self.timeout if timeout is None else timeout
        attempt = 0
        while True:
            try:
                status, _, resp = self._once(method, url, data, ctype, t, headers)
                try:
                    with resp:
                        text = resp.read()
                except (http.client.HTTPException, OSError) as e:
                    raise ConnectionFailed(f"{method} {url}: reading the answer: {e}") from e
                try:
                    return status, (json.loads(text) if text else None)
                except ValueError as e:
                    raise LatheError(f"{method} {path}: the answer is not JSON", status=status) from e
            except (RateLimited, ConnectionFailed) as e:  # Unavailable, too: 503, 409 idempotency_key_in_use
                attempt += 1
                refused = self.retry_429 and e.status == 429 and not hasattr(data, "read")
                if not (idempotent or refused) or attempt > self.max_retries:
                    raise
                wait = getattr(e, "retry_after", None)
                if wait is None:
                    wait = min(2.0 ** attempt * 0.25, 8.0)
                time.sleep(min(wait, self.max_retry_wait))

    def download(self, path: str, dest: str, *, timeout: Optional[float] = None, sha256: Optional[str] = None,
                 chunk: int = 1 << 20) -> int:
        """GETs path into the file dest (written to dest + ".part", renamed when complete and, if
        sha256 is given, only when the bytes have that SHA-256); returns the number of bytes.
        Not retried: call it again to start over."""
        url = self.url(path)
        t = self.timeout if timeout is None else timeout
        _, _, resp = self._once("GET", url, None, None, t, None)
        tmp = dest + ".part"
        n = 0
        h = hashlib.sha256()
        try:
            with resp, open(tmp, "wb") as f:
                while True:
                    try:
                        b = resp.read(chunk)
                    except (http.client.HTTPException, OSError) as e:
                        raise ConnectionFailed(f"GET {url}: reading the answer: {e}") from e
                    if not b:
                        break
                    f.write(b)
                    h.update(b)
                    n += len(b)
            if sha256 is not None and h.hexdigest() != sha256.lower():
                raise LatheError(f"GET {url}: the {n} bytes have SHA-256 {h.hexdigest()}, not {sha256}")
            os.replace(tmp, dest)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return n

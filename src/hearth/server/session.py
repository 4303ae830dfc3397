"""The console's sign-in: a stateless session cookie, and the CSRF check of requests made with it.

The cookie holds an expiry time signed (HMAC-SHA256) with a key derived from the server's token,
so it needs no server-side storage: it survives restarts, works on every replica that has the
same token, and changing the token signs everybody out. The token itself is only ever sent in
the body of ``POST /console/session``, never in a URL, a cookie or a log.

A browser sends cookies with requests that other sites make it send, so a state-changing request
authenticated by the cookie must prove it comes from the console's own origin: its ``Origin``
header (which browsers set on every ``POST``) must name this server.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from urllib.parse import urlsplit

from starlette.types import Scope

COOKIE = "hearth_session"
SESSION_S = 12 * 3600.0  # how long a sign-in lasts
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _key(token: str) -> bytes:
    return hmac.new(token.encode(), b"hearth console session v1", hashlib.sha256).digest()


def _signature(token: str, expires: int) -> str:
    mac = hmac.new(_key(token), str(expires).encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def make_session(token: str, *, now: float | None = None, lifetime_s: float = SESSION_S) -> str:
    """A cookie value valid for ``lifetime_s`` seconds from ``now``."""
    expires = int((time.time() if now is None else now) + lifetime_s)
    return f"{expires}.{_signature(token, expires)}"


def session_valid(token: str, value: str, *, now: float | None = None) -> bool:
    """True when ``value`` was signed with ``token``'s key and has not expired."""
    expires_text, _, signature = value.partition(".")
    if not (expires_text.isascii() and expires_text.isdigit()) or len(expires_text) > 12:
        return False
    if not signature.isascii():
        return False  # never one of ours (and compare_digest takes only ASCII str)
    expires = int(expires_text)
    if expires < (time.time() if now is None else now):
        return False
    return hmac.compare_digest(signature, _signature(token, expires))


def session_cookie(scope: Scope) -> str | None:
    """The session cookie's value in the request's ``Cookie`` header, if any."""
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            text: str = value.decode("latin-1")
            for part in text.split(";"):
                key, _, found = part.strip().partition("=")
                if key == COOKIE and found:
                    return found
    return None


def set_cookie_header(value: str, path: str, *, secure: bool, max_age: int) -> str:
    """The ``Set-Cookie`` header value of the session (empty ``value`` with 0 clears it)."""
    attrs = [f"{COOKIE}={value}", f"Path={path}", f"Max-Age={max_age}", "HttpOnly"]
    attrs.append("SameSite=Strict")
    if secure:
        attrs.append("Secure")
    return "; ".join(attrs)


def same_origin(scope: Scope) -> bool:
    """True for a safe method, or when the request's ``Origin`` names this server's own origin
    (what every browser sends on a ``POST``); a request without ``Origin`` is refused."""
    if scope.get("method", "GET") in _SAFE_METHODS:
        return True
    origin, host = _origin_and_host(scope)
    return origin is not None and _names_host(origin, host)


def cross_origin(scope: Scope) -> bool:
    """True for a state-changing request that a web page of another origin made a browser
    send: its ``Origin`` names another server. (No ``Origin``, as from the SDK or curl: False.)"""
    if scope.get("method", "GET") in _SAFE_METHODS:
        return False
    origin, host = _origin_and_host(scope)
    return origin is not None and not _names_host(origin, host)


def _origin_and_host(scope: Scope) -> tuple[str | None, str | None]:
    origin = host = None
    for name, value in scope.get("headers", []):
        if name == b"origin":
            origin = value.decode("latin-1")
        elif name == b"host":
            host = value.decode("latin-1")
    return origin, host


def _names_host(origin: str, host: str | None) -> bool:
    if host is None:
        return False
    try:
        parts = urlsplit(origin)
    except ValueError:  # a malformed one (``http://[``) names no origin at all
        return False
    # The host, not the scheme: behind a TLS proxy the server itself may see plain http.
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()

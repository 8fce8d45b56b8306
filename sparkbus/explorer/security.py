"""Who may use the Explorer, and which requests may change anything.

- Address: by default it listens on 127.0.0.1 only. On any other address every request must carry an
  access token (generated at start and printed in the URL, as Jupyter does): `?token=` once (the answer
  then sets an HttpOnly, SameSite=Strict cookie and redirects to the URL without it, so the token does not
  stay in the address bar or the history), the cookie after that, or `Authorization: token <token>` for
  scripts. Tokens are compared in constant time.
- Host: without a token, a request must name a loopback host (localhost, 127.0.0.1, [::1]) in its Host
  header, so a web page elsewhere cannot reach the Explorer by pointing a DNS name at 127.0.0.1.
- Changes are POST requests only, refused outright (403, nothing written) unless the Explorer was started
  with allow_changes, and otherwise accepted only with the anti-forgery token: a random value made when the
  Explorer starts and written into every form of its pages (a page of another site cannot read the
  Explorer's pages, so it cannot know it), and, when the browser names one, an Origin that is the
  Explorer's own. One value for the whole run, not one per visitor: no cookie to race between a page and
  the stylesheet and script it loads at once.
- Every answer tells the browser to run only the Explorer's own scripts and styles, never to guess content
  types, and to send a Referer only to the Explorer itself (page addresses carry entity names). Not
  no-referrer: under it a browser names no Origin on a form's POST ("null"), which the check refuses.
"""
from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlsplit

TOKEN_COOKIE = "sparkbus_token"
CSRF_FIELD = "csrf_token"
DEFAULT_HOST = "127.0.0.1"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                               "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def needs_token(host: str) -> bool:
    """Whether the Explorer listening on host requires an access token: on any address but 127.0.0.1 (or
    ::1, localhost)."""
    return host.strip("[]") not in LOOPBACK_NAMES


def new_token() -> str:
    return secrets.token_urlsafe(24)


def same(given: Optional[str], expected: str) -> bool:
    """given equals expected, compared in constant time (None never does)."""
    return given is not None and secrets.compare_digest(given.encode("utf-8", "replace"), expected.encode())


def loopback_host(header: str) -> bool:
    """A Host header naming a loopback host (any port)."""
    host = urlsplit(f"//{header}").hostname or ""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bearer(authorization: Optional[str]) -> Optional[str]:
    """The token of an `Authorization: token <token>` (or `Bearer <token>`) header."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() if scheme.lower() in ("token", "bearer") else None


def same_origin(origin: Optional[str], host_header: str) -> bool:
    """An Origin header absent (some browsers omit it on same-origin forms) or naming this host."""
    if origin is None:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc == host_header


@dataclass(frozen=True)
class Access:
    """The Explorer's access settings: the access token (None: loopback only, no token), whether it changes,
    and the anti-forgery token of its forms."""

    token: Optional[str]
    allow_changes: bool
    csrf: str

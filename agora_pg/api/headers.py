"""Security headers on every answer of the API: ASGI middleware.

- every answer: ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``,
  and no framing by another page (``X-Frame-Options: DENY``, CSP ``frame-ancestors
  'none'``): a page of another origin cannot frame the dashboard and have a click land
  on its Cancel button (clickjacking);
- the dashboard's pages and fragments: a Content-Security-Policy that lets scripts,
  styles and requests come from this origin only (htmx and uPlot are vendored; htmx is
  configured without eval, script tags or injected styles), so that even text that
  slipped through escaping could not run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Message, Receive, Scope, Send

EVERY_ANSWER = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)
FRAMES_NONE = b"frame-ancestors 'none'"
DASHBOARD_POLICY = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    b"font-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


def is_dashboard_path(path: str) -> bool:
    """The dashboard's pages, fragments and files (its policy is the strict one)."""
    return path == "/" or path.startswith("/ui/")


def security_headers(app: ASGIApp) -> ASGIApp:
    """Middleware adding the headers above to every HTTP answer."""

    async def with_headers(scope: Scope, receive: Receive, send: Send) -> None:
        if str(scope["type"]) != "http":  # (a ScopeType is a str enum)
            await app(scope, receive, send)
            return
        policy = DASHBOARD_POLICY if is_dashboard_path(str(scope["path"])) else FRAMES_NONE

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(name, value) for name, value in message.get("headers", [])
                           if name.lower() not in (b"content-security-policy", *(h[0] for h in EVERY_ANSWER))]
                message = {**message, "headers": [*headers, *EVERY_ANSWER, (b"content-security-policy", policy)]}
            await send(message)

        await app(scope, receive, send_with_headers)

    return with_headers

"""How the command-line tools word a failed HTTP call: one line naming the call, the cause and the fix.

Shared by the debugging commands (``state dump``, ``trace``, ``plot-market``,
``debug-bundle``) and the scale-out tools (``rebalance``, ``rollout``), which also get their
client with its bearer token here (:func:`client`). It imports
httpx only inside the functions that need its exception classes, and never numpy or
the network modules, so that the scale-out tools stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlsplit

if TYPE_CHECKING:
    import httpx

BODY_LIMIT = 200  # characters of an answer's body quoted in an error message
E = TypeVar("E", bound=Exception)


DOT_SEGMENTS = {".": "%2E", "..": "%2E%2E"}  # an id spelt as a dot-segment, which a URL's path resolves away


def path_id(value: str) -> str:
    """``value`` (a market id, a request id) as one segment of a URL path: every character but the unreserved ones
    percent-encoded (``/`` too), and the ids ``.`` and ``..`` as ``%2E`` and ``%2E%2E``. Written as themselves they
    are dot-segments, which httpx (as any client following RFC 3986 §5.2.4) removes with the segment before them:
    ``/debug/markets/../state`` was sent as ``/debug/state``, a 404 of no route, and a ``DELETE`` of the market ``..``
    went to ``/neural``. The service reads the id decoded."""
    return DOT_SEGMENTS.get(value) or quote(value, safe="")


def bearer(token: str | None) -> dict[str, str]:
    """The ``Authorization: Bearer <token>`` header; no header for no (or an empty) token."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def client(token: str | None, timeout_s: float) -> httpx.Client:
    """An ``httpx.Client`` sending ``token`` as a bearer token on every call; ``timeout_s``: seconds each call
    waits (to connect, to send, for each part of the answer)."""
    import httpx

    return httpx.Client(timeout=timeout_s, headers=bearer(token))


def request_errors() -> tuple[type[BaseException], ...]:
    """What an HTTP call of a command can raise for a user's input: no answer (``httpx.HTTPError``), a ``--url``
    that is no URL (``httpx.InvalidURL`` is not an ``HTTPError``), a token an HTTP header cannot carry."""
    import httpx

    return httpx.HTTPError, httpx.InvalidURL, UnicodeEncodeError


def one_line(text: str, limit: int = BODY_LIMIT) -> str:
    """An answer's body (its first ``limit`` characters) for a one-line error message: another server's HTML
    error page spans many lines."""
    return " ".join(text[:limit].split()) or "(empty answer)"


def service_error_message(response: httpx.Response) -> str | None:
    """The ``error.message`` of a cerebellar-norse error answer; None for any other body (another server's)."""
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):  # not JSON (ValueError), or JSON of another shape
        return None
    return message if isinstance(message, str) and message else None


def answer_message(response: httpx.Response) -> str:
    """The ``error.message`` of a cerebellar-norse error answer; for any other body, the body on one line."""
    return service_error_message(response) or one_line(response.text)


def token_problem(whose: str = "the token") -> str:
    """Why a call with a bearer token of ``whose`` could not even be sent."""
    return f"{whose} holds a character an HTTP header cannot carry"


def call_failure(url: str, exc: BaseException, whose_token: str = "the token", advice: bool = True) -> str:
    """One line saying why a call to the service at ``url`` got no answer (``exc`` one of :func:`request_errors`);
    ``advice`` adds what to try for a token or an unreachable service."""
    import httpx

    if isinstance(exc, httpx.InvalidURL):
        return f"{url!r} is not a URL ({exc}) (fix: pass --url http://HOST:PORT)"
    if isinstance(exc, UnicodeEncodeError):
        return token_problem(whose_token) + (" (fix: pass the service's token)" if advice else "")
    reason = f"cannot reach the service at {url} ({type(exc).__name__}: {exc})"
    return reason + (": is it running there? (pass --url)" if advice else "")


def request_failure(method: str, url: str, exc: BaseException, timeout_s: float | None) -> str:
    """``METHOD URL: why`` for a call of the scale-out tools that got no answer (``exc`` one of
    :func:`request_errors`); a timeout names the server and ``timeout_s`` (seconds, their ``--timeout``)."""
    import httpx

    if isinstance(exc, UnicodeEncodeError):
        return f"{method} {url}: {token_problem()}"
    if isinstance(exc, httpx.TimeoutException) and timeout_s is not None:
        return (f"{method} {url}: {origin(url)} gave no answer within {timeout_s:g} s ({type(exc).__name__}; "
                "--timeout SECONDS waits longer)")
    return f"{method} {url}: {type(exc).__name__}: {exc}"


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url`` (the server a call went to); ``url`` itself when it has no host."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else url


def request(http: httpx.Client, method: str, url: str, error: type[E], **kw: Any) -> httpx.Response:
    """``http.request(method, url, **kw)``; no answer, or an answer with an HTTP error status, raises ``error``
    with one line ``METHOD URL: …`` (``HTTP <status>: <message>`` for the latter)."""
    try:
        r = http.request(method, url, **kw)
    except request_errors() as exc:
        raise error(request_failure(method, url, exc, http.timeout.read)) from None
    if r.status_code >= 400:
        raise error(f"{method} {url}: HTTP {r.status_code}: {answer_message(r)}")
    return r

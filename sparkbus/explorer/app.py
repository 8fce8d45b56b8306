"""The Explorer's web application (Starlette): pages rendered on the server from Jinja2 templates with
autoescaping (every body, property and name is shown as text), the same data as JSON under /api/, charts
as SVG images, and the changes as POST forms (sparkbus.explorer.changes).

One namespace per application. Its client and administration client are opened once and used by one
request at a time (a lock around every use): the Explorer is for people, and a request's work is a few
storage round trips. Each request's work runs in a worker thread, so the server keeps answering others.
Errors become pages (or JSON) that say what was wrong, never a traceback: a name or value refused is 400,
an entity or message that does not exist 404, a change refused by the namespace (quota, lock, status)
409, and a change asked of an Explorer started without allow_changes 403, with nothing written.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from datetime import datetime
from typing import Any, AsyncIterator, Awaitable, Callable, MutableMapping, Optional, TypeVar
from urllib.parse import quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import __version__
from ..client import ServiceBusClient
from ..core.shown import plain
from ..engine import clock
from ..core.wire import MAX_SEQUENCE_NUMBER
from ..exceptions import MessageNotFoundError, MessagingEntityNotFoundError, ServiceBusError
from ..management import ServiceBusAdministrationClient
from . import changes, charts, pages
from .security import (CSRF_FIELD, HEADERS, TOKEN_COOKIE, Access, bearer, loopback_host, new_token,
                       same, same_origin)

T = TypeVar("T")
PACKAGE = "sparkbus.explorer"


class Namespace:
    """The namespace an application shows: its clients, opened once, used under one lock."""

    def __init__(self, namespace: str) -> None:
        self.path = namespace
        self.client = ServiceBusClient(namespace)
        self.admin = ServiceBusAdministrationClient(namespace)
        self._lock = threading.Lock()

    async def run(self, work: Callable[[], T]) -> T:
        """work() in a worker thread, holding the lock."""
        def locked() -> T:
            with self._lock:
                return work()
        return await run_in_threadpool(locked)

    def close(self) -> None:
        self.client.close()
        self.admin.close()


def templates() -> jinja2.Environment:
    environment = jinja2.Environment(loader=jinja2.PackageLoader(PACKAGE, "templates"), autoescape=True,
                                     undefined=jinja2.StrictUndefined)
    environment.filters["path"] = lambda path: quote(path, safe="/")
    environment.filters["when"] = lambda value: "" if value is None else (
        value.strftime("%Y-%m-%d %H:%M:%S") if isinstance(value, datetime) else str(value))
    environment.filters["size"] = _size
    environment.filters["plain"] = plain
    environment.filters["json"] = lambda value: json.dumps(plain(value), ensure_ascii=False)  # text: escaped
    return environment


def _size(value: Optional[int]) -> str:
    if value is None:
        return ""
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024 or unit == "GiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return str(value)


class _Refused(Exception):
    """A request the Explorer answers with status and a message (and nothing done)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _status_of(error: BaseException) -> int:
    if isinstance(error, _Refused):
        return error.status
    if isinstance(error, (MessagingEntityNotFoundError, MessageNotFoundError)):
        return 404
    if isinstance(error, ServiceBusError):
        return 409
    if isinstance(error, (ValueError, TypeError)):
        return 400
    return 500


def create_app(namespace: str, *, allow_changes: bool = False, token: Optional[str] = None) -> ASGIApp:
    """The Explorer of a namespace (a path or object-store URI) as an ASGI application. token: required on
    every request (sparkbus.explorer.security); None serves loopback hosts only. allow_changes: whether
    pages offer changes and POST requests make them."""
    access = Access(token, allow_changes, new_token())
    ns = Namespace(namespace)
    env = templates()

    def page(request: Request, name: str, code: int = 200, **values: Any) -> HTMLResponse:
        values.update(namespace=namespace, version=__version__, allow_changes=allow_changes,
                      csrf=request.state.csrf, csrf_field=CSRF_FIELD, done=request.query_params.get("done", ""))
        return HTMLResponse(env.get_template(name).render(**values), status_code=code)

    def failure(request: Request, error: BaseException) -> Response:
        status = _status_of(error)
        kind = {403: "Forbidden", 404: "NotFound"}.get(status, "Refused") if isinstance(error, _Refused) \
            else type(error).__name__
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": kind, "message": str(error)}, status_code=status)
        return page(request, "error.html", status, status=status, message=str(error), kind=kind)

    def guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as error:  # every error a page (or JSON) that says what was wrong
                return failure(request, error)
        return run

    # ---- pages and their JSON -------------------------------------------------------------------------

    async def dashboard(request: Request) -> Response:
        board = await ns.run(lambda: pages.dashboard(ns.admin))
        return page(request, "dashboard.html", board=board)

    async def dashboard_json(request: Request) -> Response:
        board = await ns.run(lambda: pages.dashboard(ns.admin))
        return JSONResponse(plain(board) | {"entities": [plain(r) | {"used_percent": r.used_percent}
                                                         for r in board.entities]})

    async def entity(request: Request) -> Response:
        path = request.path_params["path"]
        view = await ns.run(lambda: pages.entity(ns.admin, path))
        return page(request, "entity.html", view=view, sub_queues=pages.SUB_QUEUES)

    async def entity_json(request: Request) -> Response:
        path = request.path_params["path"]
        return JSONResponse(plain(await ns.run(lambda: pages.entity(ns.admin, path))))

    def _page_arguments(request: Request) -> tuple[str, str, int, int]:
        query = request.query_params
        return (request.path_params["path"], query.get("queue", "active"), _number(query.get("from", "0"), "from"),
                _number(query.get("count", str(pages.PAGE_SIZE)), "count"))

    async def message_list(request: Request) -> Response:
        path, queue, start, count = _page_arguments(request)
        listed = await ns.run(lambda: pages.messages(ns.client, path, queue, start, count))
        return page(request, "messages.html", listing=listed, sub_queues=pages.SUB_QUEUES,
                    settlements=_settlements(queue))

    async def message_list_json(request: Request) -> Response:
        path, queue, start, count = _page_arguments(request)
        return JSONResponse(plain(await ns.run(lambda: pages.messages(ns.client, path, queue, start, count))))

    def _message_arguments(request: Request) -> tuple[str, str, int]:
        query = request.query_params
        return request.path_params["path"], query.get("queue", "active"), _number(query.get("seq", ""), "seq")

    async def one_message(request: Request) -> Response:
        path, queue, number = _message_arguments(request)
        found = await ns.run(lambda: pages.message(ns.client, path, queue, number))
        if found is None:
            raise MessageNotFoundError(f"no {queue} message {number} in {path!r} (settled, moved or never sent)")
        return page(request, "message.html", path=path, queue=queue, message=found, settlements=_settlements(queue))

    async def one_message_json(request: Request) -> Response:
        path, queue, number = _message_arguments(request)
        found = await ns.run(lambda: pages.message(ns.client, path, queue, number))
        if found is None:
            raise MessageNotFoundError(f"no {queue} message {number} in {path!r}")
        return JSONResponse(plain(found))

    async def chart(request: Request) -> Response:
        path, name = request.query_params.get("entity", ""), request.path_params["name"]
        if name not in ("throughput.svg", "partitions.svg"):
            raise _Refused(404, f"no chart {name!r}; charts: throughput.svg, partitions.svg")
        view = await ns.run(lambda: pages.entity(ns.admin, path))
        end = clock.now()
        svg = (charts.throughput_svg(view.metrics, f"{view.row.path}: messages per minute, last hour (UTC)",
                                     end - pages.METRICS_WINDOW, end)
               if name == "throughput.svg" else
               charts.partitions_svg(view.partitions, f"{view.row.path}: messages per partition now"))
        return Response(svg, media_type="image/svg+xml")

    # ---- changes --------------------------------------------------------------------------------------

    async def change(request: Request) -> Response:
        """Every POST: allowed at all, then the anti-forgery token, then the change itself."""
        if not allow_changes:
            raise _Refused(403, "this Explorer was started without --allow-changes: it shows the namespace and "
                                "changes nothing (nothing was changed)")
        form = await request.form()
        if not same(_text(form, CSRF_FIELD), request.state.csrf) or \
                not same_origin(request.headers.get("origin"), request.headers.get("host", "")):
            raise _Refused(403, "this request did not come from an Explorer page (its anti-forgery token is "
                                "missing or wrong); nothing was changed. Reload the page and try again")
        action = request.path_params["action"]
        if action not in ACTIONS:
            raise _Refused(404, f"no action {action!r}; actions: {', '.join(sorted(ACTIONS))}")
        done, where = await ns.run(lambda: ACTIONS[action](ns, form))
        return RedirectResponse(f"{where}{'&' if '?' in where else '?'}{urlencode({'done': done})}", status_code=303)

    routes = [
        Route("/", guarded(dashboard)),
        Route("/api/namespace", guarded(dashboard_json)),
        Route("/entities/{path:path}", guarded(entity)),
        Route("/api/entities/{path:path}", guarded(entity_json)),
        Route("/messages/{path:path}", guarded(message_list)),
        Route("/api/messages/{path:path}", guarded(message_list_json)),
        Route("/message/{path:path}", guarded(one_message)),
        Route("/api/message/{path:path}", guarded(one_message_json)),
        Route("/charts/{name}", guarded(chart)),
        Route("/actions/{action}", guarded(change), methods=["POST"]),
        Mount("/static", StaticFiles(packages=[(PACKAGE, "static")]), name="static"),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        ns.close()

    return _Guard(Starlette(routes=routes, lifespan=lifespan), access)


def _settlements(queue: str) -> tuple[str, ...]:
    return {"active": changes.SETTLEMENTS[:4], "deferred": changes.SETTLEMENTS[:4],
            "dead-letter": ("complete", "abandon"), "scheduled": ("cancel",)}.get(queue, ())


def _number(text: str, name: str) -> int:
    if not text.isdigit() or len(text) > 20 or int(text) > MAX_SEQUENCE_NUMBER:
        raise ValueError(f"{name} must be a whole number from 0 to {MAX_SEQUENCE_NUMBER}, got {text!r}")
    return int(text)


def _text(form: FormData, name: str) -> str:
    value = form.get(name, "")
    if not isinstance(value, str):
        raise ValueError(f"{name} must be text, not a file")
    return value


def _numbers(form: FormData, name: str) -> list[int]:
    found = []
    for value in form.getlist(name):
        if not isinstance(value, str):
            raise ValueError(f"{name} must be text, not a file")
        found.append(_number(value.strip(), name))
    return found


def _outgoing(form: FormData) -> changes.Outgoing:
    return changes.Outgoing(**{f.name: _text(form, f.name) for f in dataclasses.fields(changes.Outgoing)})


def _entity_page(path: str) -> str:
    return f"/entities/{quote(path, safe='/')}"


def _list_page(path: str, queue: str) -> str:
    return f"/messages/{quote(path, safe='/')}?{urlencode({'queue': queue})}"


def _send(ns: Namespace, form: FormData) -> tuple[str, str]:
    path = _text(form, "entity")
    repeat = _number(_text(form, "repeat").strip() or "1", "repeat count")
    sent = changes.send(ns.client, path, _outgoing(form), repeat)
    return f"sent {sent} message(s) to {path}", _entity_page(path)


def _settle(ns: Namespace, form: FormData) -> tuple[str, str]:
    path, queue = _text(form, "entity"), _text(form, "queue")
    pages.sub_queue(queue)
    done = changes.settle(ns.client, ns.admin, path, queue, _number(_text(form, "seq"), "seq"), _text(form, "action"),
                          reason=_text(form, "reason"), description=_text(form, "description"))
    return done, _list_page(path, queue)


def _resubmit(ns: Namespace, form: FormData) -> tuple[str, str]:
    path = _text(form, "entity")
    edit = _outgoing(form) if _text(form, "edited") == "yes" else None
    moved = changes.resubmit(ns.client, path, _numbers(form, "seq"), all_messages=_text(form, "all") == "yes",
                             to=_text(form, "to"), edit=edit)
    return f"resubmitted {moved} message(s)", _list_page(path, "dead-letter")


def _purge(ns: Namespace, form: FormData) -> tuple[str, str]:
    path, queue = _text(form, "entity"), _text(form, "queue") or "active"
    removed = changes.purge(ns.client, path, queue, _text(form, "confirm"))
    return f"purged {removed} message(s) from {path}" + (" (dead-letter)" if queue == "dead-letter" else ""), \
        _entity_page(path)


def _create(ns: Namespace, form: FormData) -> tuple[str, str]:
    path = changes.create_entity(ns.admin, _text(form, "kind"), _text(form, "name"), _text(form, "topic"),
                                 _text(form, "settings"))
    return f"created {path}", _entity_page(path)


def _update(ns: Namespace, form: FormData) -> tuple[str, str]:
    path = _text(form, "entity")
    changes.update_entity(ns.admin, path, _text(form, "settings"))
    return f"updated {path}", _entity_page(path)


def _delete(ns: Namespace, form: FormData) -> tuple[str, str]:
    path = _text(form, "entity")
    changes.delete_entity(ns.admin, path, _text(form, "confirm"))
    return f"deleted {path}", "/"


def _create_rule(ns: Namespace, form: FormData) -> tuple[str, str]:
    path = _text(form, "entity")
    changes.create_rule(ns.admin, path, _text(form, "name"), sql=_text(form, "sql"),
                        correlation=_text(form, "correlation"), action=_text(form, "sql_action"))
    return f"created rule {_text(form, 'name').strip()}", _entity_page(path)


def _delete_rule(ns: Namespace, form: FormData) -> tuple[str, str]:
    path = _text(form, "entity")
    changes.delete_rule(ns.admin, path, _text(form, "name"))
    return f"deleted rule {_text(form, 'name')}", _entity_page(path)


ACTIONS: dict[str, Callable[[Namespace, FormData], tuple[str, str]]] = {
    "send": _send, "settle": _settle, "resubmit": _resubmit, "purge": _purge, "create": _create,
    "update": _update, "delete": _delete, "create-rule": _create_rule, "delete-rule": _delete_rule}


class _Guard:
    """ASGI middleware in front of every route (sparkbus.explorer.security): the access token or a loopback
    Host, the anti-forgery token for the pages, and the security headers on every answer."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app, self.access = app, access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        request.state.csrf = self.access.csrf
        response = self._refusal(request)
        cookies: list[tuple[str, str]] = []
        if response is None and self.access.token is not None and "token" in request.query_params:
            query = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
            response = RedirectResponse(request.url.path + (f"?{query}" if query else ""), status_code=303)
            cookies.append((TOKEN_COOKIE, self.access.token))

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.lower().encode(), v.encode()) for k, v in HEADERS.items()]
                headers += [(b"set-cookie", f"{name}={value}; Path=/; HttpOnly; SameSite=Strict".encode())
                            for name, value in cookies]
                message = {**message, "headers": headers}
            await send(message)

        if response is not None:
            await response(scope, receive, send_with_headers)
        else:
            await self.app(scope, receive, send_with_headers)

    def _refusal(self, request: Request) -> Optional[Response]:
        """The answer to a request that may not be served (None: it may)."""
        token = self.access.token
        if token is None:
            if not loopback_host(request.headers.get("host", "")):
                return PlainTextResponse("this Explorer answers requests for localhost / 127.0.0.1 only "
                                         "(the Host header named another host)", status_code=403)
            return None
        given = [request.query_params.get("token"), request.cookies.get(TOKEN_COOKIE),
                 bearer(request.headers.get("authorization"))]
        if any(same(g, token) for g in given):
            return None
        message = "this Explorer requires its access token: open the URL with ?token=... that `sparkbus ui` printed"
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": "Forbidden", "message": message}, status_code=403)
        return PlainTextResponse(message, status_code=403)

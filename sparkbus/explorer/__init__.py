"""sparkbus Explorer: a web page to see and operate a namespace, as Service Bus Explorer and RabbitMQ's
management UI do. `sparkbus ui --namespace NS` serves it; `serve(namespace)` does the same from Python, and
in a notebook (Jupyter, Databricks) it serves in the background and the returned Explorer shows the
dashboard inline. Needs the `ui` extra (`pip install 'sparkbus[ui]'`).

The server runs uvicorn on a socket bound before serve returns, so a port already in use is an error of
the call (OSError), and port 0 picks a free one (Explorer.url names it).
"""
from __future__ import annotations

import signal
import socket
import threading
from typing import Optional

from ..engine.namespace import use_storage_options
from .security import DEFAULT_HOST, needs_token, new_token

DEFAULT_PORT = 8642


class Explorer:
    """A running Explorer: its URL (with the access token, when one is required), stop(), and in a
    notebook the dashboard as HTML (_repr_html_)."""

    def __init__(self, namespace: str, url: str, server: "object", thread: Optional[threading.Thread]) -> None:
        self.namespace = namespace
        self.url = url
        self._server = server
        self._thread = thread

    def stop(self) -> None:
        """Stop serving (the request under way finishes first)."""
        self._server.should_exit = True  # type: ignore[attr-defined]
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _repr_html_(self) -> str:
        from .notebook import dashboard_html

        return dashboard_html(self.namespace, self.url)

    def __repr__(self) -> str:
        return f"Explorer({self.namespace!r}, url={self.url!r})"


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ != "TerminalInteractiveShell"


def serve(namespace: str, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, allow_changes: bool = False,
          token: Optional[str] = None, storage_options: Optional[dict[str, str]] = None,
          block: Optional[bool] = None) -> Explorer:
    """Serve the Explorer of a namespace (a directory, file:// URI or object-store URI) on host:port.

    Args:
        namespace: The namespace to show.
        host: The address to listen on; any but 127.0.0.1 (or ::1, localhost) requires an access token.
        port: The port (0: a free one).
        allow_changes: Offer and accept changes (send, settle, resubmit, purge, entities and rules).
        token: The access token to require (default: generated when the address requires one).
        storage_options: Credentials of an object-store namespace (default: the environment's).
        block: Print the URL and serve until interrupted (default), or serve in a background thread and
            return at once (the default in a notebook).

    Returns:
        The Explorer (its url names the access token).

    Raises:
        ImportError: the `ui` extra is not installed.
        OSError: the address cannot be listened on (e.g. the port is in use).
        MessagingEntityNotFoundError: there is no namespace there.
    """
    try:
        import uvicorn
    except ImportError:
        raise ImportError("the Explorer needs the ui extra: pip install 'sparkbus[ui]'") from None
    from ..management import ServiceBusAdministrationClient
    from .app import create_app

    if storage_options:
        use_storage_options(namespace, storage_options)
    ServiceBusAdministrationClient(namespace).get_namespace_properties()  # no namespace there: fail now
    if token is None and needs_token(host):
        token = new_token()
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host.strip("[]"), port))
    listener.listen(64)
    bound = listener.getsockname()[1]
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    url = f"http://{shown}:{bound}/" + (f"?token={token}" if token else "")
    config = uvicorn.Config(create_app(namespace, allow_changes=allow_changes, token=token), log_level="warning",
                            lifespan="on")
    server = uvicorn.Server(config)
    if block is None:
        block = not _in_notebook()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, name="sparkbus-explorer", daemon=True)
    thread.start()
    explorer = Explorer(namespace, url, server, thread)
    if block:
        print(f"sparkbus Explorer of {namespace} ({'changes allowed' if allow_changes else 'read-only'}) at {url}"
              " (Ctrl-C stops)", flush=True)
        _until_stopped(explorer, thread)
    return explorer


def _until_stopped(explorer: Explorer, thread: threading.Thread) -> None:
    """Wait until the server ends, Ctrl-C or SIGTERM (from the main thread), then stop it gracefully."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while thread.is_alive() and not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    explorer.stop()


__all__ = ["DEFAULT_PORT", "Explorer", "serve"]

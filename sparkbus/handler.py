"""What senders and receivers share as handlers: once closed, every operation raises ValueError, as
azure-servicebus' handlers do after close() (a closed receiver could otherwise keep taking locks)."""
from __future__ import annotations

import functools
from typing import Any, Callable, Protocol, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


class _Handler(Protocol):
    _closed: bool

    @property
    def entity_path(self) -> str: ...


def requires_open(method: F) -> F:
    """Decorate a handler method: ValueError when the handler (with `_closed` and `entity_path`) is closed."""
    @functools.wraps(method)
    def run(self: _Handler, *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise ValueError(f"this {type(self).__name__} of {self.entity_path!r} is closed; get a new one from "
                             "the ServiceBusClient")
        return method(self, *args, **kwargs)
    return cast(F, run)

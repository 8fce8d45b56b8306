"""Connection strings: 'Endpoint=sparkbus://<namespace path or URI>;SharedAccessKeyName=..;SharedAccessKey=..;EntityPath=..'.
A namespace on an object store may also be written 'sparkbus+az://container/path' (any scheme after 'sparkbus+').

Code written for azure-servicebus ports by changing the import and the connection string. Keys are
matched case-insensitively; the SAS keys are accepted (no authentication happens on a local namespace).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .names import checked_name

SCHEME = "sparkbus://"
PLUS = "sparkbus+"
EXPECTED = "'Endpoint=sparkbus://<namespace path or URI>[;SharedAccessKeyName=...;SharedAccessKey=...][;EntityPath=<entity>]'"
_KEYS = {"endpoint": "Endpoint", "sharedaccesskeyname": "SharedAccessKeyName", "sharedaccesskey": "SharedAccessKey",
         "sharedaccesssignature": "SharedAccessSignature", "entitypath": "EntityPath"}


@dataclass(frozen=True)
class ServiceBusConnectionStringProperties:
    """The parts of a connection string, named as azure-servicebus names them; fully_qualified_namespace
    is the namespace's location (the Endpoint without 'sparkbus://')."""

    fully_qualified_namespace: str
    endpoint: str
    entity_path: Optional[str] = None
    shared_access_key_name: Optional[str] = None
    shared_access_key: Optional[str] = None
    shared_access_signature: Optional[str] = None


def parse_connection_string(conn_str: object) -> ServiceBusConnectionStringProperties:
    """Split a sparkbus connection string; ValueError saying the expected form when malformed, or when the
    EntityPath holds characters no entity name has (names.checked_name)."""
    if not isinstance(conn_str, str):
        raise TypeError(f"connection string must be a str, got {type(conn_str).__name__}")
    values: dict[str, str] = {}
    for part in (p.strip() for p in conn_str.split(";")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        canonical = _KEYS.get(name.strip().lower())
        if not sep or canonical is None:
            raise ValueError(f"malformed connection string part {part!r}; expected {EXPECTED}")
        values[canonical] = value.strip()
    endpoint = values.get("Endpoint")
    if not endpoint:
        raise ValueError(f"connection string has no Endpoint; expected {EXPECTED}")
    if not endpoint.lower().startswith((SCHEME, PLUS)):
        raise ValueError(f"Endpoint {endpoint!r} must use the sparkbus:// scheme (or sparkbus+<store>:// for an "
                         f"object store); expected {EXPECTED}")
    plus = endpoint.lower().startswith(PLUS)
    location = endpoint[len(PLUS):] if plus else endpoint[len(SCHEME):]
    if len(location) > 1:
        location = location.rstrip("/")
    if not location:
        raise ValueError(f"Endpoint {endpoint!r} names no namespace; expected {EXPECTED}")
    entity_path = values.get("EntityPath") or None
    if entity_path is not None:
        checked_name(entity_path, "EntityPath")
    return ServiceBusConnectionStringProperties(
        fully_qualified_namespace=location, endpoint=endpoint, entity_path=entity_path,
        shared_access_key_name=values.get("SharedAccessKeyName"), shared_access_key=values.get("SharedAccessKey"),
        shared_access_signature=values.get("SharedAccessSignature"))


def namespace_location(fully_qualified_namespace: object) -> str:
    """The namespace location a client was given: a path or URI, or the same after 'sparkbus://' (the
    form a connection string's Endpoint takes), so a value meant for either works."""
    if not isinstance(fully_qualified_namespace, str):
        raise TypeError(f"fully_qualified_namespace must be a str (a namespace path or URI), got "
                        f"{type(fully_qualified_namespace).__name__}")
    if fully_qualified_namespace.lower().startswith(SCHEME):
        return fully_qualified_namespace[len(SCHEME):].rstrip("/") or "/"
    if fully_qualified_namespace.lower().startswith(PLUS):  # sparkbus+az://container/path
        return fully_qualified_namespace[len(PLUS):]
    return fully_qualified_namespace

"""Connection strings: 'Endpoint=sparkbus://<namespace path or URI>;SharedAccessKeyName=..;SharedAccessKey=..;EntityPath=..'.

Code written for azure-servicebus ports by changing the import and the connection string. Keys are
matched case-insensitively; the SAS keys are accepted (no authentication happens on a local namespace).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

SCHEME = "sparkbus://"
EXPECTED = "'Endpoint=sparkbus://<namespace path or URI>[;SharedAccessKeyName=...;SharedAccessKey=...][;EntityPath=<entity>]'"
_KEYS = {"endpoint": "Endpoint", "sharedaccesskeyname": "SharedAccessKeyName", "sharedaccesskey": "SharedAccessKey",
         "sharedaccesssignature": "SharedAccessSignature", "entitypath": "EntityPath"}


@dataclass(frozen=True)
class ConnectionInfo:
    namespace: str
    entity_path: Optional[str] = None


def parse_connection_string(conn_str: object) -> ConnectionInfo:
    """Split a sparkbus connection string; ValueError saying the expected form when malformed."""
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
    if not endpoint.lower().startswith(SCHEME):
        raise ValueError(f"Endpoint {endpoint!r} must use the sparkbus:// scheme; expected {EXPECTED}")
    location = endpoint[len(SCHEME):]
    if len(location) > 1:
        location = location.rstrip("/")
    if not location:
        raise ValueError(f"Endpoint {endpoint!r} names no namespace; expected {EXPECTED}")
    return ConnectionInfo(namespace=location, entity_path=values.get("EntityPath") or None)

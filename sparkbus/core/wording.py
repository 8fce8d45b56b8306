"""How counts read in the lines sparkbus prints and logs."""
from __future__ import annotations

from typing import Optional


def plural(count: int, singular: str, many: Optional[str] = None) -> str:
    """'1 message', '3 messages', '0 copies' (many: the plural when it is not singular + 's')."""
    return f"{count} {singular if count == 1 else many or singular + 's'}"

"""Entity and rule name rules (Service Bus naming, case-insensitive) and entity paths.

Service Bus names are case-insensitive over the characters they allow: ASCII letters, digits, '.', '-', '_'
and '/'. Catalog keys are the lowercased name (key), and a name is checked as written before it is folded
(checked_name): str.lower maps some other characters to ASCII ones (KELVIN SIGN to 'k'), so a name create
refuses would otherwise reach an entity on every path that looks one up.
"""
from __future__ import annotations

import re

MAX_ENTITY_PATH = 260
MAX_CHILD_NAME = 50
SUBSCRIPTIONS_SEGMENT = "Subscriptions"
RULES_SEGMENT = "Rules"
DEFAULT_RULE_NAME = "$Default"
_RESERVED_SEGMENTS = {SUBSCRIPTIONS_SEGMENT.lower(), RULES_SEGMENT.lower()}
_SEGMENT = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")  # whole segment: fullmatch
_CHILD = _SEGMENT
_CHARACTERS = re.compile(r"[A-Za-z0-9._-]*")  # what one '/'-separated segment of any name may hold


def validate_entity_name(name: object, what: str = "queue") -> str:
    """A queue or topic path: 1-260 chars of letters, digits, '.', '-', '_' and '/'.

    Each '/'-separated segment starts and ends with a letter or digit (so no '..', no empty segment,
    nothing that leaves the namespace directory), and no segment may be 'Subscriptions' or 'Rules',
    which name the children of a topic.
    """
    if not isinstance(name, str):
        raise TypeError(f"{what} name must be a str, got {type(name).__name__}")
    if not 1 <= len(name) <= MAX_ENTITY_PATH:
        raise ValueError(f"{what} name must be 1 to {MAX_ENTITY_PATH} characters, got {len(name)}")
    for segment in name.split("/"):
        if not _SEGMENT.fullmatch(segment):
            raise ValueError(
                f"invalid {what} name {name!r}: use letters, digits, '.', '-', '_' and '/', each "
                "'/'-separated segment starting and ending with a letter or digit"
            )
        if segment.lower() in _RESERVED_SEGMENTS:
            raise ValueError(
                f"invalid {what} name {name!r}: the segment {segment!r} is reserved for subscription and rule paths"
            )
    return name


def validate_child_name(name: object, what: str = "subscription") -> str:
    """A subscription or rule name: 1-50 letters, digits, '.', '-', '_', starting and ending alphanumeric."""
    if not isinstance(name, str):
        raise TypeError(f"{what} name must be a str, got {type(name).__name__}")
    if what == "rule" and _is_default_rule(name):
        return name
    if not 1 <= len(name) <= MAX_CHILD_NAME or not _CHILD.fullmatch(name):
        raise ValueError(
            f"invalid {what} name {name!r}: 1 to {MAX_CHILD_NAME} letters, digits, '.', '-' or '_', "
            "starting and ending with a letter or digit"
            + (f" (or {DEFAULT_RULE_NAME!r})" if what == "rule" else "")
        )
    return name


def subscription_path(topic_name: str, subscription_name: str) -> str:
    """Service Bus entity path of a subscription: '<topic>/Subscriptions/<name>'."""
    return f"{topic_name}/{SUBSCRIPTIONS_SEGMENT}/{subscription_name}"


def rule_path(topic_name: str, subscription_name: str, rule_name: str) -> str:
    return f"{subscription_path(topic_name, subscription_name)}/{RULES_SEGMENT}/{rule_name}"


def checked_name(name: object, what: str = "entity") -> str:
    """name as given to look an entity, subscription or rule up, checked as written: TypeError unless a str,
    ValueError ("invalid <what> name") unless it is made of the characters Service Bus names use (ASCII
    letters, digits, '.', '-', '_', '/'; a rule's '$Default'). A name that passes may still name nothing."""
    if not isinstance(name, str):
        raise TypeError(f"{what} name must be a str, got {type(name).__name__}")
    if not name or not all(_CHARACTERS.fullmatch(s) or _is_default_rule(s) for s in name.split("/")):
        raise ValueError(f"invalid {what} name {name!r}: names are made of ASCII letters, digits, '.', '-', '_' "
                         "and '/', compared case-insensitively")
    return name


def key(path: object, what: str = "entity") -> str:
    """Catalog key of a name or path: Service Bus names are case-insensitive. The name is checked as written
    first (checked_name: TypeError, ValueError), so only ASCII letters are ever folded."""
    return checked_name(path, what).lower()


def _is_default_rule(name: str) -> bool:
    return name.isascii() and name.lower() == DEFAULT_RULE_NAME.lower()


def split_subscription_path(entity_path: str) -> tuple[str, str] | None:
    """('<topic>', '<subscription>') when entity_path names a subscription, else None."""
    parts = entity_path.split("/")
    if len(parts) >= 3 and parts[-2].lower() == SUBSCRIPTIONS_SEGMENT.lower():
        return "/".join(parts[:-2]), parts[-1]
    return None

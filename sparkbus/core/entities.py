"""Queue, topic and subscription properties (azure-servicebus names), their defaults and validation.

Every settable option has its default once, in EntityOptions (the typed record the engine reads), and
its validator once, in OPTIONS; each kind lists the options it accepts. Properties objects are mutable and update_* takes them back, as in azure-servicebus.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Callable, Optional, Union

from .durations import MAX_DURATION, format_duration, parse_duration

STATUSES = ("Active", "Disabled", "SendDisabled", "ReceiveDisabled")
AVAILABLE = "Available"
LIMITED = "Limited"


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _int_range(low: int, high: int) -> Callable[[str, object], int]:
    def check(name: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if not low <= value <= high:
            raise ValueError(f"{name} must be between {low} and {high}, got {value}")
        return value
    return check


def _duration_range(low: timedelta, high: timedelta) -> Callable[[str, object], timedelta]:
    def check(name: str, value: object) -> timedelta:
        parsed = parse_duration(value, name)
        if not low <= parsed <= high:
            raise ValueError(f"{name} must be between {format_duration(low)} and {format_duration(high)}, got {format_duration(parsed)}")
        return parsed
    return check


def _optional_duration_range(low: timedelta, high: timedelta) -> Callable[[str, object], Optional[timedelta]]:
    """A duration in [low, high], or None (off)."""
    within = _duration_range(low, high)

    def check(name: str, value: object) -> Optional[timedelta]:
        return None if value is None else within(name, value)
    return check


def _optional_name(name: str, value: object) -> Optional[str]:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a queue or topic name (str) or None, got {type(value).__name__}")
    return value


def _status(name: str, value: object) -> str:
    if value not in STATUSES:
        raise ValueError(f"{name} must be one of {list(STATUSES)}, got {value!r}")
    return value


def _tier_int(optional: bool) -> Callable[[str, object], Optional[int]]:
    """An int (or None when optional: the tier's default) whose allowed values depend on the tier, checked
    where the tier is known."""
    def check(name: str, value: object) -> Optional[int]:
        if optional and value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int{' or None' if optional else ''}, got {type(value).__name__} "
                            f"{value!r}")
        return value
    return check


def _metadata(name: str, value: object) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str or None, got {type(value).__name__}")
    if len(value) > 1024:
        raise ValueError(f"{name} must be at most 1024 characters, got {len(value)}")
    return value


MINUTE = timedelta(minutes=1)
MAX_ARCHIVE_RETENTION = timedelta(days=90)


@dataclass(frozen=True)
class EntityOptions:
    """An entity's settings as the engine reads them (options a kind does not have keep their defaults)."""

    enable_partitioning: bool = False
    requires_session: bool = False
    requires_duplicate_detection: bool = False
    max_size_in_megabytes: int = 1024
    max_message_size_in_kilobytes: Optional[int] = None
    duplicate_detection_history_time_window: timedelta = 10 * MINUTE
    lock_duration: timedelta = MINUTE
    max_delivery_count: int = 10
    default_message_time_to_live: timedelta = MAX_DURATION
    dead_lettering_on_message_expiration: bool = False
    dead_lettering_on_filter_evaluation_exceptions: bool = True
    forward_to: Optional[str] = None
    forward_dead_lettered_messages_to: Optional[str] = None
    status: str = "Active"
    # How long messages that left the entity are kept in its archive (sparkbus.engine.archive); None: off.
    archive_retention: Optional[timedelta] = None
    # Stored and returned as the SDK's; sparkbus does not act on them (docs/guides/porting.md, "Differences from Service Bus").
    auto_delete_on_idle: timedelta = MAX_DURATION
    enable_batched_operations: bool = True
    enable_express: bool = False
    user_metadata: Optional[str] = None
    filtering_messages_before_publishing: bool = False
    support_ordering: bool = True

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> "EntityOptions":
        """From the catalog's stored (JSON) form (options it lacks keep their defaults)."""
        values: dict[str, Any] = {k: parse_duration(v, k) if k in DURATION_OPTIONS and v is not None else v
                                  for k, v in data.items() if k in OPTIONS}
        return cls(**values)

    def changed(self, values: dict[str, Any]) -> "EntityOptions":
        """These options with values (option name -> value, as check_options returns them) set."""
        return replace(self, **values)

    def of_kind(self, kind: str) -> dict[str, Any]:
        """The options a queue, topic or subscription has, by name: what its SDK properties object carries."""
        return {name: getattr(self, name) for name in KIND_OPTIONS[kind]}

    def stored(self, kind: str) -> dict[str, Any]:
        """The catalog's stored (JSON) form of the options of kind."""
        return {k: format_duration(v) if k in DURATION_OPTIONS and v is not None else v
                for k, v in self.of_kind(kind).items()}


DEFAULTS = EntityOptions()


@dataclass(frozen=True)
class Option:
    """How a settable option is validated (its default is EntityOptions')."""

    check: Callable[[str, object], object]
    immutable: bool = False


OPTIONS: dict[str, Option] = {
    "enable_partitioning": Option(_bool, immutable=True),
    "requires_session": Option(_bool, immutable=True),
    # The partition key of a duplicate-detecting entity is the message id: changing it would move keys.
    "requires_duplicate_detection": Option(_bool, immutable=True),
    "max_size_in_megabytes": Option(_tier_int(optional=False)),
    "max_message_size_in_kilobytes": Option(_tier_int(optional=True)),
    "duplicate_detection_history_time_window": Option(_duration_range(timedelta(seconds=20), timedelta(days=7))),
    "lock_duration": Option(_duration_range(timedelta(seconds=5), 5 * MINUTE)),
    "max_delivery_count": Option(_int_range(1, 2_147_483_647)),
    "default_message_time_to_live": Option(_duration_range(timedelta(seconds=1), MAX_DURATION)),
    "dead_lettering_on_message_expiration": Option(_bool),
    "dead_lettering_on_filter_evaluation_exceptions": Option(_bool),
    "forward_to": Option(_optional_name),
    "forward_dead_lettered_messages_to": Option(_optional_name),
    "status": Option(_status),
    "archive_retention": Option(_optional_duration_range(MINUTE, MAX_ARCHIVE_RETENTION)),
    "auto_delete_on_idle": Option(_duration_range(5 * MINUTE, MAX_DURATION)),
    "enable_batched_operations": Option(_bool),
    "enable_express": Option(_bool),
    "user_metadata": Option(_metadata),
    "filtering_messages_before_publishing": Option(_bool),
    "support_ordering": Option(_bool),
}
# Accepted by create_*/update_* as the SDK accepts them, and dropped: shared access rules have no meaning
# on a namespace that is a directory (properties objects carry an empty list).
IGNORED_OPTIONS = ("authorization_rules",)
COMMON_SDK_OPTIONS = ("auto_delete_on_idle", "enable_batched_operations", "user_metadata")

QUEUE_OPTIONS = (
    "enable_partitioning", "max_size_in_megabytes", "requires_duplicate_detection",
    "duplicate_detection_history_time_window", "requires_session", "lock_duration", "max_delivery_count",
    "default_message_time_to_live", "dead_lettering_on_message_expiration", "forward_to",
    "forward_dead_lettered_messages_to", "max_message_size_in_kilobytes", "status", *COMMON_SDK_OPTIONS,
    "enable_express", "archive_retention",
)
TOPIC_OPTIONS = (
    "enable_partitioning", "max_size_in_megabytes", "requires_duplicate_detection",
    "duplicate_detection_history_time_window", "default_message_time_to_live",
    "max_message_size_in_kilobytes", "status", *COMMON_SDK_OPTIONS, "enable_express",
    "filtering_messages_before_publishing", "support_ordering", "archive_retention",
)
SUBSCRIPTION_OPTIONS = (
    "requires_session", "lock_duration", "max_delivery_count", "default_message_time_to_live",
    "dead_lettering_on_message_expiration", "dead_lettering_on_filter_evaluation_exceptions", "forward_to",
    "forward_dead_lettered_messages_to", "status", *COMMON_SDK_OPTIONS, "archive_retention",
)
KIND_OPTIONS = {"queue": QUEUE_OPTIONS, "topic": TOPIC_OPTIONS, "subscription": SUBSCRIPTION_OPTIONS}
DURATION_OPTIONS = {name for name in OPTIONS if isinstance(getattr(DEFAULTS, name), timedelta)} | {"archive_retention"}


def check_options(kind: str, values: dict[str, Any]) -> dict[str, Any]:
    """Validate user-given options of a kind; unknown names -> TypeError like an unexpected keyword."""
    allowed = KIND_OPTIONS[kind]
    values = {k: v for k, v in values.items() if k not in IGNORED_OPTIONS or kind == "subscription"}
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise TypeError(f"unknown {kind} option(s) {unknown}; allowed: {sorted(allowed)}")
    return {name: OPTIONS[name].check(name, value) for name, value in values.items()}


@dataclass
class _EntityCommon:
    name: str = ""
    partition_count: int = 1
    availability_status: str = AVAILABLE
    created_at_utc: Optional[datetime] = None
    updated_at_utc: Optional[datetime] = None


@dataclass
class _TopLevelCommon(_EntityCommon):
    enable_partitioning: bool = DEFAULTS.enable_partitioning
    max_size_in_megabytes: int = DEFAULTS.max_size_in_megabytes
    max_size_in_megabytes_per_partition: float = 1024.0
    total_max_size_in_megabytes: int = 1024
    requires_duplicate_detection: bool = DEFAULTS.requires_duplicate_detection
    duplicate_detection_history_time_window: timedelta = DEFAULTS.duplicate_detection_history_time_window
    default_message_time_to_live: timedelta = DEFAULTS.default_message_time_to_live
    max_message_size_in_kilobytes: Optional[int] = DEFAULTS.max_message_size_in_kilobytes
    status: str = DEFAULTS.status
    auto_delete_on_idle: timedelta = DEFAULTS.auto_delete_on_idle
    enable_batched_operations: bool = DEFAULTS.enable_batched_operations
    enable_express: bool = DEFAULTS.enable_express
    user_metadata: Optional[str] = DEFAULTS.user_metadata
    authorization_rules: list[Any] = field(default_factory=list[Any])
    archive_retention: Optional[timedelta] = DEFAULTS.archive_retention  # sparkbus: the archive (None: off)


@dataclass
class QueueProperties(_TopLevelCommon):
    """Properties of a queue (azure-servicebus QueueProperties) plus partition_count and sizes."""

    requires_session: bool = DEFAULTS.requires_session
    lock_duration: timedelta = DEFAULTS.lock_duration
    max_delivery_count: int = DEFAULTS.max_delivery_count
    dead_lettering_on_message_expiration: bool = DEFAULTS.dead_lettering_on_message_expiration
    forward_to: Optional[str] = DEFAULTS.forward_to
    forward_dead_lettered_messages_to: Optional[str] = DEFAULTS.forward_dead_lettered_messages_to


@dataclass
class TopicProperties(_TopLevelCommon):
    """Properties of a topic (azure-servicebus TopicProperties) plus partition_count and sizes."""

    filtering_messages_before_publishing: bool = DEFAULTS.filtering_messages_before_publishing
    support_ordering: bool = DEFAULTS.support_ordering
    size_in_bytes: int = 0


@dataclass
class SubscriptionProperties(_EntityCommon):
    """Properties of a subscription; it has its topic's partition count."""

    topic_name: str = ""
    requires_session: bool = DEFAULTS.requires_session
    lock_duration: timedelta = DEFAULTS.lock_duration
    max_delivery_count: int = DEFAULTS.max_delivery_count
    default_message_time_to_live: timedelta = DEFAULTS.default_message_time_to_live
    dead_lettering_on_message_expiration: bool = DEFAULTS.dead_lettering_on_message_expiration
    dead_lettering_on_filter_evaluation_exceptions: bool = DEFAULTS.dead_lettering_on_filter_evaluation_exceptions
    forward_to: Optional[str] = DEFAULTS.forward_to
    forward_dead_lettered_messages_to: Optional[str] = DEFAULTS.forward_dead_lettered_messages_to
    status: str = DEFAULTS.status
    auto_delete_on_idle: timedelta = DEFAULTS.auto_delete_on_idle
    enable_batched_operations: bool = DEFAULTS.enable_batched_operations
    user_metadata: Optional[str] = DEFAULTS.user_metadata
    archive_retention: Optional[timedelta] = DEFAULTS.archive_retention  # sparkbus: the archive (None: off)


PROPERTIES_CLASS: dict[str, Union[type[QueueProperties], type[TopicProperties], type[SubscriptionProperties]]] = {
    "queue": QueueProperties, "topic": TopicProperties, "subscription": SubscriptionProperties}


def settable_values(kind: str, props: object, changes: dict[str, Any]) -> dict[str, Any]:
    """The settable options carried by a properties object (or a mapping) given to update_*, with the
    keyword changes over them. A name (a sparkbus convenience) carries none, so it needs keyword changes:
    TypeError without any, as for anything else that is not properties."""
    names = KIND_OPTIONS[kind]
    if isinstance(props, str):
        if not changes:
            raise TypeError(f"update_{kind}({props!r}) changes nothing: give the {kind}'s properties (as get_{kind} "
                            f"returns them) or its name with settings to change, e.g. max_delivery_count=5")
        return dict(changes)
    if isinstance(props, dict):
        return {**{k: v for k, v in props.items() if k in names}, **changes}
    if not hasattr(props, "name"):
        raise TypeError(f"update_{kind} takes the {kind}'s properties (as get_{kind} returns them), a dict of them "
                        f"or its name, got {type(props).__name__}")
    return {**{name: getattr(props, name) for name in names if hasattr(props, name)}, **changes}


@dataclass
class _RuntimeCommon:
    name: str = ""
    size_in_bytes: int = 0
    active_message_count: int = 0
    deferred_message_count: int = 0  # sparkbus: the active messages that are deferred (counted in both)
    dead_letter_message_count: int = 0
    scheduled_message_count: int = 0
    transfer_message_count: int = 0
    transfer_dead_letter_message_count: int = 0
    total_message_count: int = 0
    created_at_utc: Optional[datetime] = None
    updated_at_utc: Optional[datetime] = None
    accessed_at_utc: Optional[datetime] = None
    partition_count: int = 1
    availability_status: str = AVAILABLE
    # sparkbus: what the entity's archive holds (sparkbus.engine.archive), not counted in size_in_bytes
    archive_message_count: int = 0
    archive_size_in_bytes: int = 0


@dataclass
class QueueRuntimeProperties(_RuntimeCommon):
    """Message counts and size of a queue, aggregated over its partitions."""


@dataclass
class TopicRuntimeProperties(_RuntimeCommon):
    """Message counts and size of a topic, aggregated over its partitions."""

    subscription_count: int = 0
    sql_filter_count: int = 0
    correlation_filter_count: int = 0


@dataclass
class SubscriptionRuntimeProperties(_RuntimeCommon):
    topic_name: str = ""


RUNTIME_CLASS: dict[str, Union[type[QueueRuntimeProperties], type[TopicRuntimeProperties],
                               type[SubscriptionRuntimeProperties]]] = {
    "queue": QueueRuntimeProperties, "topic": TopicRuntimeProperties, "subscription": SubscriptionRuntimeProperties}


def check_options_for(props: object, values: dict[str, Any]) -> dict[str, Any]:
    """Validate options against the kind of an existing properties object."""
    kind = next(k for k, cls in PROPERTIES_CLASS.items() if isinstance(props, cls))
    return check_options(kind, values)

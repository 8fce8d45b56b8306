"""Pure logic without Spark or storage: tiers, names, durations, typed values, connection strings."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pytest

from sparkbus.core import tiers
from sparkbus.core.connection import parse_connection_string
from sparkbus.core.durations import MAX_DURATION, format_duration, parse_duration
from sparkbus.core.names import split_subscription_path, validate_child_name, validate_entity_name
from sparkbus.core.values import check_properties, decode_properties, encode_properties

if TYPE_CHECKING:  # (the pure rules' tests import pyarrow only where a rule takes Arrow data)
    import pyarrow as pa


@pytest.mark.parametrize("tier,count,units,expected", [
    ("basic", None, 1, 1), ("standard", None, 1, 1), ("premium", None, 1, 1), ("premium", 2, 4, 2),
    ("premium", 4, 16, 4),
])
def test_valid_tiers(tier, count, units, expected):
    assert tiers.validate_tier(tier, count, units) == expected


@pytest.mark.parametrize("tier,count,units,error,text", [
    ("gold", None, 1, ValueError, "tier must be one of"),
    ("standard", 16, 1, ValueError, "only in the premium tier"),
    ("premium", 3, 1, ValueError, "partition_count must be one of [1, 2, 4]"),
    ("premium", 2, 3, ValueError, "messaging_units must be one of"),
    ("standard", None, 2, ValueError, "premium tier only"),
    ("premium", "2", 1, TypeError, "partition_count must be an int"),
])
def test_invalid_tiers(tier, count, units, error, text):
    with pytest.raises(error) as info:
        tiers.validate_tier(tier, count, units)
    assert text in str(info.value)


def test_overrides_only_lower_quotas():
    limits = tiers.default_limits("standard", 1, 1)
    assert (limits.max_entities, limits.max_partitioned_entities) == (10_000, 100)
    assert tiers.apply_overrides(limits, {"max_entities": 3}).max_entities == 3
    with pytest.raises(ValueError, match="between 1 and the tier's quota 100"):
        tiers.apply_overrides(limits, {"max_partitioned_entities": 101})
    with pytest.raises(TypeError, match="unknown namespace override"):
        tiers.apply_overrides(limits, {"max_queues": 1})


def test_premium_limits_and_sizes():
    limits = tiers.default_limits("premium", 4, 2)
    assert limits.max_entities == 2000 and limits.max_message_size_in_kilobytes == 1024
    assert 81920 in tiers.allowed_sizes_mb("premium") and 81920 not in tiers.allowed_sizes_mb("standard")
    assert tiers.total_size_mb("standard", 5120, 16) == 81920  # the seed's 5 GB x 16 = 80 GB
    assert tiers.size_per_partition_mb("premium", 4096, 4) == 1024


@pytest.mark.parametrize("name", ["orders", "a", "a.b-c_d", "sales/eu/orders", "x" * 260, "A1/b2"])
def test_entity_names_accepted(name):
    assert validate_entity_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * 261, "../escape", "a/../b", "/abs", "a//b", "a/", "-x", "x-",
                                  "a b", "a\\b", "orders/Subscriptions/x", "a/rules", "_catalog", "$x", "é"])
def test_entity_names_rejected(name):
    with pytest.raises(ValueError, match="name"):
        validate_entity_name(name)


def test_entity_name_type():
    with pytest.raises(TypeError):
        validate_entity_name(5)


def test_child_names():
    assert validate_child_name("sub-1.a_b") == "sub-1.a_b"
    assert validate_child_name("$Default", "rule") == "$Default"
    for bad in ("x" * 51, "a/b", "", "$Default", ".x"):
        with pytest.raises(ValueError, match="subscription name"):
            validate_child_name(bad)
    assert split_subscription_path("t/a/Subscriptions/s") == ("t/a", "s")
    assert split_subscription_path("queue") is None


def test_durations_round_trip():
    assert parse_duration("PT1M", "x") == timedelta(minutes=1)
    assert parse_duration("P1DT2H3M4.5S", "x") == timedelta(days=1, hours=2, minutes=3, seconds=4.5)
    assert parse_duration("P10675199DT2H48M5.4775807S", "x") == MAX_DURATION
    for value in (timedelta(seconds=30), timedelta(days=3, microseconds=7), MAX_DURATION, timedelta(0)):
        assert parse_duration(format_duration(value), "x") == value
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_duration("1 minute", "lock_duration")
    with pytest.raises(TypeError, match="lock_duration"):
        parse_duration(60, "lock_duration")


def test_typed_values_round_trip():
    props = {"s": "x", "i": 7, "f": 1.5, "b": True, "raw": b"\x00\xff", "n": None,
             "t": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc), "u": uuid.UUID(int=5)}
    back = decode_properties(encode_properties(check_properties(props, "p")))
    assert back == props and type(back["b"]) is bool and type(back["i"]) is int
    with pytest.raises(TypeError, match=r"p\['bad'\] has type list"):
        check_properties({"bad": [1]}, "p")


@pytest.mark.parametrize("conn,namespace,entity", [
    ("Endpoint=sparkbus:///tmp/ns;SharedAccessKeyName=k;SharedAccessKey=s", "/tmp/ns", None),
    ("Endpoint=sparkbus://./ns/;EntityPath=orders", "./ns", "orders"),
    ("endpoint=sparkbus://file:///tmp/ns;entitypath=q;", "file:///tmp/ns", "q"),
])
def test_connection_strings(conn, namespace, entity):
    info = parse_connection_string(conn)
    assert (info.fully_qualified_namespace, info.entity_path) == (namespace, entity)


@pytest.mark.parametrize("conn", ["Endpoint=sb://x.servicebus.windows.net/", "SharedAccessKey=x", "garbage",
                                  "Endpoint=sparkbus://", "Endpoint=sparkbus:///x;Colour=blue"])
def test_malformed_connection_strings(conn):
    with pytest.raises(ValueError, match="Endpoint=sparkbus://<namespace path or URI>"):
        parse_connection_string(conn)


def test_sdk_module_names_exist():
    import sparkbus
    import sparkbus.exceptions
    import sparkbus.management

    for name in sparkbus.exceptions.__all__:
        error = getattr(sparkbus.exceptions, name)
        assert getattr(sparkbus, name) is error and issubclass(error, sparkbus.exceptions.ServiceBusError)
    assert sparkbus.management.ServiceBusAdministrationClient is sparkbus.ServiceBusAdministrationClient


def test_retry_backoff_is_exponential_or_fixed_capped_and_jittered():
    from sparkbus.engine.retry import RetryPolicy

    exponential = RetryPolicy(total=5, backoff_factor=0.8, backoff_max=2.0)
    for retry, base in ((1, 0.8), (2, 1.6), (3, 2.0), (4, 2.0)):
        waits = [exponential.backoff(retry) for _ in range(200)]
        assert base * 0.8 <= min(waits) and max(waits) <= base * 1.2 and len(set(waits)) > 1
    fixed = RetryPolicy(backoff_factor=0.5, mode="fixed")
    assert all(0.4 <= fixed.backoff(retry) <= 0.6 for retry in (1, 5, 9))


def test_conformed_orders_relabels_and_casts_to_a_schema_without_copying_a_table_already_in_it():
    import pyarrow as pa

    from sparkbus.core.records import conformed
    schema = pa.schema([pa.field("n", pa.int64(), nullable=False), pa.field("s", pa.string())])
    exact = pa.table({"n": [1], "s": ["x"]}, schema=schema)
    assert conformed(exact, schema) is exact
    relabelled = conformed(pa.table({"s": ["x"], "n": [1]}), schema)  # other order, nullable n
    assert relabelled.schema.equals(schema) and relabelled.to_pylist() == [{"n": 1, "s": "x"}]
    widened = conformed(pa.table({"n": pa.array([2], pa.int32()), "s": ["y"]}), schema)
    assert widened.schema.equals(schema) and widened["n"].to_pylist() == [2]
    with pytest.raises(ValueError, match="'n' with null values to non-nullable"):
        conformed(pa.table({"n": pa.array([None], pa.int64()), "s": ["z"]}), schema)


def _choosing(rows: list[dict]) -> pa.Table:
    """Message rows with the columns a receive chooses on, in two chunks (as read from two files)."""
    import pyarrow as pa

    from sparkbus.core.schemas import MESSAGES

    names = ("partition_id", "sequence_number", "session_id", "enqueued_time_utc", "scheduled_enqueue_time_utc",
             "expires_at_utc", "born_dead_letter_reason", "born_dead_letter_description")
    full = [{name: row.get(name) for name in names} for row in rows]
    schema = pa.schema([MESSAGES.field(name) for name in names])
    half = len(full) // 2
    return pa.concat_tables([pa.Table.from_pylist(full[:half], schema), pa.Table.from_pylist(full[half:], schema)])


def test_candidates_choose_what_each_queue_may_lock_oldest_first():
    """transitions.candidates over messages in two chunks (out of order across them) and their state rows:
    what an active, deferred and dead-letter receive may lock, and the prior state each carries."""
    import pyarrow as pa

    from sparkbus.core import transitions
    from sparkbus.core.records import from_rows
    from sparkbus.core.schemas import ACTIVE, DEAD_LETTERED, DEFERRED, LOCKS

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    before, after = now - timedelta(minutes=1), now + timedelta(minutes=1)

    def message(seq, **values):
        return {"partition_id": 0, "sequence_number": seq, "enqueued_time_utc": before - timedelta(seconds=seq),
                "expires_at_utc": after + timedelta(days=1), **values}

    def state(seq, kind, count=1, until=None, reason=None):
        return {"partition_id": 0, "sequence_number": seq, "state": kind, "delivery_count": count,
                "lock_token": "t" if until else None, "locked_until_utc": until, "dead_letter_reason": reason,
                "dead_letter_error_description": None, "dead_letter_source": None, "updated_at_utc": before}

    messages = _choosing([
        message(7), message(3, session_id="s"), message(9, scheduled_enqueue_time_utc=after),  # not yet due
        message(5, born_dead_letter_reason="TTLExpiredException", born_dead_letter_description="born dead"),
        message(1), message(4), message(2), message(8), message(6), message(10),
    ])
    states = from_rows([
        state(1, ACTIVE, until=after),      # locked now
        state(2, ACTIVE, count=3, until=before),  # its lock lapsed
        state(4, DEFERRED), state(6, DEAD_LETTERED, reason="why"), state(8, "Completed"),
    ], LOCKS)

    whole = messages.append_column("body", pa.array([b"x"] * messages.num_rows))  # rows with bodies: filtered

    def chosen(queue, limit=100, **options):
        found = [transitions.candidates(rows, states, queue, now, limit, **options) for rows in (messages, whole)]
        assert found[1].drop_columns(["body"]).equals(found[0])
        one_chunk = transitions.candidates(messages.combine_chunks(), states, queue, now, limit, **options)
        assert one_chunk.equals(found[0])  # (taken in one step there, filtered and ordered here)
        return list(zip(found[0]["sequence_number"].to_pylist(), found[0]["lock_state"].to_pylist(),
                        found[0]["prior_deliveries"].to_pylist(), found[0]["prior_reason"].to_pylist()))

    assert chosen(ACTIVE) == [(2, ACTIVE, 3, None), (3, None, 0, None), (7, None, 0, None), (10, None, 0, None)]
    assert chosen(ACTIVE, limit=2) == [(2, ACTIVE, 3, None), (3, None, 0, None)]
    assert chosen(ACTIVE, session_id="s") == [(3, None, 0, None)]
    assert chosen(ACTIVE, sequence_numbers=[7, 10, 1]) == [(7, None, 0, None), (10, None, 0, None)]
    assert chosen(ACTIVE, enqueued_before=before - timedelta(seconds=7)) == [(10, None, 0, None)]
    assert chosen(DEFERRED) == [(4, DEFERRED, 1, None)]
    assert chosen(DEAD_LETTERED) == [(5, DEAD_LETTERED, 0, "TTLExpiredException"), (6, DEAD_LETTERED, 1, "why")]
    assert transitions.candidates(messages, states.slice(0, 0), ACTIVE, now, 3)["sequence_number"].to_pylist() == \
        [1, 2, 3]  # no state rows: every due message, the born-dead one aside
    schemas = {transitions.candidates(messages, states, ACTIVE, now, 100, **options).schema
               for options in ({}, {"session_id": "s"})}
    assert len(schemas) == 1  # chosen without a state row among them (nothing taken from the state rows): the same columns


def _state_rows(rows: list[dict]) -> pa.Table:
    """Locks-table rows, the columns not given null."""
    from sparkbus.core.records import from_rows
    from sparkbus.core.schemas import LOCKS

    return from_rows([{name: row.get(name) for name in LOCKS.names} for row in rows], LOCKS)


def test_settled_files_are_those_whose_every_number_has_a_state_row_that_is_not_active():
    """transitions.settled: a message file need not be read to choose from the active queue when every
    sequence number of its range has a state row other than ACTIVE; a gap, an active row (locked or
    lapsed), a range without statistics or a duplicated row never makes a file settled."""
    import math

    from sparkbus.core import transitions
    from sparkbus.core.schemas import ACTIVE, CANCELLED, COMPLETED, DEAD_LETTERED, DEFERRED

    def states(kinds: dict[int, str]):
        return _state_rows([{"partition_id": 0, "sequence_number": n, "state": kind, "delivery_count": 1}
                            for n, kind in kinds.items()])

    gone = {1: COMPLETED, 2: CANCELLED, 3: DEFERRED, 4: DEAD_LETTERED, 5: COMPLETED, 7: COMPLETED, 8: ACTIVE,
            9: COMPLETED}
    ranges = [(1, 5), (1, 1), (5, 7), (7, 9), (9, 9), (10, 12), (-math.inf, math.inf), (2, 4)]
    assert transitions.settled(ranges, states(gone)) == [True, True, False, False, True, False, False, True]
    assert transitions.settled(ranges, states({})) == [False] * len(ranges)
    assert transitions.settled([], states(gone)) == []
    twice = _state_rows([{"partition_id": 0, "sequence_number": n, "state": COMPLETED, "delivery_count": 1}
                         for n in (1, 1, 3)])  # two rows of 1 and none of 2: never counted as 1 and 2
    assert transitions.settled([(1, 2), (1, 3), (3, 3)], twice) == [False, False, True]


def test_files_whose_messages_are_settled_or_locked_beyond_now_hold_nothing_to_take_now():
    """transitions.settled given now: an ACTIVE row locked beyond now counts as one with nothing to take
    (another receiver holds it), a lock that lapsed by now or an unlocked active row does not, and the same
    files count again once their locks have lapsed."""
    from datetime import datetime, timedelta, timezone

    from sparkbus.core import transitions
    from sparkbus.core.schemas import ACTIVE, COMPLETED

    now = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
    later, earlier = now + timedelta(seconds=30), now - timedelta(seconds=1)
    rows = [(1, COMPLETED, None), (2, ACTIVE, later), (3, ACTIVE, later), (4, ACTIVE, now), (5, ACTIVE, earlier),
            (6, ACTIVE, None), (7, ACTIVE, later)]
    states = _state_rows([{"partition_id": 0, "sequence_number": n, "state": state, "delivery_count": 1,
                           "locked_until_utc": until} for n, state, until in rows])
    ranges = [(1, 3), (1, 4), (4, 4), (5, 5), (6, 6), (7, 7), (7, 8)]
    assert transitions.settled(ranges, states, now) == [True, False, False, False, False, True, False]
    assert transitions.settled(ranges, states) == [False, False, False, False, False, False, False]
    assert transitions.settled(ranges, states, later) == [False] * len(ranges)


def test_state_columns_are_read_once_per_table_and_answer_as_the_columns_do():
    """transitions.state_columns: the same object for the same state rows (settled, candidates and
    quiet_until of one receive share it), a new one for other rows; over rows in two chunks, with unset
    and set locks, unlocked, active, positions and deliveries say what the columns say."""
    import numpy as np
    import pyarrow as pa

    from sparkbus.core import transitions
    from sparkbus.core.records import micros
    from sparkbus.core.schemas import ACTIVE, COMPLETED

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    rows = [(5, ACTIVE, now + timedelta(seconds=5), 2), (3, COMPLETED, None, 1), (9, ACTIVE, now, 4),
            (1, ACTIVE, None, 7)]
    table = _state_rows([{"partition_id": 0, "sequence_number": n, "state": state, "delivery_count": count,
                          "locked_until_utc": until} for n, state, until, count in rows])
    states = pa.Table.from_batches([*table.slice(0, 2).to_batches(), *table.slice(2).to_batches()])
    assert states["sequence_number"].num_chunks == 2
    known = transitions.state_columns(states)
    assert transitions.state_columns(states) is known
    assert known.numbers.tolist() == [5, 3, 9, 1] and known.active.tolist() == [True, False, True, True]
    assert known.unlocked(micros(now)).tolist() == [False, True, True, True]  # a lock ending now has lapsed
    assert known.unlocked(micros(now) - 1).tolist() == [False, True, False, True]
    assert known.positions(np.array([9, 2, 1, 5, 3])).tolist() == [2, -1, 3, 0, 1]
    assert known.deliveries.tolist() == [2, 1, 4, 7]
    with pytest.raises(ValueError, match="read-only"):  # shared by every caller of these rows
        known.active[0] = False
    unlocked = _state_rows([{"partition_id": 0, "sequence_number": 1, "state": ACTIVE, "delivery_count": 1}])
    other = transitions.state_columns(unlocked)
    assert other is not known and other.table is unlocked and other.unlocked(0).tolist() == [True]
    empty = transitions.state_columns(unlocked.slice(0, 0))
    assert empty.positions(np.array([1, 2])).tolist() == [-1, -1]


def test_quiet_until_is_the_first_lock_to_lapse_or_schedule_to_fall_due():
    """transitions.quiet_until: after candidates found nothing in a partition, the earliest moment one of
    its messages could become receivable without a write: a lock of an active message lapsing or a
    scheduled message falling due (not a deferred message's or a completed one's); None when no moment."""
    from sparkbus.core import transitions
    from sparkbus.core.records import micros
    from sparkbus.core.schemas import ACTIVE, COMPLETED, DEFERRED

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    soon, later, latest = (now + timedelta(seconds=s) for s in (10, 20, 30))

    def message(seq, scheduled=None):
        return {"partition_id": 0, "sequence_number": seq, "enqueued_time_utc": now, "expires_at_utc": latest,
                "scheduled_enqueue_time_utc": scheduled}

    def state(seq, kind, until=None):
        return {"partition_id": 0, "sequence_number": seq, "state": kind, "delivery_count": 1,
                "lock_token": "t" if until else None, "locked_until_utc": until}

    messages = _choosing([message(1), message(2), message(3, scheduled=latest), message(4, scheduled=soon)])
    states = _state_rows([state(1, ACTIVE, until=later), state(2, DEFERRED, until=soon), state(4, COMPLETED)])
    assert transitions.candidates(messages, states, ACTIVE, now, 10).num_rows == 0
    assert transitions.quiet_until(messages, states, now) == micros(later)  # 2's lock is no active one's
    assert transitions.quiet_until(messages.slice(0, 2), states.slice(1, 2), now) is None  # 1 unlocked: none
    assert transitions.quiet_until(messages.slice(2, 1), states.slice(0, 0), now) == micros(latest)
    assert transitions.quiet_until(messages, states, latest) is None  # everything lapsed or due by then


def test_an_encoding_reused_for_an_equal_set_of_properties_is_the_one_encoding_it_gives():
    """checked_encoding looks up sets of properties it encoded before: what it returns is always what
    encoding that very set gives, with values equal in Python but not as properties (1, True, 1.0; 0.0
    and -0.0; a str and its bytes) kept apart, and a set that breaks a rule still refused."""
    from sparkbus.core import values

    sets = [{"n": 1}, {"n": True}, {"n": 1.0}, {"n": 0.0}, {"n": -0.0}, {"k": "x"}, {"k": b"x"},
            {"id": uuid.UUID(int=7)}, {"a": None}, {"a": "x" * 300}, {}]
    for _ in range(2):  # the second round from what the first kept
        for props in sets:
            assert values.checked_encoding(dict(props), "p") == values.encode_properties(props)
            assert values.decode_properties(values.checked_encoding(dict(props), "p")) == props
    assert values.decode_properties(values.checked_encoding({"n": -0.0}, "p"))["n"].hex() == (-0.0).hex()
    with pytest.raises(ValueError, match="surrogate"):
        values.checked_encoding({"k": "\ud800"}, "p")
    with pytest.raises(TypeError, match="keys must be str"):
        values.checked_encoding({1: "x"}, "p")

    class Lookalike:  # a key equal to a str key met before, but not a str
        def __hash__(self) -> int:
            return hash("k")

        def __eq__(self, other: object) -> bool:
            return other == "k"
    with pytest.raises(TypeError, match="keys must be str"):
        values.checked_encoding({Lookalike(): "x"}, "p")
    with pytest.raises(TypeError, match="has type list"):
        values.checked_encoding({"k": ["x"]}, "p")
    with pytest.raises(ValueError):
        values.checked_encoding({"n": 1 << 64}, "p")


def test_plan_locks_the_oldest_deliverable_and_moves_expired_and_overdelivered_ones_on_the_way():
    """transitions.plan over candidates: the delivered rows come first, locked with distinct uuid4 tokens
    (or received and deleted), and messages met before the count is reached that expired or reached
    the delivery limit are dead-lettered (or expired, for an expiry without dead-lettering)."""
    import pyarrow as pa

    from sparkbus.core import transitions
    from sparkbus.core.schemas import ACTIVE, DEAD_LETTERED, EXPIRED, LOCKS, RECEIVED_AND_DELETED, TS

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    micros = lambda moment: (moment - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)
    expires = [None, micros(now - timedelta(seconds=1)), micros(now + timedelta(days=1)), None, None]
    found = pa.table({"partition_id": pa.array([2] * 5, pa.int32()),
                      "sequence_number": pa.array([1, 2, 3, 4, 5], pa.int64()),
                      "expires_at_utc": pa.array(expires, pa.int64()).view(TS),
                      "lock_state": pa.array([None, None, ACTIVE, None, None], pa.string()),
                      "prior_deliveries": pa.array([0, 0, 10, 1, 0], pa.int32()),
                      "prior_reason": pa.nulls(5, pa.string()), "prior_description": pa.nulls(5, pa.string())})
    policy = transitions.Policy(lock_duration=timedelta(seconds=30), max_delivery_count=10, dead_letter_on_expiry=True)
    rows, deliver = transitions.plan(found, policy, now, ACTIVE, False, 2)
    assert rows.schema.equals(LOCKS) and deliver.tolist() == [0, 3]
    assert rows["sequence_number"].to_pylist() == [1, 4, 2, 3]  # delivered first, then those moved on the way
    assert rows["state"].to_pylist() == [ACTIVE, ACTIVE, DEAD_LETTERED, DEAD_LETTERED]
    assert rows["delivery_count"].to_pylist() == [1, 2, 0, 10]
    assert rows["dead_letter_reason"].to_pylist() == [None, None, transitions.EXPIRED_REASON,
                                                      transitions.MAX_DELIVERY_REASON]
    tokens = rows["lock_token"].to_pylist()[:2]
    assert len(set(tokens)) == 2 and all(uuid.UUID(token).version == 4 and str(uuid.UUID(token)) == token
                                         for token in tokens)
    assert rows["locked_until_utc"].to_pylist()[:2] == [now + timedelta(seconds=30)] * 2
    assert rows["updated_at_utc"].to_pylist() == [now] * 4
    removed, deliver = transitions.plan(found, transitions.Policy(timedelta(seconds=30), 10, False), now, ACTIVE,
                                        True, 5)
    assert deliver.tolist() == [0, 3, 4] and removed["sequence_number"].to_pylist() == [1, 4, 5, 2, 3]
    assert removed["state"].to_pylist() == [RECEIVED_AND_DELETED] * 3 + [EXPIRED, DEAD_LETTERED]  # gone: how
    assert removed["lock_token"].null_count == 5
    many = transitions.lock_token_array(20).to_pylist()  # (formatted vectorised past a few)
    assert len(set(many)) == 20 and all(str(uuid.UUID(token)) == token and uuid.UUID(token).version == 4
                                        for token in many)


def test_all_fresh_answers_alike_for_a_few_rows_and_for_many():
    """all_fresh compares a few rows as Python values and many with Arrow kernels: the same answer either
    way, for matching tokens, a wrong token, a lock too close to its end and a row without a lock."""
    from sparkbus.core import transitions
    from sparkbus.core.records import from_rows
    from sparkbus.core.schemas import ACTIVE, LOCKS

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def rows(count, until):
        return from_rows([{"partition_id": 0, "sequence_number": n, "state": ACTIVE, "delivery_count": 1,
                           "lock_token": f"t{n}", "locked_until_utc": until(n), "dead_letter_reason": None,
                           "dead_letter_error_description": None, "dead_letter_source": None,
                           "updated_at_utc": now} for n in range(count)], LOCKS)

    for count in (3, 40):
        tokens = [f"t{n}" for n in range(count)]
        held = rows(count, lambda n: now + timedelta(seconds=30))
        assert transitions.all_fresh(held, tokens, now)
        assert not transitions.all_fresh(held, [*tokens[:-1], "other"], now)
        assert not transitions.all_fresh(rows(count, lambda n: now + (transitions.FRESH_MARGIN if n == 1
                                                                      else timedelta(seconds=30))), tokens, now)
        assert not transitions.all_fresh(rows(count, lambda n: None if n == 2 else now + timedelta(seconds=30)),
                                         tokens, now)
        assert transitions.all_fresh(held.slice(1, count - 1), tokens[1:], now)  # a slice: its own offset


def test_stored_int64s_reads_a_columns_values_from_its_buffers_and_nulls_are_shared_arrays():
    import pyarrow as pa

    from sparkbus.core.records import nulls, stored_int64s
    from sparkbus.core.schemas import TS

    base = pa.array([10, 11, 12, 13, 14], pa.int64())
    column = pa.chunked_array([base.slice(1, 3).view(TS), pa.nulls(2, TS), pa.array([None, 20], pa.int64()).view(TS)])
    values = stored_int64s(column)
    valid = column.is_valid().to_pylist()
    assert [int(v) for v, ok in zip(values, valid) if ok] == [11, 12, 13, 20]
    assert stored_int64s(pa.chunked_array([], TS)).tolist() == []
    narrow = pa.chunked_array([pa.array([1, 2, 3, 4], pa.int32()).slice(1, 2), pa.array([-5], pa.int32())])
    assert stored_int64s(narrow).tolist() == [2, 3, -5] and stored_int64s(narrow).dtype.name == "int64"
    assert nulls(3, pa.string()) is nulls(3, pa.string()) and nulls(3, pa.string()).equals(pa.nulls(3, pa.string()))
    assert nulls(100, TS).equals(pa.nulls(100, TS))


def test_a_gone_state_says_how_the_message_left_and_from_which_queue():
    """transitions.left_as: the way a message left, prefixed when it left from a dead-letter sub-queue;
    completed, forwarded and purged rows (one at a time and as a table) carry it, and each is a gone state."""
    import pyarrow as pa

    from sparkbus.core import transitions
    from sparkbus.core.schemas import (ACTIVE, COMPLETED, DEAD_LETTERED, DEFERRED, FORWARDED, GONE_STATES, LOCKS,
                                       PURGED, TRANSFER_DEAD_LETTERED)

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert transitions.left_as(COMPLETED, None) == "completed"
    assert transitions.left_as(COMPLETED, DEFERRED) == "completed"
    assert transitions.left_as(COMPLETED, DEAD_LETTERED) == "dead_letter_completed"
    assert transitions.left_as(FORWARDED, TRANSFER_DEAD_LETTERED) == "dead_letter_forwarded"
    row = transitions.new_state(0, 7, DEAD_LETTERED, 3, now, reason="r", description="d")
    assert transitions.completed(row, now)["state"] == "dead_letter_completed"
    assert transitions.completed(row, now)["dead_letter_reason"] == "r"
    assert transitions.forwarded({**row, "state": ACTIVE}, now)["state"] == "forwarded"
    rows = _state_rows([{"partition_id": 0, "sequence_number": n, "state": s, "delivery_count": 1}
                        for n, s in ((1, ACTIVE), (2, DEAD_LETTERED), (3, DEFERRED))])
    assert transitions.completed_table(rows, now)["state"].to_pylist() == ["completed", "dead_letter_completed",
                                                                          "completed"]
    found = pa.table({"partition_id": pa.array([0, 0], pa.int32()), "sequence_number": pa.array([1, 2], pa.int64()),
                      "lock_state": pa.array([None, DEAD_LETTERED], pa.string()),
                      "prior_deliveries": pa.array([0, 2], pa.int32()),
                      "prior_reason": pa.array([None, "why"], pa.string()),
                      "prior_description": pa.nulls(2, pa.string())})
    purged = transitions.deleted(found, now)
    assert purged.schema.equals(LOCKS)
    assert purged["state"].to_pylist() == [PURGED, "dead_letter_purged"]
    assert purged["dead_letter_reason"].to_pylist() == [None, "why"] and purged["delivery_count"].to_pylist() == [0, 2]
    made = {transitions.left_as(way, prior) for way in ("completed", "received_and_deleted", "purged", "forwarded")
            for prior in (None, DEAD_LETTERED)} | {"expired", "cancelled"}
    assert made == set(GONE_STATES)

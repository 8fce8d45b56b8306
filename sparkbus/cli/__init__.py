"""The `sparkbus` command: apply namespace definitions, show a namespace, its metrics and plot them, scale
it (update-namespace), manage namespaces, entities and rules and run maintenance (sparkbus.cli.entities),
send, peek, receive and resubmit messages (sparkbus.cli.messages), mark partitions (operators), plan
capacity, and run background work: fan-out, forwarding, or all of it as the namespace service (`serve`).
`--json` gives scripts JSON instead of tables.

Every error is one line on stderr, never a traceback. Exit codes: 0 done; 2 a command line wrong in itself
(argparse's errors, an option's value malformed or out of range, options missing or excluding each other),
found before anything is opened: `sparkbus <command>: error: <message> (see sparkbus <command> --help)`;
1 refused or failed (sparkbus's errors, including the ValueErrors of its checks of names and settings;
unreadable files; storage): `sparkbus: <ErrorType>: <message>`; 130 interrupted (Ctrl-C); 141 stdout
closed by its reader (e.g. `| head`), quietly."""
from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import re
import signal
import sys
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn, Optional, Sequence, Union

from .. import __version__
from ..engine.namespace import use_storage_options
from ..capacity import format_plan, format_seed_table, plan, seed_table
from ..core.wording import plural
from ..definitions import apply_definition, load_definition
from ..engine.admin import EntityProperties, RuntimeProperties
from ..engine.availability import set_partition_availability
from ..engine.metrics import MINUTE, Metrics
from ..engine.namespace import NamespaceProperties
from ..management import ServiceBusAdministrationClient
from ..metrics import fitting_period, format_metrics, namespace_backlog, parse_period, plot_backlog, plot_metrics
from . import entities as cli_entities, messages as cli_messages, text as cli_text
from .entities import record
from .text import UsageError, credits_argument, pair, seconds, whole

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

COLUMNS = ("kind", "path", "partitions", "status", "availability", "active", "dead_letter", "scheduled",
           "total", "size_in_bytes", "awaiting_fanout")


def namespace_rows(admin: ServiceBusAdministrationClient) -> list[dict[str, object]]:
    """One row per queue, topic and subscription with its settings summary and runtime counts."""
    rows: list[dict[str, object]] = []

    def add(kind: str, path: str, props: EntityProperties, runtime: RuntimeProperties) -> None:
        rows.append({"kind": kind, "path": path, "partitions": props.partition_count, "status": props.status,
                     "availability": runtime.availability_status, "active": runtime.active_message_count,
                     "dead_letter": runtime.dead_letter_message_count,
                     "scheduled": runtime.scheduled_message_count, "total": runtime.total_message_count,
                     "size_in_bytes": runtime.size_in_bytes, "awaiting_fanout": None})

    for queue in admin.list_queues():
        add("queue", queue.name, queue, admin.get_queue_runtime_properties(queue.name))
    for topic in admin.list_topics():
        add("topic", topic.name, topic, admin.get_topic_runtime_properties(topic.name))
        rows[-1]["awaiting_fanout"] = admin.get_topic_awaiting_fanout(topic.name)
        for sub in admin.list_subscriptions(topic.name):
            add("subscription", f"{topic.name}/Subscriptions/{sub.name}", sub,
                admin.get_subscription_runtime_properties(topic.name, sub.name))
    return rows


def format_table(rows: list[dict[str, object]], columns: Sequence[str] = COLUMNS) -> str:
    """namespace_rows as a table (None, e.g. a queue's awaiting_fanout, left blank)."""
    return cli_text.format_table([{k: "" if v is None else v for k, v in r.items()} for r in rows], columns)


def _out(args: argparse.Namespace, human: str, data: Any) -> None:
    """Print human text, or with --json the data as one JSON object."""
    print(json.dumps(data, default=str) if args.json else human)


def _show(args: argparse.Namespace) -> None:
    admin = ServiceBusAdministrationClient(args.namespace)
    ns = admin.get_namespace_properties()
    rows = namespace_rows(admin)
    _out(args, f"{_namespace_line(ns)}\n{format_table(rows)}", {"namespace": record(ns), "entities": rows})
    if args.plot:
        print(f"plot written to {plot_backlog(namespace_backlog(admin), args.plot, namespace=args.namespace)}")


def _namespace_line(ns: NamespaceProperties) -> str:
    if ns.tier == "premium":
        limits = f"messaging_units={ns.messaging_units}"
    else:
        limits = "credits=" + ("off" if ns.credits_per_second is None else f"{ns.credits_per_second}/s")
    return f"namespace {ns.path}  tier={ns.tier}  partition_count={ns.partition_count}  {limits}"


def _metrics(args: argparse.Namespace) -> None:
    """Totals and per-period counts of the namespace or one entity (--period auto: per ten seconds for a run
    of a few minutes, else per minute); --plot also writes them as a PNG."""
    admin = ServiceBusAdministrationClient(args.namespace)

    def read(period: timedelta) -> Metrics:
        if args.entity:
            return admin.get_entity_metrics(args.entity, period=period)
        return admin.get_namespace_metrics(period=period)

    report = read(MINUTE if args.period == "auto" else args.period)
    if args.period == "auto" and fitting_period(report) != MINUTE:
        report = read(fitting_period(report))
    _out(args, format_metrics(report), record(report))
    if args.plot:
        print(f"plot written to {plot_metrics(report, args.plot, namespace=args.namespace)}")


def _ui(args: argparse.Namespace) -> None:
    """The Explorer (sparkbus.explorer.serve) until Ctrl-C or SIGTERM."""
    from ..explorer import serve

    serve(args.namespace, host=args.host, port=args.port, allow_changes=args.allow_changes, block=True)


def _process(args: argparse.Namespace) -> None:
    """A processor (sparkbus.processor) running --handler for every message of --entity until SIGTERM or
    Ctrl-C, which stop it gracefully: the handlers under way finish and settle."""
    import importlib

    from ..client import ServiceBusClient
    from ..core.names import split_subscription_path
    from ..processor import ServiceBusProcessor

    module_name, _, function_name = args.handler.partition(":")
    if not module_name or not function_name:
        raise UsageError(f"--handler takes MODULE:FUNCTION, e.g. workers.orders:handle, got {args.handler!r}")
    sys.path.insert(0, os.getcwd())  # a module beside the command, as `python -m` finds it
    handler = getattr(importlib.import_module(module_name), function_name, None)
    if not callable(handler):
        raise ValueError(f"{args.handler}: {module_name} has no function {function_name!r}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with ServiceBusClient(args.namespace) as client:
        subscription = split_subscription_path(args.entity)
        processor: ServiceBusProcessor
        if args.sessions:  # a session processor: --sessions sessions at once, --concurrency calls in each
            options: dict[str, Any] = {"max_concurrent_sessions": args.sessions,
                                       "max_concurrent_calls_per_session": args.concurrency}
            processor = client.get_subscription_session_processor(*subscription, handler, **options) \
                if subscription else client.get_queue_session_processor(args.entity, handler, **options)
            at_once = f"{args.sessions} sessions at a time, {args.concurrency} call(s) in each"
        else:
            processor = client.get_subscription_processor(*subscription, handler, max_concurrent_calls=args.concurrency) \
                if subscription else client.get_queue_processor(args.entity, handler, max_concurrent_calls=args.concurrency)
            at_once = f"{args.concurrency} at a time"
        processor.start()
        print(f"processing {args.entity} with {args.handler} ({at_once}; Ctrl-C stops)", flush=True)
        try:
            while not stop.wait(0.5) and processor.is_running:
                pass
        except KeyboardInterrupt:
            pass
        processor.stop()
    counts = processor.counts
    print(f"stopped: {counts.received} received, {counts.completed} completed, {counts.failed} failed", flush=True)


def _update_namespace(args: argparse.Namespace) -> None:
    """Scale a premium namespace or change a basic/standard namespace's credits per second."""
    changes = {name: vars(args)[name] for name in ("messaging_units", "credits_per_second") if name in vars(args)}
    if not changes:
        raise UsageError("update-namespace needs --messaging-units N (premium) or --credits-per-second N|off")
    ns = ServiceBusAdministrationClient(args.namespace).update_namespace(**changes)
    _out(args, _namespace_line(ns), record(ns))


def _apply(args: argparse.Namespace) -> None:
    report = apply_definition(load_definition(args.file), args.namespace)
    _out(args, "\n".join(report.changes) if report.changes else "no changes", {"changes": report.changes})


def _partition(args: argparse.Namespace) -> None:
    set_partition_availability(args.namespace, args.partition, args.available, entity_path=args.entity,
                               reason=args.reason)
    state = "available" if args.available else "unavailable"
    _out(args, f"partition {args.partition} of {args.entity or 'every entity'} is {state}",
         {"partition": args.partition, "entity": args.entity, "available": args.available})


def _capacity(args: argparse.Namespace) -> None:
    """A plan for --body-size, or Service Bus's measured table next to sparkbus's plans (--table)."""
    if args.table:
        if args.body_size is not None:
            raise UsageError("--table takes no --body-size")
        _out(args, format_seed_table(), {"rows": [record(row) for row in seed_table()]})
        return
    if args.body_size is None:
        raise UsageError("capacity needs --body-size BYTES (or --table)")
    properties = dict(args.property) if args.property else None
    result = plan(args.body_size, header_size=args.header_size, application_properties=properties,
                  max_size_in_megabytes=args.max_size_mb, tier=args.tier, enable_partitioning=args.partitioned,
                  subscriptions=args.subscriptions, partition_count=args.partition_count)
    _out(args, format_plan(result), record(result))


def _fanout(args: argparse.Namespace) -> None:
    """Fan out with a SparkSession of its own: once (everything pending), or until interrupted."""
    from ..spark import get_spark
    from ..streaming import fanout_once, start_fanout

    spark = get_spark("sparkbus-fanout")
    if args.once:
        done = fanout_once(spark, args.namespace, args.topic)
        print(f"fanned out everything pending on {args.topic or 'every topic'}: "
              f"{plural(done.messages, 'topic message')} as {plural(sum(done.copies.values()), 'copy', 'copies')}")
        return
    query = start_fanout(spark, args.namespace, args.topic,
                         trigger={"processingTime": f"{args.trigger_ms} milliseconds"})
    print(f"fanning out {args.topic or 'every topic'} (Ctrl-C stops)")
    _run_until_stopped(query)


def _forward(args: argparse.Namespace) -> None:
    """Forward with a SparkSession of its own: once (everything forwardable), or until interrupted."""
    from ..spark import get_spark
    from ..streaming import forward_once, start_forwarding

    spark = get_spark("sparkbus-forward")
    if args.once:
        done = forward_once(spark, args.namespace)
        print(f"forwarded everything forwardable: {plural(sum(done.forwarded.values()), 'message')} forwarded, "
              f"{sum(done.dead_lettered.values())} transfer-dead-lettered")
        return
    query = start_forwarding(spark, args.namespace, trigger={"processingTime": f"{args.trigger_ms} milliseconds"})
    print("forwarding (Ctrl-C stops)")
    _run_until_stopped(query)


def _send_batch(args: argparse.Namespace) -> None:
    """Send a parquet, CSV or JSON dataset: one atomic commit, or with --batch-rows N commits of about N rows
    (each atomic) with a progress bar; see messages_from_dataset for how rows become messages."""
    import math

    from pyspark.sql import functions as F

    from ..client import ServiceBusClient
    from ..spark import get_spark
    from ..spark.dataframes import ALL_COLUMNS, messages_from_dataset

    spark = get_spark("sparkbus-send-batch")
    reader = spark.read
    if args.format == "csv":
        reader = reader.option("header", "true").option("inferSchema", str(not args.no_infer_types).lower())
    properties = ALL_COLUMNS if args.property_columns == [ALL_COLUMNS] else args.property_columns or ()
    messages = messages_from_dataset(reader.format(args.format).load(args.input), args.body_column,
                                     property_columns=properties, field_columns=dict(args.field or ()))
    with ServiceBusClient(args.namespace, spark=spark) as client, client.get_queue_sender(args.entity) as sender:
        if not args.batch_rows:
            result = sender.send_dataframe(messages)
            sent = result.message_count
        else:
            total = messages.count()
            parts = max(1, math.ceil(total / args.batch_rows))
            fixed = messages.repartition(parts).localCheckpoint()  # partition i is the same rows every time
            sent = 0
            with cli_messages.progress("sending", total) as bar:
                for part in range(parts):
                    count = sender.send_dataframe(fixed.where(F.spark_partition_id() == part)).message_count
                    sent += count
                    bar.update(count)
    _out(args, f"sent {sent} message(s) from {args.input} to {args.entity}", {"sent": sent})


def _submit(args: argparse.Namespace) -> int:
    """Run a job through spark-submit (sparkbus.spark.submit); its exit code is the command's."""
    from ..spark.submit import run, submission

    return run(submission(args.job, args.job_args, master=args.master, conf=args.conf or ()))


def _period(text: str) -> Union[str, timedelta]:
    """--period: 'auto' or parse_period's forms."""
    if text == "auto":
        return text
    try:
        return parse_period(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _column_list(text: str) -> list[str]:
    """An argparse type: comma-separated column names, or '*'."""
    columns = [c.strip() for c in text.split(",")]
    if not all(columns):
        raise argparse.ArgumentTypeError(f"takes column names separated by commas, or '*', got {text!r}")
    return columns


def _run_until_stopped(query: StreamingQuery) -> None:
    from ..spark.background import stop_query

    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        stop_query(query)


def _serve(args: argparse.Namespace) -> None:
    """The namespace service until SIGTERM or Ctrl-C; the batch under way finishes first."""
    from ..spark import get_spark
    from ..streaming import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    service = serve(get_spark("sparkbus-serve"), args.namespace,
                    trigger={"processingTime": f"{args.trigger_ms} milliseconds"},
                    maintenance_interval=args.maintenance_interval)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5) and service.is_active:
            pass
    except KeyboardInterrupt:
        pass
    service.stop()


class _Parser(argparse.ArgumentParser):
    """argparse whose errors raise UsageError (main prints one line and returns 2) instead of printing the
    usage and exiting; every parser records its prog, so the errors of a command name it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.set_defaults(command_prog=self.prog)

    def error(self, message: str) -> NoReturn:
        choice = _INVALID_CHOICE.search(message)
        if choice is not None:
            choices = re.findall(r"'([^']*)'", choice["choices"])
            if len(choices) > 8:  # (the commands: --help lists them by group)
                message = message[:choice.end("word") + 1]
            message += _did_you_mean(choice["word"], choices)
        raise UsageError(message, self.prog)


_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<word>[^']*)' \(choose from (?P<choices>.*)\)$")


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    """'; did you mean X?' for the choice closest to a mistyped word, or '' when none is close."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string of parser and of the commands under it."""
    found: list[str] = []
    for action in parser._actions:
        found += action.option_strings
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _option_strings(sub)
    return found


def _misspelled(argv: Optional[Sequence[str]], parser: argparse.ArgumentParser, message: str) -> str:
    """For an error other than the unrecognized-arguments one (e.g. a required --namespace missing because
    it was typed --namspace): '; unrecognized option X, did you mean Y?' for the first unknown option of argv."""
    if message.startswith("unrecognized arguments"):
        return ""
    known = sorted(set(_option_strings(parser)))
    for word in sys.argv[1:] if argv is None else argv:
        option = word.split("=", 1)[0]
        if option.startswith("--") and option != "--" and option not in known:
            return f"; unrecognized option {option}{_did_you_mean(option, known).replace(';', ',', 1)}"
    return ""


_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}


def _error_line(text: str) -> None:
    """text on stderr as one line: line breaks and lone surrogates (which can come with the values an error
    quotes, e.g. arguments that were not UTF-8) escaped."""
    line = text.translate(_LINE_BREAKS).encode("utf-8", "backslashreplace").decode("utf-8")
    print(line, file=sys.stderr)


def _quiet_stdout() -> None:
    """After stdout's reader went away: stdout to the null device, so the flush at exit cannot fail too."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (stdout replaced, e.g. in tests): nothing to flush to
        pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line argv (default: sys.argv[1:]) and return its exit code (module docstring)."""
    try:
        return _main(argv)
    except KeyboardInterrupt as interrupt:
        _error_line(f"sparkbus: interrupted: {interrupt}" if str(interrupt) else "sparkbus: interrupted")
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return 141


def _main(argv: Optional[Sequence[str]]) -> int:
    parser = _parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            options = [u.split("=", 1)[0] for u in unknown if u.startswith("--")]
            hint = _did_you_mean(options[0], sorted(set(_option_strings(parser)))) if options else ""
            raise UsageError(f"unrecognized arguments: {' '.join(unknown)}{hint}", args.command_prog)
    except SystemExit as done:  # --help printed the help
        return done.code if isinstance(done.code, int) else 0
    except UsageError as error:
        prog = error.prog or parser.prog
        _error_line(f"{prog}: error: {error}{_misspelled(argv, parser, str(error))} (see {prog} --help)")
        return 2
    try:
        if getattr(args, "storage_option", None):
            use_storage_options(args.namespace, dict(args.storage_option))
        code = args.run(args)
        sys.stdout.flush()  # a reader that went away (BrokenPipeError) is found here, not at exit
    except UsageError as error:
        _error_line(f"{args.command_prog}: error: {error} (see {args.command_prog} --help)")
        return 2
    except BrokenPipeError:
        raise
    except Exception as error:  # refused or failed: one line, no traceback, whatever was raised
        _error_line(f"sparkbus: {type(error).__name__}: {error}")
        return 1
    return code if isinstance(code, int) else 0


NAMESPACE_VARIABLE = "SPARKBUS_NAMESPACE"  # the namespace of every command not given --namespace
# The commands as `sparkbus --help` lists them: by what they are for, in the order people reach for them.
COMMAND_GROUPS = (
    ("messages", ("send", "peek", "receive", "dead-letter", "replay", "send-batch")),
    ("entities", ("queue", "topic", "subscription", "rule", "apply")),
    ("looking at a namespace", ("ui", "show", "metrics", "capacity")),
    ("running a namespace", ("namespace", "update-namespace", "serve", "process", "fanout", "forward", "maintain",
                             "partition", "submit")),
)


def _grouped(commands: "argparse._SubParsersAction[_Parser]") -> str:
    """The command list of the top-level help, by COMMAND_GROUPS, each command once with its help line
    (argparse's own list is left out: it named every command twice, in the order they were added)."""
    helps = {action.dest: action.help or "" for action in commands._choices_actions}
    listed = [name for _, names in COMMAND_GROUPS for name in names]
    assert sorted(listed) == sorted(helps), "every command is in one group"
    width = max(map(len, listed)) + 2
    lines = []
    for title, names in COMMAND_GROUPS:
        lines += [f"{title}:"] + [f"  {name.ljust(width)}{helps[name]}" for name in names] + [""]
    commands._choices_actions.clear()
    return "\n".join(lines) + f"A command on a namespace takes --namespace, by default ${NAMESPACE_VARIABLE}; " \
        "sparkbus <command> --help says more."


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sparkbus", description="Azure Service Bus on Spark and Delta Lake",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sparkbus {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="<command>", help=argparse.SUPPRESS)
    apply = commands.add_parser("apply", help="create or update entities from a namespace definition (TOML)")
    apply.add_argument("file")
    apply.set_defaults(run=_apply)
    show = commands.add_parser("show", help="print entities and their runtime properties")
    show.add_argument("--plot", metavar="FILE.png",
                      help="also draw each entity's messages by state and per partition into FILE.png")
    show.set_defaults(run=_show)
    met = commands.add_parser("metrics", help="request and message counts per period (and a PNG plot of them)")
    met.add_argument("--entity", help="one queue, topic or '<topic>/Subscriptions/<name>'; default: the namespace")
    met.add_argument("--period", type=_period, default="auto",
                     help="10s, 30s, 1m, 5m, 1h, ... (a multiple of 10 seconds); default auto: per ten seconds "
                          "when the counts span at most ten minutes, else per minute")
    met.add_argument("--plot", metavar="FILE.png", help="also draw throughput and throttled requests into FILE.png")
    met.set_defaults(run=_metrics)
    ui = commands.add_parser("ui", help="the Explorer: a web page to see and operate the namespace (sparkbus[ui])")
    ui.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default 127.0.0.1); any other requires the access token printed")
    ui.add_argument("--port", type=whole(0, 65535), default=8642, help="port (default 8642; 0: any free port)")
    ui.add_argument("--allow-changes", action="store_true",
                    help="offer and accept changes: send, settle, resubmit, purge, entities and rules "
                         "(default: read-only)")
    ui.set_defaults(run=_ui)
    proc = commands.add_parser("process", help="run a handler for every message of a queue or subscription")
    proc.add_argument("--entity", required=True, help="queue or '<topic>/Subscriptions/<name>'")
    proc.add_argument("--handler", required=True, metavar="MODULE:FUNCTION",
                      help="the function called with each message's context (sparkbus.processor), e.g. jobs.work:handle")
    proc.add_argument("--concurrency", type=whole(1, 256), default=1,
                      help="handlers at a time (default 1); with --sessions, in each session")
    proc.add_argument("--sessions", type=whole(1, 256), default=0, metavar="N",
                      help="a session-enabled entity: hold N sessions at once, each session's messages in order")
    proc.set_defaults(run=_process)
    upd = commands.add_parser("update-namespace", help="scale a premium namespace or set the credit budget")
    upd.add_argument("--messaging-units", type=whole(1), default=argparse.SUPPRESS, help="premium: 1, 2, 4, 8 or 16")
    upd.add_argument("--credits-per-second", type=credits_argument, default=argparse.SUPPRESS,
                     help="basic/standard: credits per second, or 'off'")
    upd.set_defaults(run=_update_namespace)
    part = commands.add_parser("partition", help="mark a partition unavailable or available again (operators)")
    part.add_argument("--partition", type=whole(0), required=True)
    part.add_argument("--entity", help="queue, topic or '<topic>/Subscriptions/<name>'; default: every entity")
    state = part.add_mutually_exclusive_group(required=True)
    state.add_argument("--unavailable", dest="available", action="store_false")
    state.add_argument("--available", dest="available", action="store_true")
    part.add_argument("--reason", default="")
    part.set_defaults(run=_partition)
    cap = commands.add_parser("capacity", help="how many messages of a size fit in a queue or topic (no namespace)")
    cap.add_argument("--body-size", type=whole(0), help="message body bytes")
    cap.add_argument("--header-size", type=whole(0), help="message header bytes (default: estimated)")
    cap.add_argument("--property", action="append", type=pair, metavar="KEY=VALUE",
                     help="a string application property, to estimate the header (repeatable)")
    cap.add_argument("--max-size-mb", type=whole(1), default=1024, help="the entity's max_size_in_megabytes")
    cap.add_argument("--tier", default="standard", help="basic, standard or premium")
    cap.add_argument("--partitioned", action="store_true", help="enable_partitioning (basic/standard: 16 partitions)")
    cap.add_argument("--partition-count", type=whole(1), help="the premium namespace's partition count (1, 2 or 4)")
    cap.add_argument("--subscriptions", type=whole(0), default=0, help="plan a topic with this many subscriptions")
    cap.add_argument("--table", action="store_true", help="Service Bus's measured queue capacities next to sparkbus's")
    cap.set_defaults(run=_capacity)
    fan = commands.add_parser("fanout", help="copy topic messages to their subscriptions (a Spark streaming query)")
    fan.add_argument("--topic", help="one topic; default: every topic, including topics created later")
    fan.add_argument("--once", action="store_true", help="fan out everything pending, then exit")
    fan.add_argument("--trigger-ms", type=whole(0), default=500, help="micro-batch interval when running continuously")
    fan.set_defaults(run=_fanout)
    forward = commands.add_parser("forward", help="move messages of entities with forward_to (a Spark streaming query)")
    forward.add_argument("--once", action="store_true", help="forward everything forwardable, then exit")
    forward.add_argument("--trigger-ms", type=whole(0), default=500,
                         help="micro-batch interval when running continuously")
    forward.set_defaults(run=_forward)
    batch = commands.add_parser("send-batch", help="send a parquet, CSV or JSON dataset (Spark), one row a message")
    batch.add_argument("--entity", required=True, help="queue or topic")
    batch.add_argument("--input", required=True, help="file or directory of the dataset")
    batch.add_argument("--format", default="parquet", choices=("parquet", "csv", "json"))
    batch.add_argument("--body-column", help="the column that is the body; default 'body', else the row as JSON")
    batch.add_argument("--property-columns", type=_column_list, metavar="COL,COL|*",
                       help="columns that become application properties, typed ('*': every column not the body "
                            "or a field)")
    batch.add_argument("--field", action="append", type=pair, metavar="FIELD=COLUMN",
                       help="a message field from a column, e.g. session_id=customer, time_to_live=ttl_seconds, "
                            "scheduled_enqueue_time_utc=due (default: columns named like the fields; repeatable)")
    batch.add_argument("--no-infer-types", action="store_true",
                       help="CSV: keep every column a string (default: numbers, booleans and times are inferred)")
    batch.add_argument("--batch-rows", type=whole(0), default=0, help="rows per commit; default 0: one atomic commit")
    batch.set_defaults(run=_send_batch)
    job = commands.add_parser("submit", help="run a job script through spark-submit (this Python, WARN logging)")
    job.add_argument("--master", help="the Spark master (default: spark-submit's, local[*])")
    job.add_argument("--conf", action="append", type=pair, metavar="KEY=VALUE", help="a Spark setting (repeatable)")
    job.add_argument("job", help="a job script, or the name of one in ./jobs (demo, send_batch, fanout, serve, ...)")
    job.add_argument("job_args", nargs=argparse.REMAINDER, help="the job's own arguments")
    job.set_defaults(run=_submit)
    serve = commands.add_parser("serve", help="run all background work of the namespace until SIGTERM or Ctrl-C")
    serve.add_argument("--trigger-ms", type=whole(0), default=500, help="micro-batch interval")
    serve.add_argument("--maintenance-interval", type=seconds(zero=False), default=30.0,
                       help="seconds between maintenance sweeps (retention, compaction, log cleanup)")
    serve.set_defaults(run=_serve)
    messaging = cli_messages.register(commands)
    management = cli_entities.register(commands)
    for sub in (apply, show, met, upd, part, cap, batch):
        sub.add_argument("--json", action="store_true", help="one JSON object instead of text")
    default = os.environ.get(NAMESPACE_VARIABLE) or None
    for sub in (apply, show, met, ui, proc, upd, part, fan, forward, batch, serve, *messaging, *management):
        sub.add_argument("--namespace", required=default is None, default=default,
                         help="namespace directory, file:// URI or object-store URI (az://, abfss://, s3://); "
                              f"default: ${NAMESPACE_VARIABLE}" + (f" ({default})" if default else " (not set)"))
        sub.add_argument("--storage-option", action="append", type=pair, metavar="KEY=VALUE",
                         help="a storage option of an object-store namespace (account_key, sas_token, ...); "
                              "default: the environment's credentials (repeatable)")
    parser.epilog = _grouped(commands)
    parser.usage = "%(prog)s [-h] [--version] <command> ..."  # (set once the commands' prog is made without it)
    return parser


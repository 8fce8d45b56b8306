"""The command line over bad input, as a hostile user would type it: every refusal is one line on stderr
and no traceback, exit code 2 for a command line wrong in itself (`sparkbus <command>: error: ...`) and 1
for what sparkbus refuses or cannot read (`sparkbus: <ErrorType>: ...`), and nothing under the namespace's
directory changes. Plus the nesting limit of the files the command line reads (JSON lines, TOML)."""
from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys

import pytest

import sparkbus
from sparkbus import ServiceBusMessage
from sparkbus.cli import main
from sparkbus.definitions import MAX_NESTING_DEPTH, apply_definition, load_definition
from sparkbus.storage import maintenance
from conftest import files_under, wait_until

# The namespace's request metrics count a refused request as a user error (as Service Bus does): the one
# table a refused command may add to, when its process flushes its metrics (files_under(metrics=False)).
USAGE_LINE = re.compile(r"(sparkbus(?: [\w-]+)*): error: .+ \(see \1 --help\)\n")
REFUSAL_LINE = re.compile(r"sparkbus: \w+: .+\n")
LATE = 2500  # good lines before the bad one of late.jsonl: several full batches


def assert_one_error_line(err: str, code: int) -> None:
    assert "Traceback" not in err and err.endswith("\n") and len(err.splitlines()) == 1, err
    assert (USAGE_LINE if code == 2 else REFUSAL_LINE).fullmatch(err), err


FILES = {
    "deep.jsonl": '{"body": "x", "application_properties": {"k": ' + "[" * 40 + "]" * 40 + "}}\n",
    "deeper.jsonl": "[" * 100_000 + "\n",
    "deep_objects.jsonl": '"fine"\n' + '{"a": ' * 5000 + "1" + "}" * 5000 + "\n",
    "nul.jsonl": "\x00\x01{[\n",
    "third.jsonl": '"a"\n"b"\n{"bod": 1}\n',
    "late.jsonl": "".join(json.dumps({"body": "x" * 200, "subject": str(i)}) + "\n" for i in range(LATE))
                  + '{"body": "x", "session_id": ""}\n',
    "unknown.jsonl": '{"body": "x", "colour": "red"}\n',
    "not_a_message.jsonl": "[1, 2]\n",
    "int_body.jsonl": '{"body": 5}\n',
    "nested_property.jsonl": '{"body": "x", "application_properties": {"k": [1]}}\n',
    "huge_int.jsonl": '{"body": "x", "application_properties": {"n": ' + "9" * 5000 + "}}\n",
    # values with no wire form: sparkbus refuses them as azure-servicebus's encoder does
    "surrogate_value.jsonl": '{"body": "x", "application_properties": {"k": "\\ud800"}}\n',
    "surrogate_key.jsonl": '{"body": "x", "application_properties": {"\\udfff": 1}}\n',
    "surrogate_subject.jsonl": '{"body": "x", "subject": "\\ud800"}\n',
    "surrogate_body.jsonl": '"\\udc80"\n',
    "big_int.jsonl": '{"body": "x", "application_properties": {"n": 1267650600228229401496703205376}}\n',
    "no_session.jsonl": '"x"\n',
    "deep.toml": "a = " + "[" * 2000 + "]" * 2000 + "\n",
    "dotted.toml": "[" + ".".join(["a"] * 3000) + "]\nb = 1\n",
    "inline.toml": "x = " + "{a = " * 40 + "1" + "}" * 40 + "\n",
    "not.toml": "this is not TOML\n",
    "bad_name.toml": '[[queues]]\nname = "a/../b"\n',
    "bad_section.toml": '[[exchanges]]\nname = "x"\n',
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A namespace with a queue holding one active and two dead-lettered messages, a session queue, a topic
    with a subscription, and the bad files of FILES (plus binary garbage) beside it."""
    base = str(tmp_path_factory.mktemp("cli-inputs"))
    ns = os.path.join(base, "ns")
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("q")
    admin.create_queue("sq", requires_session=True)
    admin.create_topic("t")
    admin.create_subscription("t", "s")
    with sparkbus.ServiceBusClient(ns) as client:  # closing it persists its metrics before the tests compare
        client.get_queue_sender("q").send_messages([ServiceBusMessage(b) for b in "abc"])
        with client.get_queue_receiver("q", max_wait_time=2) as receiver:
            for message in receiver.receive_messages(2):
                receiver.dead_letter_message(message, reason="bad")
    files = os.path.join(base, "files")
    os.mkdir(files)
    for name, text in FILES.items():
        with open(os.path.join(files, name), "w", encoding="utf-8", errors="surrogatepass") as handle:
            handle.write(text)
    garbage = bytes(random.Random(26).randrange(256) for _ in range(4096))
    for name in ("garbage.jsonl", "garbage.toml"):
        with open(os.path.join(files, name), "wb") as handle:
            handle.write(b"\xff" + garbage)
    return base, ns, files


# (command line; {ns}: the namespace, {files}: the folder of FILES), exit code, what stderr says
USAGE = [
    (["peek", "--entity", "q", "--count", "0"], "argument --count: takes a whole number from 1"),
    (["peek", "--entity", "q", "--count", "-1"], "got '-1'"),
    (["peek", "--entity", "q", "--count", "1.5"], "got '1.5'"),
    (["peek", "--entity", "q", "--count", "99999999999999999999"], "to 2147483647"),
    (["peek", "--entity", "q", "--count", ""], "argument --count"),
    (["peek", "--entity", "q", "--count", "\u0663"], "argument --count"),  # ARABIC-INDIC DIGIT THREE
    (["peek", "--entity", "q", "--count", "1\n2"], "argument --count"),
    (["peek", "--entity", "q", "--count"], "expected one argument"),
    (["receive", "--entity", "q", "--count", "0"], "argument --count"),
    (["receive", "--entity", "q", "--wait", "-1"], "argument --wait: takes seconds from 0"),
    (["receive", "--entity", "q", "--wait", "nan"], "argument --wait"),
    (["receive", "--entity", "q", "--wait", "inf"], "argument --wait"),
    (["receive", "--entity", "q", "--wait", "1e999"], "argument --wait"),
    (["dead-letter", "list", "--entity", "q", "--count", "-3"], "argument --count"),
    (["dead-letter", "resubmit", "--entity", "q", "--count", "-5"], "argument --count"),
    (["dead-letter", "resubmit", "--entity", "q", "--count", "0"], "argument --count"),
    (["dead-letter", "resubmit", "--entity", "q", "--wait", "-0.5"], "argument --wait"),
    (["dead-letter", "--entity", "q"], "invalid choice: 'q'"),
    (["partition", "--partition", "-1", "--unavailable"], "argument --partition"),
    (["partition", "--partition", "0"], "one of the arguments --unavailable --available is required"),
    (["update-namespace", "--messaging-units", "0"], "argument --messaging-units"),
    (["update-namespace", "--credits-per-second", "many"], "takes a whole number or 'off'"),
    (["update-namespace", "--credits-per-second", "-5"], "takes a whole number or 'off'"),
    (["update-namespace"], "update-namespace needs"),
    (["namespace", "create", "--partition-count", "0"], "argument --partition-count"),
    (["namespace", "create", "--credits-per-second", "0"], "argument --credits-per-second"),
    (["fanout", "--trigger-ms", "-1"], "argument --trigger-ms"),
    (["forward", "--trigger-ms", "x"], "argument --trigger-ms"),
    (["serve", "--maintenance-interval", "0"], "argument --maintenance-interval: takes seconds above 0"),
    (["send-batch", "--entity", "q", "--input", "x", "--batch-rows", "-1"], "argument --batch-rows"),
    (["send-batch", "--entity", "q", "--input", "x", "--format", "xml"], "invalid choice: 'xml'"),
    (["send", "--entity", "q"], "send needs --body TEXT"),
    (["send", "--body", "x"], "required: --entity"),
    (["send", "--entity", "q", "--body", "x", "--entitiy", "b"], "unrecognized arguments: --entitiy b"),
    (["send", "--entity", "q", "--body", "x", "a\nb"], "unrecognized arguments: a\\nb"),
    (["queue", "create"], "required: name"),
    (["queue", "frobnicate"], "invalid choice: 'frobnicate'"),
    (["queue", "create", "x", "--set", "max_delivery_count"], "argument --set: takes NAME=VALUE"),
    (["queue", "create", "x", "--set", "=5"], "argument --set"),
    (["rule", "create", "r", "--topic", "t", "--subscription", "s", "--sql", "a = 1", "--correlation", "subject=x"],
     "not allowed with argument --sql"),
    (["rule", "create", "r", "--topic", "t", "--subscription", "s", "--correlation", "=x"],
     "argument --correlation: takes KEY=VALUE"),
    (["show", "--storage-option", "novalue"], "argument --storage-option: takes KEY=VALUE"),
    (["frob"], "invalid choice: 'frob'"),
    (["sned", "--entity", "q"], "invalid choice: 'sned'"),
    ([""], "invalid choice: ''"),
]
USAGE_CASES = [([*argv, "--namespace", "{ns}"], 2, says) for argv, says in USAGE] + [
    (["show"], 2, "required: --namespace"),
    (["dead-letter"], 2, "required: action"),
    ([], 2, "required: <command>"),
    (["capacity"], 2, "capacity needs --body-size"),
    (["capacity", "--body-size", "-5"], 2, "argument --body-size: takes a whole number from 0"),
    (["capacity", "--body-size", "1", "--max-size-mb", "0"], 2, "argument --max-size-mb"),
    (["capacity", "--body-size", "1", "--subscriptions", "-1"], 2, "argument --subscriptions"),
    (["capacity", "--table", "--body-size", "1"], 2, "--table takes no --body-size"),
    (["capacity", "--body-size", "1", "--property", "novalue"], 2, "argument --property: takes KEY=VALUE"),
]
REFUSED = [
    (["peek", "--entity", "nope"], "MessagingEntityNotFoundError"),
    (["peek", "--entity", "bad name\n"], "sparkbus: "),
    (["receive", "--entity", "t/Subscriptions/nope"], "MessagingEntityNotFoundError"),
    (["metrics", "--entity", "nope"], "MessagingEntityNotFoundError"),
    (["partition", "--partition", "99", "--entity", "q", "--unavailable"], "ValueError: "),
    (["update-namespace", "--messaging-units", "3"], "sparkbus: "),
    (["namespace", "create"], "MessagingEntityAlreadyExistsError"),
    (["queue", "create", "a/../b"], "ValueError: invalid queue name"),
    (["queue", "create", "x", "--set", "lock_duration=PT1H"], "ValueError: lock_duration"),
    (["queue", "create", "x", "--set", "colour=red"], "TypeError: unknown queue option"),
    (["queue", "create", "q"], "MessagingEntityAlreadyExistsError"),
    (["queue", "delete", "nope"], "MessagingEntityNotFoundError"),
    (["subscription", "create", "s2", "--topic", "nope"], "MessagingEntityNotFoundError"),
    (["rule", "create", "r", "--topic", "t", "--subscription", "s", "--sql", "color = "], "ValueError: "),
    (["send", "--entity", "nope", "--body", "x"], "MessagingEntityNotFoundError"),
    (["send", "--entity", "t/Subscriptions/s", "--body", "x"], "InvalidOperationError: 't/Subscriptions/s' is a subscription"),
    (["send", "--entity", "sq", "--body", "x"], "InvalidOperationError: --body 1: queue 'sq' requires sessions"),
    (["send", "--entity", "q", "--body", "x" * 300_000], "MessageSizeExceededError: --body 1: "),
    (["send", "--entity", "q", "--body", "x", "--session-id", "s" * 200], "ValueError: "),
    (["send", "--entity", "q", "--file", "{files}/missing.jsonl"], "FileNotFoundError"),
    (["send", "--entity", "q", "--file", "{files}"], "IsADirectoryError"),
    (["send", "--entity", "q", "--file", "{files}/garbage.jsonl"], "garbage.jsonl line 1: not UTF-8 text"),
    (["send", "--entity", "q", "--file", "{files}/nul.jsonl"], "nul.jsonl line 1: not JSON"),
    (["send", "--entity", "q", "--file", "{files}/deep.jsonl"], "deep.jsonl line 1: arrays and tables (objects) nest deeper than 32"),
    (["send", "--entity", "q", "--file", "{files}/deeper.jsonl"], "deeper.jsonl line 1: arrays and tables"),
    (["send", "--entity", "q", "--file", "{files}/deep_objects.jsonl"], "deep_objects.jsonl line 2: arrays and tables"),
    (["send", "--entity", "q", "--file", "{files}/third.jsonl"], 'third.jsonl line 3: expected a string or an object with "body"'),
    (["send", "--entity", "q", "--file", "{files}/late.jsonl"], f"late.jsonl line {LATE + 1}: session_id"),
    (["send", "--entity", "q", "--file", "{files}/unknown.jsonl"], "unknown field(s) ['colour']"),
    (["send", "--entity", "q", "--file", "{files}/not_a_message.jsonl"], "line 1: expected a string or an object"),
    (["send", "--entity", "q", "--file", "{files}/int_body.jsonl"], "TypeError: "),
    (["send", "--entity", "q", "--file", "{files}/nested_property.jsonl"], "TypeError: "),
    (["send", "--entity", "q", "--file", "{files}/huge_int.jsonl"], "huge_int.jsonl line 1: not JSON"),
    (["send", "--entity", "q", "--file", "{files}/surrogate_value.jsonl"], "surrogate_value.jsonl line 1: "),
    (["send", "--entity", "q", "--file", "{files}/surrogate_key.jsonl"], "surrogate_key.jsonl line 1: "),
    (["send", "--entity", "q", "--file", "{files}/surrogate_subject.jsonl"], "surrogate_subject.jsonl line 1: "),
    (["send", "--entity", "q", "--file", "{files}/surrogate_body.jsonl"], "surrogate_body.jsonl line 1: "),
    (["send", "--entity", "q", "--file", "{files}/big_int.jsonl"], "big_int.jsonl line 1: "),
    (["send", "--entity", "sq", "--file", "{files}/no_session.jsonl"], "no_session.jsonl line 1: queue 'sq' requires sessions"),
    (["dead-letter", "resubmit", "--entity", "q", "--to", "missing"], "MessagingEntityNotFoundError: "),
    (["dead-letter", "resubmit", "--entity", "q", "--to", "t/Subscriptions/s"], "InvalidOperationError: "),
    (["dead-letter", "resubmit", "--entity", "nope"], "MessagingEntityNotFoundError: "),
    (["apply", "{files}/missing.toml"], "FileNotFoundError"),
    (["apply", "{files}/garbage.toml"], "garbage.toml: not UTF-8 text"),
    (["apply", "{files}/not.toml"], "not.toml: not valid TOML"),
    (["apply", "{files}/deep.toml"], "deep.toml line 1: arrays and tables (objects) nest deeper than 32"),
    (["apply", "{files}/dotted.toml"], "dotted.toml: arrays and tables"),
    (["apply", "{files}/inline.toml"], "inline.toml line 1: arrays and tables"),
    (["apply", "{files}/bad_name.toml"], "ValueError: invalid queue name"),
    (["apply", "{files}/bad_section.toml"], "unknown section(s) ['exchanges']"),
]
REFUSED_CASES = [([*argv, "--namespace", "{ns}"], 1, says) for argv, says in REFUSED] + [
    (["show", "--namespace", ""], 1, "ValueError: "),
    (["show", "--namespace", "{files}/none"], 1, "MessagingEntityNotFoundError"),
    (["show", "--namespace", "{files}/deep.toml"], 1, "sparkbus: "),
    (["maintain", "--namespace", "{files}/none"], 1, "sparkbus: "),
]
CASES = USAGE_CASES + REFUSED_CASES


def _filled(argv: list[str], ns: str, files: str) -> list[str]:
    return [arg.replace("{ns}", ns).replace("{files}", files) for arg in argv]


@pytest.mark.parametrize("argv,code,says", CASES, ids=[" ".join(c[0])[:70] for c in CASES])
def test_a_bad_command_line_is_one_line_and_writes_nothing(world, capsys, argv, code, says):
    base, ns, files = world
    assert maintenance.wait_idle(60)  # background compaction after the fixture's commits has finished
    before = files_under(base, metrics=False)
    assert main(_filled(argv, ns, files)) == code
    out, err = capsys.readouterr()
    assert_one_error_line(err, code)
    assert says in err and out == ""
    assert files_under(base, metrics=False) == before, "the namespace changed"


COMMANDS = [["show"], ["metrics"], ["update-namespace"], ["partition"], ["send"], ["peek"], ["receive"],
            ["dead-letter", "list"], ["dead-letter", "resubmit"], ["queue", "create"], ["queue", "show"],
            ["topic", "delete"], ["subscription", "create"], ["rule", "create"], ["rule", "list"], ["maintain"],
            ["namespace", "show"], ["dead-letter"], ["queue"]]
TOKENS = ["--count", "--entity", "--body", "--file", "--set", "--to", "--wait", "--partition", "--unavailable",
          "--topic", "--subscription", "--sql", "--correlation", "--json", "--from-dead-letter", "--settle", "--messaging-units",
          "--credits-per-second", "--storage-option", "--session-id", "-1", "0", "1", "nan", "inf", "1e999", "",
          "x", "q", "a=b", "=", "off", "t/Subscriptions/s", "a\nb", "\udcff", "\x1c", "9" * 30, "--", "-x",
          "max_delivery_count=5", "subject=order", "color = 'red'"]


def test_random_command_lines_against_a_missing_namespace(tmp_path, capsys):
    """300 command lines of random options and values: each is refused (2 or 1) in one line, and the
    namespace they name is never created."""
    missing = str(tmp_path / "missing")
    rng = random.Random(26)
    for _ in range(300):
        argv = [*rng.choice(COMMANDS), *(rng.choice(TOKENS) for _ in range(rng.randint(0, 6))), "--namespace", missing]
        code = main(argv)
        out, err = capsys.readouterr()
        assert code in (1, 2), argv
        assert_one_error_line(err, code)
        assert not os.listdir(tmp_path), argv


def test_a_refused_resubmit_receives_nothing(world, capsys):
    """A resubmit to a missing entity or to a subscription is refused before it receives: the dead-lettered
    messages keep the delivery count they had (1, from when they were dead-lettered)."""
    _, ns, _ = world
    for target in ("missing", "t/Subscriptions/s"):
        assert main(["dead-letter", "resubmit", "--entity", "q", "--to", target, "--namespace", ns]) == 1
    assert len(capsys.readouterr().err.splitlines()) == 2
    with sparkbus.ServiceBusClient(ns) as client:
        dead = client.get_queue_receiver("q", sub_queue="deadletter").peek_messages(10)
    assert [m.delivery_count for m in dead] == [1, 1]


def test_a_file_is_sent_whole_in_batches_after_it_was_checked(admin, ns_path, tmp_path, capsys):
    admin.create_queue("q")
    lines = tmp_path / "many.jsonl"
    lines.write_text("".join(json.dumps({"body": f"{i:04d}" + "x" * 400}) + "\n" for i in range(1500)))
    assert main(["send", "--namespace", ns_path, "--entity", "q", "--file", str(lines), "--json"]) == 0
    assert capsys.readouterr().out == '{"sent": 1500}\n'
    assert admin.get_queue_runtime_properties("q").active_message_count == 1500
    with sparkbus.ServiceBusClient(ns_path) as client:
        peeked = client.get_queue_receiver("q").peek_messages(1500)
    assert [str(m)[:4] for m in sorted(peeked, key=lambda m: m.sequence_number)] == [f"{i:04d}" for i in range(1500)]


def _until_reading_stdin(pid: int, timeout: float = 120) -> None:
    """Wait until the process's main thread is blocked in read(2) on file descriptor 0 (Linux /proc)."""
    def reading() -> bool:
        with open(f"/proc/{pid}/syscall") as current:
            return current.read().split()[:2] == ["0", "0x0"]  # x86-64 read, fd 0
    if not wait_until(reading, timeout):
        raise AssertionError(f"process {pid} did not start reading stdin within {timeout} s")


def test_ctrl_c_is_one_line_and_exit_130(admin, ns_path):
    """A real `sparkbus send --file -` reading a stdin that stays open, interrupted with SIGINT (Ctrl-C)."""
    admin.create_queue("q")
    exe = os.path.join(os.path.dirname(sys.executable), "sparkbus")
    # A shell starts background jobs with SIGINT ignored, and an ignored signal stays ignored across exec:
    # `make test &` passed that on to this command, which then rightly ignored Ctrl-C. Start it as a
    # terminal would, with SIGINT's default action.
    send = subprocess.Popen([exe, "send", "--namespace", ns_path, "--entity", "q", "--file", "-"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    send.stdin.write(b'"first"\n')
    send.stdin.flush()
    _until_reading_stdin(send.pid)  # started (a fixed pause was not always enough on a busy machine)
    send.send_signal(signal.SIGINT)
    assert send.wait(timeout=120) == 130
    assert send.stderr.read() == b"sparkbus: interrupted\n" and send.stdout.read() == b""
    send.stdin.close()
    assert admin.get_queue_runtime_properties("q").active_message_count == 0


def test_help_is_not_an_error(capsys):
    assert main(["peek", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: sparkbus peek")


def test_the_console_script_answers_in_one_line_and_quietly_stops_for_a_closed_pipe(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "sparkbus")
    for argv, code in (([], 2), (["peek", "--entity", "q", "--count", "0", "--namespace", str(tmp_path)], 2),
                       (["show", "--namespace", str(tmp_path / "none")], 1)):
        done = subprocess.run([exe, *argv], capture_output=True, text=True, timeout=120)
        assert done.returncode == code and done.stdout == "", done.stderr
        assert_one_error_line(done.stderr, code)
    table = subprocess.Popen([exe, "capacity", "--table"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    table.stdout.close()  # the reader went away before the first line, as `| head -0` would
    assert table.stderr.read() == b"" and table.wait(timeout=120) == 141


# ---- the nesting limit of definitions -----------------------------------------------------------------------

def _nested_lists(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_definition_files_nest_up_to_the_limit(tmp_path):
    path = tmp_path / "d.toml"
    quoted = "[" * 100 + "{" * 100
    path.write_text(f'# {quoted}\n[[queues]]\nname = "q"\n[[topics]]\nname = "t"\nx = "{quoted}"\n'
                    f"y = '{quoted}'\nz = \"\"\"\n{quoted}\"\"\"\n"
                    f"deep = {'[' * (MAX_NESTING_DEPTH - 3)}{']' * (MAX_NESTING_DEPTH - 3)}\n")
    loaded = load_definition(str(path))  # the document, topics, a topic, then 29 arrays: 32 levels
    assert loaded["topics"][0]["x"] == quoted and loaded["topics"][0]["deep"] == _nested_lists(MAX_NESTING_DEPTH - 3)
    path.write_text(f'[[topics]]\nname = "t"\ndeep = {"[" * (MAX_NESTING_DEPTH - 2)}{"]" * (MAX_NESTING_DEPTH - 2)}\n')
    with pytest.raises(ValueError, match=f"d.toml: arrays and tables .* deeper than {MAX_NESTING_DEPTH}"):
        load_definition(str(path))  # found in what the parser returned: 33 levels
    path.write_text(f'[[topics]]\nname = "t"\ndeep = {"[" * 40}{"]" * 40}\n')
    with pytest.raises(ValueError, match=f"d.toml line 3: arrays and tables .* deeper than {MAX_NESTING_DEPTH}"):
        load_definition(str(path))  # found in the text, before the parser


@pytest.mark.parametrize("definition", [
    {"queues": [{"name": "q", "lock_duration": _nested_lists(MAX_NESTING_DEPTH)}]},
    {"queues": _nested_lists(100_000)},
    {"topics": [{"name": "t", "subscriptions": [{"name": "s", "rules": [
        {"name": "r", "correlation": {"properties": {"k": {"k": _nested_lists(MAX_NESTING_DEPTH)}}}}]}]}]},
], ids=["just-over", "100000", "in-a-rule"])
def test_a_definition_nested_too_deep_is_a_value_error(tmp_path, definition):
    ns = str(tmp_path / "ns")
    with pytest.raises(ValueError, match=f"the definition: arrays and tables .* deeper than {MAX_NESTING_DEPTH}"):
        apply_definition(definition, ns)
    assert not os.path.exists(ns)


def test_a_definition_that_contains_itself_or_is_not_a_dict(tmp_path):
    ns = str(tmp_path / "ns")
    itself: dict = {"queues": []}
    itself["queues"].append(itself)
    with pytest.raises(ValueError, match="nest deeper than"):
        apply_definition(itself, ns)
    with pytest.raises(TypeError, match="must be a dict"):
        apply_definition([{"queues": []}], ns)
    assert not os.path.exists(ns)

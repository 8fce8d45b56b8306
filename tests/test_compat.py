"""Drop-in compatibility with azure-servicebus: constructors, credentials, keyword arguments, module names
and error classes as ported code uses them (no Spark)."""
from __future__ import annotations

import pytest
from azure.core.credentials import AccessToken, AzureNamedKeyCredential, AzureSasCredential
from azure.core.exceptions import AzureError, ResourceExistsError, ResourceNotFoundError

import sparkbus
from sparkbus import ServiceBusClient, ServiceBusMessage, TransportType, parse_connection_string
from sparkbus.management import (ApiVersion, CorrelationRuleFilter, EntityStatus, ServiceBusAdministrationClient,
                                 SqlRuleAction, SqlRuleFilter, TrueRuleFilter)

# azure.servicebus.exceptions of azure-servicebus 7.15.0, by name
SDK_EXCEPTIONS = ("ServiceBusError", "ServiceBusConnectionError", "ServiceBusAuthenticationError",
                  "ServiceBusAuthorizationError", "OperationTimeoutError", "MessageSizeExceededError",
                  "MessageAlreadySettled", "MessageLockLostError", "SessionLockLostError", "MessageNotFoundError",
                  "MessagingEntityNotFoundError", "MessagingEntityDisabledError", "MessagingEntityAlreadyExistsError",
                  "ServiceBusQuotaExceededError", "ServiceBusServerBusyError", "ServiceBusCommunicationError",
                  "SessionCannotBeLockedError", "AutoLockRenewFailed", "AutoLockRenewTimeout")


class _TokenCredential:
    """What DefaultAzureCredential looks like to a client: get_token(*scopes)."""

    def get_token(self, *scopes: str, **kwargs: object) -> AccessToken:
        return AccessToken("token", 2**31)


@pytest.mark.parametrize("credential", [_TokenCredential(), AzureNamedKeyCredential("name", "key"),
                                        AzureSasCredential("sig"), None])
def test_clients_take_a_namespace_and_any_credential_as_the_sdk_does(admin, ns_path, credential):
    manager = ServiceBusAdministrationClient(ns_path, credential, api_version=ApiVersion.V2021_05,
                                             logging_enable=True)
    manager.create_queue("q")
    client = ServiceBusClient(f"sparkbus://{ns_path}", credential, transport_type=TransportType.AmqpOverWebsocket,
                              http_proxy={"proxy_hostname": "localhost"}, custom_endpoint_address="sb://x",
                              logging_enable=True, uamqp_transport=False, retry_total=2)
    with client, client.get_queue_sender("q") as sender:
        sender.send_messages(ServiceBusMessage("ported"))
    with client.get_queue_receiver("q", max_wait_time=1) as receiver:
        [message] = receiver.receive_messages()
        assert str(message) == "ported"
        receiver.complete_message(message)
    assert client.fully_qualified_namespace == ns_path
    with pytest.raises(TypeError, match="fully_qualified_namespace must be a str"):
        ServiceBusClient(None, credential)


def test_management_errors_are_the_azure_core_errors_the_sdk_raises(admin):
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue("missing")
    admin.create_queue("q")
    with pytest.raises(ResourceExistsError):
        admin.create_queue("q")
    with pytest.raises(sparkbus.MessagingEntityNotFoundError, match="missing"):  # and sparkbus's own class
        admin.delete_queue("missing")


def test_exceptions_have_the_sdks_names_and_bases():
    from sparkbus import exceptions

    for name in SDK_EXCEPTIONS:
        assert issubclass(getattr(exceptions, name), AzureError), name
        assert getattr(sparkbus, name) is getattr(exceptions, name)
    assert issubclass(exceptions.MessageSizeExceededError, ValueError)
    assert issubclass(exceptions.MessageAlreadySettled, ValueError)
    built = exceptions.MessagingEntityNotFoundError(message="built as the SDK builds it")  # keyword, as the SDK
    assert str(built) == built.message == "built as the SDK builds it"
    assert str(exceptions.ServiceBusServerBusyError()) == "Service Bus has encountered an error."


def test_management_module_names_and_enums(admin):
    admin.create_topic("t")
    admin.create_subscription("t", "s")
    admin.create_rule("t", "s", "sql", filter=SqlRuleFilter("a = 1"), action=SqlRuleAction("SET b = 2"))
    admin.create_rule("t", "s", "corr", filter=CorrelationRuleFilter(subject="x"))
    assert {r.name for r in admin.list_rules("t", "s")} == {"$Default", "sql", "corr"}
    assert isinstance(admin.get_rule("t", "s", "$Default").filter, TrueRuleFilter)
    assert admin.get_topic("t").status == EntityStatus.ACTIVE  # str enums compare with the stored strings


def test_parse_connection_string_as_the_sdk():
    props = parse_connection_string("Endpoint=sparkbus:///tmp/ns/;SharedAccessKeyName=RootManageSharedAccessKey;"
                                    "SharedAccessKey=abc=;EntityPath=orders")
    assert (props.fully_qualified_namespace, props.endpoint, props.entity_path) == (
        "/tmp/ns", "sparkbus:///tmp/ns/", "orders")
    assert (props.shared_access_key_name, props.shared_access_key, props.shared_access_signature) == (
        "RootManageSharedAccessKey", "abc=", None)  # base64 keys end in "="


def test_the_sdks_entity_properties_are_accepted_stored_and_returned(admin):
    from datetime import timedelta

    from sparkbus.management import AccessRights  # noqa: F401 (importable, as in the SDK)

    admin.create_queue("q", auto_delete_on_idle=timedelta(hours=2), enable_batched_operations=False,
                       user_metadata="owner: billing", enable_express=False, authorization_rules=[])
    queue = admin.get_queue("q")
    assert (queue.auto_delete_on_idle, queue.enable_batched_operations, queue.user_metadata, queue.enable_express,
            queue.authorization_rules) == (timedelta(hours=2), False, "owner: billing", False, [])
    queue.user_metadata = "owner: payments"
    admin.update_queue(queue)  # the properties object goes back, as in the SDK
    assert admin.get_queue("q").user_metadata == "owner: payments"
    admin.create_topic("t", support_ordering=False, filtering_messages_before_publishing=True)
    topic = admin.get_topic("t")
    assert (topic.support_ordering, topic.filtering_messages_before_publishing, topic.size_in_bytes) == (False, True, 0)
    admin.create_subscription("t", "s", user_metadata="m", auto_delete_on_idle=timedelta(days=1))
    admin.create_rule("t", "s", "sql", filter=SqlRuleFilter("a = 1"))
    admin.create_rule("t", "s", "corr", filter=CorrelationRuleFilter(subject="x"))
    runtime = admin.get_topic_runtime_properties("t")
    assert (runtime.subscription_count, runtime.sql_filter_count, runtime.correlation_filter_count) == (1, 1, 1)
    assert admin.get_subscription("t", "s").user_metadata == "m"
    with pytest.raises(ValueError, match="auto_delete_on_idle must be between"):
        admin.create_queue("short", auto_delete_on_idle=timedelta(minutes=1))
    with pytest.raises(ValueError, match="at most 1024 characters"):
        admin.create_queue("long", user_metadata="x" * 1025)
    assert [q.name for q in admin.list_queues()] == ["q"]  # nothing stored for the refused ones


def test_received_bodies_are_bytes_and_iterate_as_the_sdks(admin, client):
    admin.create_queue("q")
    client.get_queue_sender("q").send_messages([ServiceBusMessage(b"one"), ServiceBusMessage("two")])
    with client.get_queue_receiver("q", max_wait_time=1) as receiver:
        first, second = receiver.receive_messages(max_message_count=2)
    assert first.body == b"one" and first.body.decode() == "one" and first.body_bytes == b"one"  # sparkbus
    assert b"".join(first.body) == b"one" and next(second.body) == b"two"  # the SDK's data-body iterator
    assert [section for section in first.body] == [b"one"] and str(second) == "two"
    assert first.enqueued_sequence_number == first.sequence_number and first.body_type == "data"


def test_sessions_are_listed_and_clients_build_from_connection_strings(admin, client, ns_path):
    from datetime import datetime, timedelta, timezone

    from sparkbus import NEXT_AVAILABLE_SESSION, ServiceBusReceiver, ServiceBusSender

    admin.create_queue("sq", requires_session=True)
    conn = f"Endpoint=sparkbus://{ns_path};SharedAccessKeyName=k;SharedAccessKey=v"
    with ServiceBusSender._from_connection_string(conn_str=conn, queue_name="sq") as sender:
        sender.send_messages([ServiceBusMessage("a", session_id="s1"), ServiceBusMessage("b", session_id="s2")])
    before = datetime.now(timezone.utc) - timedelta(seconds=1)
    with client.get_queue_receiver("sq", session_id="s1", max_wait_time=1) as receiver:
        [message] = receiver.receive_messages()
        receiver.complete_message(message)
        receiver.session.set_state(b"done")
    assert client.list_queue_sessions("sq") == ["s1", "s2"]  # s1 has state, s2 messages
    assert client.list_queue_sessions("sq", state_updated_after=before) == ["s1"]
    with ServiceBusReceiver._from_connection_string(conn_str=conn, queue_name="sq", session_id=NEXT_AVAILABLE_SESSION,
                                                    max_wait_time=1) as receiver:
        assert [str(m) for m in receiver.receive_messages()] == ["b"]
    admin.create_queue("plain")
    with pytest.raises(sparkbus.InvalidOperationError, match="does not require sessions"):
        client.list_queue_sessions("plain")
    with ServiceBusSender._from_connection_string(conn_str=conn, queue_name="") as unnamed:  # a bad name, not none
        with pytest.raises(ValueError, match="invalid queue or topic name ''"):
            unnamed.send_messages(ServiceBusMessage("x"))


def test_messages_are_built_as_the_sdk_builds_them():
    assert ServiceBusMessage(None).body == b""
    assert ServiceBusMessage("é", encoding="latin-1").body == "é".encode("latin-1")
    assert ServiceBusMessage("x", label="old name").subject == "old name"  # the older SDKs' subject
    assert ServiceBusMessage("x", label="old", subject="new").subject == "new"
    with pytest.raises(TypeError):
        ServiceBusMessage("x", sesion_id="typo")  # other unknown keywords still fail, as in Python


def test_auto_lock_renewer_takes_the_sdks_pool_arguments():
    from concurrent.futures import ThreadPoolExecutor

    from sparkbus import AutoLockRenewer

    with ThreadPoolExecutor(2) as pool:
        AutoLockRenewer(max_workers=4).close()
        AutoLockRenewer(executor=pool).close()
    with pytest.raises(ValueError, match="max_workers must be an int >= 1"):
        AutoLockRenewer(max_workers=0)
    with pytest.raises(TypeError, match="executor must be"):
        AutoLockRenewer(executor="pool")


def test_the_message_api_needs_no_pyspark(admin, ns_path):
    """pip install sparkbus (no [spark] extra): a process where pyspark cannot be imported sends,
    receives and manages."""
    import subprocess
    import sys

    admin.create_queue("q")
    script = f"""
import sys
sys.modules["pyspark"] = None  # as if it were not installed: any import of it fails
import sparkbus
from sparkbus import ServiceBusClient, ServiceBusMessage
admin = sparkbus.ServiceBusAdministrationClient({ns_path!r})
admin.create_topic("t")
with ServiceBusClient({ns_path!r}) as client:
    client.get_queue_sender("q").send_messages(ServiceBusMessage("no spark"))
    with client.get_queue_receiver("q", max_wait_time=1) as receiver:
        [m] = receiver.receive_messages()
        receiver.complete_message(m)
print(str(m), "pyspark" in sys.modules and sys.modules["pyspark"] is not None)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["no", "spark", "False"]

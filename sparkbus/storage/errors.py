"""What a store's refusal means to a Service Bus user: the SDK's error classes instead of a store's raw one.

delta-rs reports an object store's failures as OSError or DeltaError carrying the store's text (the HTTP
status and the service's error code), obstore as its own exception classes; a Rust panic inside either
arrives as pyo3's PanicException, a BaseException that no `except Exception` catches. `translated` reads
them once, here, so that every layer above sees:

- ServiceBusAuthenticationError: the credential was not accepted (401; S3's SignatureDoesNotMatch and
  InvalidAccessKeyId, Azure's AuthenticationFailed), with what to check;
- ServiceBusAuthorizationError: the credential is valid but not allowed (S3's AccessDenied, Azure's
  AuthorizationPermissionMismatch and AuthorizationFailure);
- StoreBusy / StoreTimeout (transient: the one retry policy retries them, sparkbus.engine.retry, then raises
  ServiceBusServerBusyError / OperationTimeoutError): the store throttled (429, 503 SlowDown, ServerBusy)
  or did not answer in time;
- ServiceBusCommunicationError: the store could not be reached (connection refused, no such host) after
  its client's own retries;
- ValueError: a storage option object_store cannot take (an unknown name, a value it cannot parse);
- StorageError: a panic, with the settings it most likely means (a panic is a native library's bug or a
  setting it could not take: never a traceback from Rust).

Anything else (a missing object, a lost commit race) is left as it is: the engine decides on those.
"""
from __future__ import annotations

import functools
import re
from typing import Any, Callable, Optional, TypeVar

from ..exceptions import (OperationTimeoutError, ServiceBusAuthenticationError, ServiceBusAuthorizationError,
                          ServiceBusCommunicationError, ServiceBusError, ServiceBusServerBusyError, StorageError)

F = TypeVar("F", bound=Callable[..., Any])
_AUTHENTICATION = re.compile(r"\b401\b|Unauthorized|SignatureDoesNotMatch|InvalidAccessKeyId|AuthenticationFailed|"
                             r"InvalidAuthenticationInfo|ExpiredToken|InvalidToken|UnauthenticatedError|failed to authenticate")
_AUTHORIZATION = re.compile(r"AccessDenied|AuthorizationPermissionMismatch|AuthorizationFailure|"
                            r"AuthorizationResourceTypeMismatch|PermissionDeniedError|403 Forbidden")
_BUSY = re.compile(r"\b429\b|Too Many Requests|SlowDown|ServerBusy|\b503\b|Service Unavailable|RequestLimitExceeded")
# how delta-rs and obstore report a request to a store (a local file's error has none of these)
_FROM_A_STORE = re.compile(r"Error performing|Generic \w+ error|<Code>|https?://|non-2xx status")
_SETTING = re.compile(r"Config error[^\n]*\n?[^\n]*?(failed to parse [^\n]*|Unknown [^\n]*)|"
                      r"UnknownConfigurationKey[^\n]*")
_UNREACHABLE = re.compile(r"kind: Connect|Connection refused|error sending request|dns error")
_TIMEOUT = re.compile(r"timed out|deadline has elapsed|TimedOut|operation timeout")
# what the engine decides on itself: a missing object, a lost race for a name, a failed precondition, a conflict
_DECIDED_ABOVE = ("NotFoundError", "AlreadyExistsError", "PreconditionError", "NotModifiedError", "CommitFailedError",
                  "TableNotFoundError")
_CHECK = {
    "s3": "the access key id and secret (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or storage_options "
          "access_key_id / secret_access_key), the region and the endpoint",
    "az": "the account name and key, SAS token or bearer token (AZURE_STORAGE_ACCOUNT_NAME / "
          "AZURE_STORAGE_ACCOUNT_KEY, or storage_options account_name / account_key / sas_token)",
}


class StoreBusy(ServiceBusServerBusyError):
    """The store throttled a request (transient: retried by the client's retry policy)."""


class StoreTimeout(OperationTimeoutError):
    """The store did not answer a request in time (transient: retried by the client's retry policy)."""


def _store_kind(text: str) -> str:
    return "s3" if re.search(r"\bS3\b|amazonaws|s3://", text) else "az"


def translated(error: BaseException, where: str = "") -> Optional[BaseException]:
    """The SDK error a store's failure means (see the module docstring), or None to leave it as it is."""
    if isinstance(error, ServiceBusError):
        return None
    text = f"{type(error).__name__}: {error}"
    place = f"{where}: " if where else ""
    if type(error).__name__ == "PanicException":
        return StorageError(f"{place}the storage library could not handle the request ({error}); check the "
                            "storage_options names and values (object_store's option names, such as endpoint, "
                            "region, allow_http, account_name, account_key)")
    if isinstance(error, FileNotFoundError) or type(error).__name__ in _DECIDED_ABOVE:
        return None
    setting = _SETTING.search(text)
    if setting is not None:
        return ValueError(f"{place}a storage option cannot be used ({setting.group(1) or setting.group(0)}); "
                          "storage_options take object_store's option names and values (endpoint, region, "
                          "allow_http 'true'/'false', timeout '30s', account_name, ...)")
    if not _FROM_A_STORE.search(text):
        return None
    first = _first_line(text)
    if _AUTHENTICATION.search(text):
        return ServiceBusAuthenticationError(f"{place}the store did not accept the credential ({first}); check "
                                             f"{_CHECK[_store_kind(text)]}")
    if _AUTHORIZATION.search(text):
        return ServiceBusAuthorizationError(f"{place}the credential is not allowed to do this ({first}); check "
                                            "the permissions it grants on the bucket or container (read, write, "
                                            "list and delete are needed)")
    if _BUSY.search(text):
        return StoreBusy(f"{place}the store is throttling requests ({first}); try again later")
    if _TIMEOUT.search(text) and not isinstance(error, ValueError):
        return StoreTimeout(f"{place}the store did not answer in time ({first})")
    if _UNREACHABLE.search(text):
        return ServiceBusCommunicationError(f"{place}the store could not be reached ({first}); check the endpoint "
                                            "and the network (its client retried the connection before this)")
    return None


def transient(error: BaseException) -> bool:
    """Whether error is a store's passing failure (unreachable, busy, timed out), worth another try."""
    return isinstance(translated(error), (ServiceBusCommunicationError, StoreBusy, StoreTimeout))


def _first_line(text: str) -> str:
    """The store's own error code and status, not the whole chain delta-rs prints."""
    codes = re.findall(r"<Code>([^<]+)</Code>|\b([45]\d\d [A-Z][A-Za-z ]+)", text)
    found = [a or b.strip() for a, b in codes]
    return ", ".join(dict.fromkeys(found)) if found else text.splitlines()[0][:200]


def guarded(function: F) -> F:
    """function with store failures raised as their SDK errors (translated)."""
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except BaseException as error:
            better = translated(error)
            if better is None:
                raise
            raise better from (error if isinstance(error, Exception) else None)
    return call  # type: ignore[return-value]

"""Where a namespace lives: a local directory, or a prefix of an object store (Azure Blob Storage and ADLS
Gen2 as az://, abfs:// or abfss://; Amazon S3 as s3://).

Every table is a Delta table that delta-rs opens by URI; the few plain files (staged DataFrame batches,
leftovers of deleted entities) go through obstore, the Python face of the object_store crate that delta-rs
itself uses, so both read the same credentials: the storage_options given to create_namespace or a client,
else the environment variables delta-rs reads (AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY,
AZURE_STORAGE_USE_EMULATOR, AWS_*...). Options given for a namespace are remembered for every URI under
its root in this process (register_options), so code that opens a table by URI needs no options argument.

Correctness on an object store rests on one property: a Delta commit writes log entry N+1 with an atomic
put-if-absent, so of two writers racing for a version exactly one wins and the other retries on the new
version. Azure Blob Storage has it natively. S3 has it with conditional writes (If-None-Match), which
object_store and delta-rs use by default; a setting that turns them off (conditional_put "disabled", as an
option or AWS_CONDITIONAL_PUT) would let two writers both "win" and lose a commit, so check_safe refuses
such a namespace instead. delta-rs' DynamoDB locking provider is not enough: sparkbus writes the log
entries of sends and settlements itself (sparkbus.storage.commits) with a conditional PUT, outside that
lock.

Options are given as object_store names them, with or without the store's prefix (endpoint or
aws_endpoint, account_key or azure_storage_account_key). delta-rs takes every one; obstore wants HTTP
client settings (allow_http, timeouts, proxies) apart from the store's: store_options splits them.

What stays local to a machine (the throttling ledger and the compaction lock, which rely on file locks)
lives for an object-store namespace in state_dir(root), a directory under ~/.cache/sparkbus.
"""
from __future__ import annotations

import hashlib
import os
import posixpath
import threading
import time
from typing import TYPE_CHECKING, Any, Optional, cast
from urllib.parse import urlparse

from . import requests
from .errors import guarded, transient

if TYPE_CHECKING:
    from obstore.store import ClientConfig, ObjectStore

OBJECT_SCHEMES = ("az", "azure", "abfs", "abfss", "s3", "s3a")
_OPTIONS: dict[str, dict[str, str]] = {}
_LOCK = threading.Lock()
_STORES: dict[tuple[object, ...], "ObjectStore"] = {}  # store_of's stores by base and settings
_STORES_KEPT = 64
_STORE_ENVIRONMENT = ("AZURE_", "AZURITE_", "AWS_", "GOOGLE_")  # what object_store's builders read
ALLOWED = ("a local path, file:///absolute/path, az://container/path, abfss://container@account.dfs.core."
           "windows.net/path or s3://bucket/path")


def normalize(location: object) -> str:
    """The canonical form of a namespace location: an absolute local path, or scheme://container/path without
    a trailing slash. Raises TypeError for a non-str, ValueError for an empty or unsupported location."""
    if not isinstance(location, str):
        raise TypeError(f"a namespace location must be a str ({ALLOWED}), got {type(location).__name__}")
    if not location.strip():
        raise ValueError(f"a namespace location cannot be empty; give {ALLOWED}")
    if "://" not in location:
        return os.path.abspath(os.path.expanduser(location))
    parsed = urlparse(location)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise ValueError(f"{location!r}: a file:// URI names an absolute path (file:///data/sb/prod)")
        return os.path.abspath(parsed.path)
    if scheme not in OBJECT_SCHEMES:
        raise ValueError(f"{location!r}: unsupported scheme {scheme!r}; a namespace location is {ALLOWED}")
    if not parsed.netloc:
        raise ValueError(f"{location!r}: name the container or bucket ({scheme}://container/path)")
    return f"{scheme}://{parsed.netloc}{parsed.path.rstrip('/')}"


def is_local(uri: str) -> bool:
    return "://" not in uri


def join(uri: str, *parts: str) -> str:
    return os.path.join(uri, *parts) if is_local(uri) else posixpath.join(uri, *parts)


def register_options(root: str, options: Optional[dict[str, str]]) -> None:
    """Remember storage options for every URI under root (this process); None or {} registers nothing.
    Raises TypeError unless options maps str to str."""
    if not options:
        return
    if not isinstance(options, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in options.items()):
        raise TypeError("storage_options must be a dict of str to str (delta-rs / object_store option names)")
    with _LOCK:
        _OPTIONS[root.rstrip("/")] = dict(options)


def options_for(uri: str) -> dict[str, str]:
    """The storage options registered for the longest root that holds uri ({} if none)."""
    best, found = -1, {}
    for root, options in list(_OPTIONS.items()):
        if (uri == root or uri.startswith(root + "/")) and len(root) > best:
            best, found = len(root), options
    return dict(found)


def credential_options(root: str, credential: object) -> dict[str, str]:
    """Storage options that let an azure-core credential given to a client reach an Azure namespace:
    AzureNamedKeyCredential -> account name and key, AzureSasCredential -> SAS token, a TokenCredential ->
    a bearer token for Azure Storage (fetched now; valid about an hour). {} for other stores, local
    namespaces and no credential."""
    if credential is None or urlparse(root).scheme not in ("az", "azure", "abfs", "abfss"):
        return {}
    named = getattr(credential, "named_key", None)
    if named is not None:
        return {"account_name": named.name, "account_key": named.key}
    signature = getattr(credential, "signature", None)
    if isinstance(signature, str):
        return {"sas_token": signature}
    get_token = getattr(credential, "get_token", None)
    if callable(get_token):
        return {"bearer_token": get_token("https://storage.azure.com/.default").token}
    raise TypeError(f"credential must be an azure-core credential (TokenCredential, AzureNamedKeyCredential or "
                    f"AzureSasCredential), got {type(credential).__name__}")


ENVIRONMENT_PREFIXES = ("AZURE_STORAGE_", "AZURITE_", "AWS_")


def credential_environment() -> dict[str, str]:
    """The environment variables delta-rs and obstore read credentials and endpoints from, as this process
    has them: shipped to Spark executors, which may have been started without them."""
    return {k: v for k, v in os.environ.items() if k.startswith(ENVIRONMENT_PREFIXES)}


def shipment(uri: str) -> tuple[dict[str, str], dict[str, str]]:
    """What a Spark executor needs to reach uri's store: the options registered for it and the credential
    variables (install() applies them there)."""
    return options_for(uri), credential_environment()


def install(uri: str, options: dict[str, str], environment: dict[str, str]) -> None:
    """On a Spark executor: make what the driver shipped (options registered for uri, credential variables
    not set here) available to delta-rs and obstore in this process."""
    for name, value in environment.items():
        os.environ.setdefault(name, value)
    register_options(uri, options)


def _setting(options: dict[str, str], *names: str) -> Optional[str]:
    for name in names:
        for key in (name, name.upper(), name.lower()):
            if key in options:
                return options[key]
            if key in os.environ:
                return os.environ[key]
    return None


def check_safe(uri: str) -> None:
    """Refuse a location whose store would not commit atomically: S3 with its conditional writes turned off
    (conditional_put set to anything but "etag", the default), with what to change; ValueError."""
    if urlparse(uri).scheme not in ("s3", "s3a"):
        return
    conditional = _setting(options_for(uri), "conditional_put", "aws_conditional_put")
    if conditional is None or conditional.lower() == "etag":
        return
    raise ValueError(f"{uri}: conditional_put is {conditional!r}, but Delta commits on S3 need its conditional "
                     "writes (an atomic put-if-absent), or concurrent commits can be lost; remove the setting "
                     "(storage option conditional_put or AWS_CONDITIONAL_PUT: 'etag' is the default). A DynamoDB "
                     "locking provider does not cover the log entries sparkbus writes itself")


# object_store's HTTP client settings (ClientConfigKey): obstore takes them apart from the store's own.
CLIENT_OPTIONS = frozenset((
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type", "http1_only",
    "http2_keep_alive_interval", "http2_keep_alive_timeout", "http2_keep_alive_while_idle", "http2_max_frame_size",
    "http2_only", "pool_idle_timeout", "pool_max_idle_per_host", "proxy_url", "proxy_ca_certificate",
    "proxy_excludes", "randomize_addresses", "timeout", "user_agent"))
_STORE_PREFIXES = ("aws_", "azure_", "google_")


def client_option(name: str) -> Optional[str]:
    """The client setting an option names (allow_http for AWS_ALLOW_HTTP or allow_http), or None."""
    name = name.lower()
    for prefix in _STORE_PREFIXES:
        if name.startswith(prefix) and name[len(prefix):] in CLIENT_OPTIONS:
            return name[len(prefix):]
    return name if name in CLIENT_OPTIONS else None


def store_options(options: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the store's settings, the HTTP client's settings) of storage options, as obstore takes them."""
    store: dict[str, str] = {}
    client: dict[str, str] = {}
    for name, value in options.items():
        setting = client_option(name)
        if setting is None:
            store[name.lower()] = value
        else:
            client[setting] = value
    return store, client


@guarded
def store_of(uri: str) -> tuple["ObjectStore", str]:
    """(obstore store, key prefix) for an object-store URI: the store at the container or bucket, made once
    per process for the same options and credential variables (building one, its HTTP client and
    configuration, costs about 7 ms of CPU, a request it then sends about 0.4 ms; every log entry read or
    written goes through here). A store is safe to share between threads; other options, or a change of
    the variables object_store reads, make another."""
    parsed = urlparse(uri)
    options = options_for(uri)
    base = f"{parsed.scheme}://{parsed.netloc}"
    environment = sorted((k, v) for k, v in os.environ.items() if k.startswith(_STORE_ENVIRONMENT))
    key = (base, tuple(sorted(options.items())), tuple(environment))
    store = _STORES.get(key)
    if store is None:
        from obstore.store import from_url

        config, client = store_options(options)
        settings: dict[str, Any] = dict(config)
        store = from_url(base, client_options=cast("ClientConfig", client) if client else None, **settings)
        with _LOCK:
            if len(_STORES) >= _STORES_KEPT:  # options that change (fresh bearer tokens) must not pile up
                _STORES.clear()
            store = _STORES.setdefault(key, store)
    return store, parsed.path.strip("/")


def check_creatable(uri: str) -> None:
    """A local directory can be made at uri: ValueError when a part of the path is a file, or the nearest
    existing directory cannot be written. Object-store prefixes always can (the store answers for rights)."""
    if not is_local(uri):
        return
    existing = uri
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if existing != uri and not os.path.isdir(existing):
        raise ValueError(f"{uri}: {existing} is a file, so no directory can be made below it")
    directory = existing if os.path.isdir(existing) else os.path.dirname(existing)
    if not os.access(directory, os.W_OK):
        raise ValueError(f"{uri}: {existing} is not writable by this user")
    _check_hard_links(uri, directory)


def _check_hard_links(uri: str, directory: str) -> None:
    """ValueError when the file system at directory cannot hard-link a file: every commit links its log
    entry into place (the atomic put-if-absent of local disk), which FUSE mounts such as Databricks volumes
    do not offer. The probe's files are removed."""
    probe = os.path.join(directory, f".sparkbus-link-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(probe, "wb"):
            pass
        try:
            os.link(probe, probe + ".link")
        except OSError as error:
            raise ValueError(
                f"{uri}: the file system at {directory} cannot hard-link files ({error.strerror}), which every "
                "commit needs to put its log entry in place atomically; a FUSE mount (such as a Databricks volume "
                "under /Volumes) cannot hold a namespace: give the store's own location instead "
                "(abfss://container@account.dfs.core.windows.net/path or s3://bucket/path)") from None
        os.unlink(probe + ".link")
    finally:
        if os.path.exists(probe):
            os.unlink(probe)


@guarded
def is_empty(uri: str) -> bool:
    """Nothing is stored at or under uri (a missing local directory is empty; a local file is not)."""
    if is_local(uri):
        return not os.path.exists(uri) or (os.path.isdir(uri) and not os.listdir(uri))
    store, prefix = store_of(uri)
    requests.note("LIST")
    for batch in store.list(prefix + "/", chunk_size=1):
        if batch:
            return False
    return True


@guarded
def remove_tree(uri: str) -> None:
    """Delete everything at or under uri; missing is fine (delete is idempotent)."""
    if is_local(uri):
        import shutil

        shutil.rmtree(uri, ignore_errors=True)
        return
    store, prefix = store_of(uri)
    requests.note("LIST")
    for batch in store.list(prefix + "/"):
        paths = [entry["path"] for entry in batch]
        if paths:
            requests.note("DELETE")
            try:
                store.delete(paths)
            except FileNotFoundError:  # one was deleted since the listing (another remover): the others one by one
                for path in paths:
                    try:
                        store.delete(path)
                    except FileNotFoundError:
                        pass


@guarded
def listing(uri: str) -> list[str]:
    """The files (objects) directly or indirectly under uri, as URIs; [] when there are none."""
    if is_local(uri):
        return [os.path.join(top, name) for top, _, names in os.walk(uri) for name in names]
    store, prefix = store_of(uri)
    requests.note("LIST")
    parsed = urlparse(uri)
    return [f"{parsed.scheme}://{parsed.netloc}/{entry['path']}"
            for batch in store.list(prefix + "/") for entry in batch]


@guarded
def put(uri: str, data: bytes) -> None:
    """Write one file (object), replacing it; a local file's directory is created."""
    if is_local(uri):
        os.makedirs(os.path.dirname(uri), exist_ok=True)
        with open(uri, "wb") as f:
            f.write(data)
        return
    store, key = store_of(uri)
    requests.note("PUT")
    store.put(key, data)


CREATE_ATTEMPTS = 5  # tries of a put-if-absent whose connection failed (create), the first included
CREATE_BACKOFF_SECONDS = 0.2  # before the second try; doubled for each one after


@guarded
def create(uri: str, data: bytes) -> bool:
    """Create one object unless it exists (put-if-absent on an object store): whether this call created it.

    The store's client never retries a conditional PUT (only idempotent requests are retried), so a
    connection that fails mid-request (reset, timed out, refused) leaves unknown whether the object was
    written. It is tried again here; when a later try finds the object there, its bytes tell whether an
    earlier try wrote it: callers' data names a unique transaction, so no other writer's bytes equal it.
    Raises the store's error (as its SDK error) when every try failed to reach it."""
    from obstore.exceptions import AlreadyExistsError

    store, key = store_of(uri)
    for attempt in range(CREATE_ATTEMPTS):
        requests.note("PUT")
        try:
            store.put(key, data, mode="create")
            return True
        except AlreadyExistsError:
            return attempt > 0 and _holds(uri, data)
        except Exception as error:
            if attempt == CREATE_ATTEMPTS - 1 or not transient(error):
                raise
            time.sleep(CREATE_BACKOFF_SECONDS * 2 ** attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _holds(uri: str, data: bytes) -> bool:
    """Whether the object at uri holds exactly data (read back after an ambiguous create)."""
    try:
        return get(uri) == data
    except FileNotFoundError:  # created by another and removed since: not ours either
        return False


@guarded
def remove(uri: str) -> None:
    """Delete one file (object); missing is fine."""
    if is_local(uri):
        try:
            os.remove(uri)
        except FileNotFoundError:
            pass
        return
    store, key = store_of(uri)
    requests.note("DELETE")
    try:
        store.delete(key)
    except FileNotFoundError:
        pass


@guarded
def get(uri: str) -> bytes:
    """Read one file (object); FileNotFoundError when missing."""
    if is_local(uri):
        with open(uri, "rb") as f:
            return f.read()
    store, key = store_of(uri)
    requests.note("GET")
    return bytes(store.get(key).bytes())


def state_dir(root: str) -> str:
    """A local directory for a namespace's per-machine state (file locks): root itself when it is local,
    else a directory under ~/.cache/sparkbus named after the URI."""
    if is_local(root):
        return root
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "sparkbus", hashlib.sha1(root.encode()).hexdigest()[:16])
    os.makedirs(path, exist_ok=True)
    return path

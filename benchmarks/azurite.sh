#!/bin/sh
# Run a command with Azurite (installed by `make install`) serving on a free loopback port and a container
# "sparkbus" created; the emulator stops when the command ends. Usage: benchmarks/azurite.sh CMD ARGS...
set -e
dir=$(mktemp -d)
port=$(.venv/bin/python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
.azurite/node_modules/.bin/azurite-blob --blobHost 127.0.0.1 --blobPort "$port" --location "$dir" \
    --skipApiVersionCheck --loose --disableTelemetry >/dev/null 2>&1 &
server=$!
trap 'kill $server; wait $server 2>/dev/null; rm -rf "$dir"' EXIT
export AZURE_STORAGE_USE_EMULATOR=true AZURE_STORAGE_ACCOUNT_NAME=devstoreaccount1 \
    AZURE_STORAGE_ACCOUNT_KEY='Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==' \
    AZURITE_BLOB_STORAGE_URL="http://127.0.0.1:$port"
.venv/bin/python - <<PY
import time
from azure.storage.blob import BlobServiceClient
for attempt in range(100):
    try:
        BlobServiceClient.from_connection_string("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
            "AccountKey=$AZURE_STORAGE_ACCOUNT_KEY;BlobEndpoint=$AZURITE_BLOB_STORAGE_URL/devstoreaccount1;").create_container("sparkbus")
        break
    except Exception:
        time.sleep(0.2)
PY
"$@"

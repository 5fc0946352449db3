#!/usr/bin/env bash
# Schema-driven fuzzing of `core serve` against its own OpenAPI document (schemathesis).
#
#   scripts/fuzz_server.sh [MODEL]        # default: the default model; not part of `make test`
#
# Starts a server, lets schemathesis send generated requests (valid and invalid) to every
# operation of /openapi.json for at most FUZZ_SECONDS (default 240), fails on any 5xx
# (check not_a_server_error) or if the server no longer answers a completion afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
BUDGET=${FUZZ_SECONDS:-240}
PORT=${FUZZ_PORT:-8765}
EXAMPLES=${FUZZ_MAX_EXAMPLES:-40}
URL="http://127.0.0.1:$PORT"
LOG=${FUZZ_LOG:-/tmp/core-fuzz-server.log}

"$VENV/bin/python" -m pip --disable-pip-version-check -q install schemathesis

# short outputs: every generated request stays cheap (max_tokens is capped by the model length)
"$VENV/bin/core" serve ${1:+"$1"} --host 127.0.0.1 --port "$PORT" --max-model-len 256 --max-num-seqs 8 \
    >"$LOG" 2>&1 &
SERVER=$!
trap 'kill -INT $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 180); do
    curl -sf "$URL/health" >/dev/null && break
    kill -0 $SERVER 2>/dev/null || { echo "server exited; log: $LOG" >&2; tail -20 "$LOG" >&2; exit 1; }
    sleep 1
done

rc=0
timeout --signal=INT "$BUDGET" "$VENV/bin/st" --no-color run "$URL/openapi.json" \
    --checks not_a_server_error --max-examples "$EXAMPLES" --request-timeout 60 \
    --suppress-health-check all || rc=$?
if [ "$rc" = 124 ]; then
    echo "fuzzing stopped after the ${BUDGET}s budget (no failure found until then)"
    rc=0
fi

# still serving?
body='{"model": "'"$(curl -sf "$URL/v1/models" | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')"'", "prompt": "The capital of France is", "max_tokens": 8}'
if ! curl -sf -H 'Content-Type: application/json' -d "$body" "$URL/v1/completions" >/dev/null; then
    echo "the server no longer answers a completion after fuzzing; log: $LOG" >&2
    exit 1
fi
if grep -q "Traceback" "$LOG"; then
    echo "the server logged a traceback during fuzzing; log: $LOG" >&2
    grep -n -A3 "Traceback" "$LOG" | head -40 >&2
    rc=1
fi
echo "server still serving after fuzzing; schemathesis exit code $rc"
exit "$rc"

#!/usr/bin/env bash
# `make test-docker`: build docker/Dockerfile.cpu and check the served image end to end.
# Installs docker (Debian's docker.io) when missing, starts a daemon when none answers, makes
# the local base image when BASE_IMAGE cannot be pulled, then: builds, serves on a loopback
# port, asks for completions, checks the env variables' effect and errors, and stops it.
# Exits non-zero on the first failure; prints each phase's time, the image size, time to healthy.
#   BASE_IMAGE (default python:3.11-slim-bookworm)  IMAGE (core-cpu-env)  TEST_PORT (18000)
#   CA_BUNDLE: extra CA certificates for pip in the build (default: the machine's bundle)
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim-bookworm}
LOCAL_BASE=core-python:3.11-bookworm
IMAGE=${IMAGE:-core-cpu-env}
PORT=${TEST_PORT:-18000}
NAME=core-test-docker-$$
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
URL=http://127.0.0.1:$PORT

phase_start=$SECONDS
phase() { echo "== $1 ($((SECONDS - phase_start)) s)"; phase_start=$SECONDS; }
fail() { echo "FAIL: $*" >&2; exit 1; }
cleanup() { docker rm -f "$NAME" "$NAME-bad" >/dev/null 2>&1 || true; }
trap cleanup EXIT

# ---- docker: the client, a daemon, and a BuildKit-capable `docker build`
if ! command -v dockerd >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
    setsid dockerd >/var/log/dockerd-core-test.log 2>&1 </dev/null &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || fail "dockerd did not start: $(tail -5 /var/log/dockerd-core-test.log)"
fi
# a docker CLI without the buildx plugin cannot use BuildKit; docker.io's own client can
BUILD=(docker build)
if ! docker buildx version >/dev/null 2>&1; then BUILD=(env DOCKER_BUILDKIT=1 /usr/bin/docker build); fi
phase "docker ready"

# ---- base image: pull it, else make it with debootstrap (kept for the next run)
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 && ! timeout 60 docker pull -q "$BASE_IMAGE" >/dev/null 2>&1; then
    echo "cannot pull $BASE_IMAGE: using $LOCAL_BASE, made locally"
    BASE_IMAGE=$LOCAL_BASE
    docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || docker/make-base-image.sh "$BASE_IMAGE"
fi
phase "base image $BASE_IMAGE"

# ---- build: torch comes from this machine's pip (a CPU build), copied into the context
ls docker/wheels/torch-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps torch==2.13.0 -d docker/wheels
SECRET=()
[ -s "$CA_BUNDLE" ] && SECRET=(--secret "id=ca,src=$CA_BUNDLE")
"${BUILD[@]}" -q --network host -f docker/Dockerfile.cpu --target vllm-openai \
    --build-arg BASE_IMAGE="$BASE_IMAGE" "${SECRET[@]}" -t "$IMAGE" . >/dev/null
SIZE=$(docker image inspect -f '{{.Size}}' "$IMAGE")
echo "image $IMAGE: $((SIZE / 1000000)) MB"
[ "$SIZE" -lt 1500000000 ] || fail "image is $((SIZE / 1000000)) MB, over 1500 MB"
phase "build"

# ---- an invalid variable value stops the container at once, naming the variable
if status=$(timeout 120 docker run --name "$NAME-bad" -e CORE_CPU_KVCACHE_SPACE=lots "$IMAGE" 2>&1); then
    fail "the container accepted CORE_CPU_KVCACHE_SPACE=lots"
fi
grep -q CORE_CPU_KVCACHE_SPACE <<<"$status" || fail "the error does not name the variable: $status"
echo "invalid value rejected: $(grep CORE_CPU_KVCACHE_SPACE <<<"$status" | head -1)"
phase "invalid variable"

# ---- serve on loopback (host network): healthy, the variables show, real answers
started=$SECONDS
docker run -d --name "$NAME" --network host -e CORE_CPU_KVCACHE_SPACE=1 -e VLLM_CPU_OMP_THREADS_BIND=auto \
    "$IMAGE" --host 127.0.0.1 --port "$PORT" --dtype float32 --drain-timeout 60 >/dev/null
until curl -sf "$URL/health" >/dev/null; do
    [ "$(docker inspect -f '{{.State.Running}}' "$NAME")" = true ] || fail "container exited: $(docker logs "$NAME" 2>&1 | tail -20)"
    [ $((SECONDS - started)) -lt 180 ] || fail "not healthy after 180 s"
    sleep 0.5
done
echo "healthy $((SECONDS - started)) s after docker run"
# the log in a variable first: `docker logs | grep -q` under pipefail fails when grep stops
# reading early and docker logs dies of SIGPIPE (it did in CI)
logs=$(docker logs "$NAME" 2>&1)
grep -q "CPU_KVCACHE_SPACE=1.0 GiB" <<<"$logs" || fail "CORE_CPU_KVCACHE_SPACE=1 not in the start-up log"
grep -q "CPU_OMP_THREADS_BIND=auto" <<<"$logs" || fail "VLLM_CPU_OMP_THREADS_BIND not in the start-up log"
chat=$(curl -sf "$URL/v1/chat/completions" -H 'content-type: application/json' -d \
    '{"messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":24,"temperature":0}')
grep -q Paris <<<"$chat" || fail "chat completion without Paris: $chat"
completion=$(curl -sf "$URL/v1/completions" -H 'content-type: application/json' -d \
    '{"prompt":"The capital of France is","max_tokens":8,"temperature":0}')
grep -q '"finish_reason":"length"' <<<"$completion" || fail "completion did not run to max_tokens: $completion"
echo "chat: $(python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' <<<"$chat")"
phase "serve"

# ---- docker stop while a request runs: it completes, the container exits 0
curl -sf "$URL/v1/completions" -H 'content-type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":512,"ignore_eos":true,"temperature":0}' >"/tmp/$NAME.json" &
client=$!
# stop only once the server reports the request running (a fixed sleep let a fast machine finish it first)
until curl -sf "$URL/metrics" | grep -Eq '^core:num_requests_running\{[^}]*\} [1-9]'; do
    kill -0 "$client" 2>/dev/null || fail "the request finished before it was seen running"
    sleep 0.05
done
docker stop -t 70 "$NAME" >/dev/null
wait "$client" || fail "the request in flight at docker stop failed"
grep -q '"completion_tokens":512' "/tmp/$NAME.json" || fail "request in flight cut short: $(cat "/tmp/$NAME.json")"
rm -f "/tmp/$NAME.json"
code=$(docker inspect -f '{{.State.ExitCode}}' "$NAME")
[ "$code" = 0 ] || fail "exit code $code after docker stop: $(docker logs "$NAME" 2>&1 | tail -5)"
# the request's access-log line comes after the drain began: it really was in flight
docker logs "$NAME" 2>&1 | awk '/draining/ {d = NR} /POST \/v1\/completions/ {p = NR} END {exit !(d && p > d)}' ||
    fail "the request was not in flight at docker stop: $(docker logs "$NAME" 2>&1 | tail -5)"
phase "docker stop drained"
echo "test-docker: OK"

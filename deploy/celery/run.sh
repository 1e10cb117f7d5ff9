#!/usr/bin/env bash
# pack_assets scale-out on dagster-celery: a Redis broker, N Celery workers (one run each at a time), the
# Dagster daemon (sensors, queued runs) and optionally the webserver. Runs in the foreground; Ctrl-C or
# SIGTERM stops everything it started. See docs/scaling.md.
#
#   DAGSTER_HOME=/path/home PACK_ASSETS_INPUT=... PACK_ASSETS_WORK=... PACK_ASSETS_OUTPUT=... \
#     bash deploy/celery/run.sh
#
# PACK_ASSETS_REDIS_PORT (6379; 0 = use the broker in PACK_ASSETS_CELERY_BROKER, start none),
# PACK_ASSETS_CELERY_WORKERS (2), PACK_ASSETS_WEBSERVER_PORT (unset = no webserver).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
: "${DAGSTER_HOME:?set DAGSTER_HOME to the instance directory shared by the daemon and the workers}"
[ -x "$ROOT/.venv/bin/dagster" ] && PATH="$ROOT/.venv/bin:$PATH"
for tool in celery dagster-daemon; do
  command -v "$tool" >/dev/null || { echo "run.sh: $tool not found; install with PACK_ASSETS_EXTRAS=dev,celery bash scripts/setup.sh" >&2; exit 2; }
done
PORT=${PACK_ASSETS_REDIS_PORT:-6379}
WORKERS=${PACK_ASSETS_CELERY_WORKERS:-2}
if [ "$PORT" != 0 ]; then
  export PACK_ASSETS_CELERY_BROKER=${PACK_ASSETS_CELERY_BROKER:-redis://127.0.0.1:$PORT/0}
  export PACK_ASSETS_CELERY_BACKEND=${PACK_ASSETS_CELERY_BACKEND:-redis://127.0.0.1:$PORT/1}
fi
: "${PACK_ASSETS_CELERY_BROKER:?set PACK_ASSETS_CELERY_BROKER (redis://host:port/0)}"
export PACK_ASSETS_CELERY_BACKEND=${PACK_ASSETS_CELERY_BACKEND:-$PACK_ASSETS_CELERY_BROKER}
mkdir -p "$DAGSTER_HOME"
export DAGSTER_HOME=$(cd "$DAGSTER_HOME" && pwd)
[ -f "$DAGSTER_HOME/dagster.yaml" ] || cp "$HERE/dagster.yaml" "$DAGSTER_HOME/dagster.yaml"
LOGS=$DAGSTER_HOME/celery-logs
mkdir -p "$LOGS"

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 0' INT TERM

if [ "$PORT" != 0 ]; then
  command -v redis-server >/dev/null || { echo "run.sh: redis-server not found (Debian: apt-get install redis-server)" >&2; exit 2; }
  redis-server --bind 127.0.0.1 --port "$PORT" --save '' --appendonly no --dir "$LOGS" >"$LOGS/redis.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis-cli -p "$PORT" ping >/dev/null || { echo "run.sh: redis did not start, see $LOGS/redis.log" >&2; exit 1; }
fi
for i in $(seq "$WORKERS"); do
  PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" celery -A dagster_celery.app worker -Q dagster --concurrency 1 \
    -n "worker$i@%h" --loglevel INFO --logfile "$LOGS/worker$i.log" &
  pids+=($!)
done
dagster-daemon run -m pack_assets.definitions >"$LOGS/daemon.log" 2>&1 &
pids+=($!)
if [ -n "${PACK_ASSETS_WEBSERVER_PORT:-}" ]; then
  dagster-webserver -m pack_assets.definitions -h 127.0.0.1 -p "$PACK_ASSETS_WEBSERVER_PORT" >"$LOGS/webserver.log" 2>&1 &
  pids+=($!)
fi
echo "run.sh: broker $PACK_ASSETS_CELERY_BROKER, $WORKERS worker(s), logs in $LOGS" >&2
status=0
wait -n -p ended "${pids[@]}" || status=$?
# a stop signal to the whole process group (a service manager's, Ctrl-C) can end a child before this script's
# trap runs: give that signal's trap its turn before calling the child's end a failure
sleep 1
echo "run.sh: process ${ended:-?} exited (status $status); stopping the rest (see $LOGS)" >&2
exit 1

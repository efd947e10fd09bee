#!/usr/bin/env bash
# Capture -> replay walkthrough, all on this machine with emulated engines (no GPU):
#   1. serve with capture on, send some traffic with the OpenAI client, stop (flushes);
#   2. look at the capture and plan the replay (dry run);
#   3. serve the embedded default and replay the capture once per policy;
#   4. read the table; report.json, report.html and results.jsonl are left in $WORK.
#
#   bash examples/capture_replay.sh            # after `make setup`
# Environment: BIN (console scripts, default .venv/bin), PORT (default 8080),
# WORK (output folder, default a new temporary one), REQUESTS (default 12).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(cd "${BIN:-$ROOT/.venv/bin}" && pwd)
PORT=${PORT:-8080}
WORK=${WORK:-$(mktemp -d)}
REQUESTS=${REQUESTS:-12}
URL=http://127.0.0.1:$PORT
ROUTER_PID=

stop_router() {
  if [ -n "$ROUTER_PID" ]; then
    kill -TERM "$ROUTER_PID" 2>/dev/null || true
    wait "$ROUTER_PID" || true   # the router stops its emulators and flushes the capture
    ROUTER_PID=
  fi
}
trap stop_router EXIT

# Start the router in the background and wait (at most 60 s) until /ready answers 200.
start_router() {
  "$BIN/turnout" serve --port "$PORT" "$@" >"$WORK/router.out" 2>>"$WORK/router.log" &
  ROUTER_PID=$!
  "$BIN/python" - "$URL/ready" <<'PY'
import sys, time, urllib.request
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        if urllib.request.urlopen(sys.argv[1], timeout=2).status == 200:
            sys.exit(0)
    except OSError:
        time.sleep(0.2)
sys.exit("router not ready after 60 s")
PY
}

cd "$WORK"
echo "== 1. capture: router with capture on, $REQUESTS requests from the OpenAI client"
start_router --config "$ROOT/config/examples/emulated-capture.yaml"
"$BIN/python" "$ROOT/examples/openai_client.py" --base-url "$URL/v1" --requests "$REQUESTS"
stop_router
echo "captured $(wc -l <capture.jsonl) requests in $WORK/capture.jsonl"

echo "== 2. plan: what the replay will send"
"$BIN/replay" capture.jsonl --dry-run

echo "== 3. replay: the embedded default, once per policy"
start_router
"$BIN/replay" capture.jsonl --target "$URL" \
  --policy round-robin --policy class-split --policy adaptive \
  --out report.json --html report.html --results results.jsonl --no-progress
stop_router

echo "== 4. read: the table above; report.json, report.html, results.jsonl in $WORK"

#!/bin/sh
# Readiness probe for an engine pod (llama-server, vLLM, SGLang) gated by warmer, failing safe.
#
# Ready when the engine itself answers its health check AND warmer admits the box
# (GET /v1/boxes/<id>/admit: 200 ready, or let in by warmer's gate bounds; 503 held while it warms).
# When warmer cannot be reached, or does not know the box, the engine's own health decides: warmer
# being down (a rollout, a crash) must never take the engines out of their Service.
#
#   ENGINE_HEALTH_URL  the engine's own health endpoint   (default http://127.0.0.1:8000/health)
#   WARMER_ADMIT_URL   warmer's gate for this box          (required, e.g.
#                      http://warmer.warmer-system:8470/v1/boxes/$(POD_NAME)/admit)
#   PROBE_TIMEOUT      seconds each request may take       (default 2)
#
# Exit 0 = ready, 1 = not ready. Needs curl (or set CURL to a compatible client).
set -u
curl_bin=${CURL:-curl}
timeout=${PROBE_TIMEOUT:-2}
engine=${ENGINE_HEALTH_URL:-http://127.0.0.1:8000/health}
admit=${WARMER_ADMIT_URL:?set WARMER_ADMIT_URL to the warmer gate URL of this box, /v1/boxes/ID/admit}

status() {
    # the HTTP status of a GET, or 000 when nothing answered in time
    "$curl_bin" --silent --output /dev/null --write-out '%{http_code}' \
        --connect-timeout "$timeout" --max-time "$timeout" "$1" 2>/dev/null || true
}

engine_status=$(status "$engine")
if [ "$engine_status" != 200 ]; then
    echo "engine health: HTTP ${engine_status:-000}" >&2
    exit 1
fi
case $(status "$admit") in
    503)
        echo "held by warmer while it warms (bounded by its [gate] settings)" >&2
        exit 1
        ;;
    *)
        # 200 admitted; 000 unreachable, 404 unknown box, anything else: the engine's health decides
        exit 0
        ;;
esac

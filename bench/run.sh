#!/bin/sh
# CNI ADD/DEL latency and peak RSS, ours against the reference bridge + host-local plugins (bench/README.md).
# Runs as root with the project's own Node; arguments pass through (--smoke, --iterations N, --json FILE, ...).
set -eu
cd "$(dirname "$0")/.."
exec node_modules/.bin/node bench/cni-latency.ts "$@"

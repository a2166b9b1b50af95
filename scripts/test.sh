#!/bin/sh
# Every test: types, lint, the unit tests (pure: `npm run test:unit`, in parallel), the Kubernetes binaries (`make
# k8s`), then the integration, kernel, Kubernetes (a real kube-apiserver) and end-to-end tests (kernel and end-to-end ones skip, saying why, when not root). Uses the project's own Node.
set -eu
cd "$(dirname "$0")/.."
node=node_modules/.bin/node
echo "== typecheck"
"$node" node_modules/typescript/bin/tsc -p tsconfig.json
echo "== lint"
"$node" node_modules/eslint/bin/eslint.js .
echo "== unit tests"
"$node" --test --test-concurrency=4 "src/**/*.test.ts" "test/*.test.ts" "bench/*.test.ts"
echo "== Kubernetes binaries (make k8s: built once from their Go modules, cached outside the checkout)"
ATOLL_K8S_BIN=$(sh scripts/k8s.sh all | tail -n 1)
export ATOLL_K8S_BIN
echo "$ATOLL_K8S_BIN"
if [ "$(id -u)" = 0 ]; then
  echo "== the Atoll image (make image: the Kubernetes lab test installs it from build/image/)"
  "$node" scripts/image.ts
fi
echo "== integration, kernel and end-to-end tests"
# One file at a time: kernel tests build namespaces and a private containerd, and must not overlap.
"$node" --test --test-concurrency=1 --test-timeout=600000 "test/*/*.test.ts"
echo "== benchmark smoke (reports; the full runs are sh bench/run.sh [cni|controller|overlay|tunnel|circuits|watch-view|policy|cloud-peers])"
"$node" bench/circuits.ts --smoke
"$node" bench/watch-view.ts --smoke
if [ "$(id -u)" = 0 ]; then
  "$node" bench/cni-latency.ts --smoke
  "$node" bench/tunnel.ts --smoke
  "$node" bench/policy.ts --smoke
  "$node" bench/cloud-peers.ts --smoke
else
  echo "skipped: the benchmark needs root"
fi

#!/bin/sh
# Bundles the TypeScript sources into build/current/ (what bin/atoll runs): a few files load faster and take far
# less memory than hundreds of modules plus Node's TypeScript stripper, and code splitting keeps what only the
# controller, the demo or the admin commands need out of an agent (docs/architecture.md, "Memory").
# Each build goes to a new directory and build/current is switched to it by an atomic rename of a symlink, so
# concurrent builds and running processes never see half a build.
set -eu
cd "$(dirname "$0")/.."
mkdir -p build
out="dist-$(date +%s)-$$"
# External: native or proto-loading packages, and yaml (its CommonJS build requires Node built-ins, which an ESM
# bundle cannot do: the controller failed with 'Dynamic require of "process"'); node_modules has them at run time.
# prom-client likewise ('Dynamic require of "util"').
# Two entry points: the program, and the agent's NetworkPolicy worker (src/adapters/node/policy-worker.ts), which the agent
# starts as a worker thread from beside its own chunk.
node_modules/.bin/esbuild atoll=src/cli/main.ts policy-worker=src/adapters/node/policy-worker.ts --bundle --splitting --platform=node --format=esm --target=node22 \
  --external:koffi --external:@grpc/grpc-js --external:@grpc/proto-loader --external:yaml --external:prom-client \
  --entry-names='[name]' --log-level=warning --outdir="build/$out"
ln -sfn "$out" "build/.current-$$"
mv -Tf "build/.current-$$" build/current
# old builds may still be loading lazy chunks in a running process: keep them for a while
find build -maxdepth 1 -name 'dist-*' ! -name "$out" -mmin +60 -exec rm -rf {} +

#!/bin/sh
# Bundles the TypeScript sources into build/atoll.mjs (what bin/atoll runs): one file loads faster and takes far
# less memory than hundreds of modules plus Node's TypeScript stripper (docs/architecture.md, "Memory").
# Written beside its final name and renamed, so concurrent builds never leave half a file.
set -eu
cd "$(dirname "$0")/.."
mkdir -p build
tmp="build/.atoll.$$.mjs"
node_modules/.bin/esbuild src/cli/main.ts --bundle --platform=node --format=esm --target=node22 \
  --external:koffi --external:@grpc/grpc-js --external:@grpc/proto-loader \
  --log-level=warning --outfile="$tmp"
mv -f "$tmp" build/atoll.mjs

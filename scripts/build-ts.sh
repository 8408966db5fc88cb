#!/usr/bin/env bash
# Compiles the TypeScript into a fresh dist/: built in dist.new/, then swapped in by renames.
# A fresh folder, because compiling over the old one keeps the output of sources that were moved or
# deleted, and a stale lib/x.js shadows a new lib/x/index.js. Swapped, so that processes of a run
# still going keep finding a whole dist/ (the new one) when they start workers (bundling the
# workflows in-process until the new dist/ has its bundle).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf dist.new dist.old
npx --no-install tsc -p tsconfig.json --outDir dist.new
[ -d dist ] && mv dist dist.old
mv dist.new dist
rm -rf dist.old
# The cpu worker's workflow bundle, once here rather than by webpack at every worker start
# (workers/bundle.ts; a worker finding it missing or stale bundles in its own process).
node dist/workers/bundle.js

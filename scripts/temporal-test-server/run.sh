#!/bin/sh
# Starts Temporal's Java test server (time-skipping) from the jars scripts/setup.sh fetched.
# The TypeScript SDK runs this as an `existing-path` executable with the port as first argument
# (test/unit/mock-run.ts); the server serves until it is killed.
LIB="$(cd "$(dirname "$0")/../.." && pwd)/tools/temporal-test-server/lib"
[ -d "$LIB" ] || { echo "error: $LIB is missing: run bash scripts/setup.sh --tests (npm run setup)" >&2; exit 1; }
# The SDK gives the server 5 s to listen: C1 only and the serial GC start the JVM about twice as fast.
exec java -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -cp "$LIB/*" io.temporal.testserver.TestServer "$@"

#!/usr/bin/env node
'use strict';
// The CLI ships compiled: `scripts/setup.sh` (or `npm run build:ts`) writes dist/.
require('../dist/workers/cli.js').main(process.argv.slice(2));

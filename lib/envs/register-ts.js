'use strict';
/**
 * Makes plain `node` able to `require` .ts files. Needed by env worker processes forked from the
 * TypeScript sources (under jest) and by environments written in TypeScript
 * (`[[env]] id = "./my_env.ts"`) when prime-rl itself runs compiled from dist/.
 * Types are stripped by @swc/core (no type check), to CommonJS, like the jest transform.
 * It is plain JavaScript because it has to run before any TypeScript can load.
 */
if (!require.extensions['.ts']) {
  const fs = require('node:fs');
  const { transformSync } = require('@swc/core');
  // Stack traces of env errors then point at the .ts lines.
  process.setSourceMapsEnabled(true);
  require.extensions['.ts'] = function compileTypeScript(module, filename) {
    const { code } = transformSync(fs.readFileSync(filename, 'utf8'), {
      filename,
      sourceMaps: 'inline',
      module: { type: 'commonjs' },
      jsc: { target: 'es2022', parser: { syntax: 'typescript' } },
    });
    module._compile(code, filename);
  };
}

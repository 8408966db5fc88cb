// ESLint rule `imports/no-cycle`: no two files import each other, directly or around a circle,
// type-only imports included (a circle of types still ties the files' meaning together). The graph
// is the project's files as tsconfig.json lists them, their imports resolved as tsc resolves them;
// it is built once per ESLint process, from the files on disk. Each import that closes a circle is
// reported at its line, with the circle it closes.
import fs from 'node:fs';
import path from 'node:path';
import ts from 'typescript';

/** root -> { resolve(from, spec), cycleOf: Map<file, Set<file>>, edges: Map<file, Set<file>> } */
const graphs = new Map();

function projectGraph(root) {
  let g = graphs.get(root);
  if (g) return g;
  const configFile = path.join(root, 'tsconfig.json');
  const { config } = ts.readConfigFile(configFile, ts.sys.readFile);
  const { fileNames, options } = ts.parseJsonConfigFileContent(config, ts.sys, root);
  const files = new Set(fileNames.map((f) => path.resolve(f)));
  const cache = ts.createModuleResolutionCache(root, (f) => f, options);
  /** The project file `spec` names from `from`, or undefined (a package, a built-in, a missing file). */
  const resolve = (from, spec) => {
    const r = ts.resolveModuleName(spec, from, options, ts.sys, cache).resolvedModule;
    const file = r && path.resolve(r.resolvedFileName);
    return file && files.has(file) ? file : undefined;
  };
  const edges = new Map();
  for (const file of files) {
    const { importedFiles } = ts.preProcessFile(fs.readFileSync(file, 'utf8'), true, true);
    edges.set(file, new Set(importedFiles.map((i) => resolve(file, i.fileName)).filter(Boolean)));
  }
  // Strongly connected components (Tarjan): the files of each circle.
  const cycleOf = new Map();
  let next = 0;
  const index = new Map();
  const low = new Map();
  const stack = [];
  const onStack = new Set();
  const visit = (v) => {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of edges.get(v)) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v), low.get(w)));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v), index.get(w)));
    }
    if (low.get(v) !== index.get(v)) return;
    const component = new Set();
    let w;
    do {
      w = stack.pop();
      onStack.delete(w);
      component.add(w);
    } while (w !== v);
    if (component.size > 1) for (const f of component) cycleOf.set(f, component);
  };
  for (const f of files) if (!index.has(f)) visit(f);
  g = { resolve, cycleOf, edges };
  graphs.set(root, g);
  return g;
}

/** The shortest way from `from` back to `to` inside one circle (BFS), as files. */
function wayBack(edges, component, from, to) {
  const previous = new Map([[from, null]]);
  const queue = [from];
  while (queue.length > 0) {
    const v = queue.shift();
    if (v === to) break;
    for (const w of edges.get(v)) {
      if (component.has(w) && !previous.has(w)) {
        previous.set(w, v);
        queue.push(w);
      }
    }
  }
  const way = [];
  for (let v = to; v !== null && v !== undefined; v = previous.get(v)) way.unshift(v);
  return way;
}

const noCycle = {
  meta: {
    type: 'problem',
    docs: { description: 'no two files import each other, directly or around a circle (type imports too)' },
    schema: [],
  },
  create(context) {
    const root = context.cwd;
    const file = path.resolve(context.filename);
    const { resolve, cycleOf, edges } = projectGraph(root);
    const component = cycleOf.get(file);
    if (!component) return {};
    const check = (node, source) => {
      if (typeof source?.value !== 'string') return;
      const target = resolve(file, source.value);
      if (!target || !component.has(target)) return;
      const rel = (f) => path.relative(root, f);
      const circle = [file, ...wayBack(edges, component, target, file)].map(rel).join(' -> ');
      context.report({
        node,
        message: `import cycle: ${circle}. No two files import each other, also by type: move what they share into a file below both`,
      });
    };
    return {
      ImportDeclaration: (node) => check(node, node.source),
      ExportNamedDeclaration: (node) => check(node, node.source),
      ExportAllDeclaration: (node) => check(node, node.source),
      ImportExpression: (node) => check(node, node.source),
      TSImportEqualsDeclaration: (node) => check(node, node.moduleReference?.expression),
      CallExpression: (node) => {
        if (node.callee.type === 'Identifier' && node.callee.name === 'require') check(node, node.arguments[0]);
      },
    };
  },
};

export default { rules: { 'no-cycle': noCycle } };

// Checks that every relative link in the project's Markdown files resolves: the file or folder
// exists, and a #anchor names a heading of the target file, slugged as GitHub does. And that every
// backticked path into the repository (`lib/inference/prompts.ts`, `native/src/addon/`) exists, with
// what a `file:symbol` names in it (`workflows/rl.ts:EVENTS_IN_ORDER`: the word is in the file;
// `file:12`: the file has that line), so that code moved or renamed fails lint until the docs
// follow (a path not in this repository may be one of prime-rl's, whose files test/fixtures/prime-rl/repo/
// holds). Part of `npm run lint`; dependency-free and fast (it reads a few dozen files).
//   node scripts/check-doc-links.mjs [ROOT]      (ROOT: another tree to check; default this one)
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(process.argv[2] ?? path.join(path.dirname(fileURLToPath(import.meta.url)), '..'));
// Installed, generated or run output, and fixtures that are data rather than documentation.
const SKIP = new Set(['node_modules', 'tools', 'build', 'dist', 'outputs', '.git', '.gpu', 'fixtures']);

function markdownFiles(dir) {
  const found = [];
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    if (SKIP.has(entry.name) || entry.name.startsWith('.venv') || entry.name.startsWith('dist.')) continue;
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) found.push(...markdownFiles(full));
    else if (entry.isFile() && entry.name.endsWith('.md')) found.push(full);
  }
  return found;
}

/** The lines outside fenced code blocks, with their 1-based line numbers. */
function proseLines(text) {
  const lines = [];
  let fence = null;
  text.split('\n').forEach((line, i) => {
    const open = /^\s*(```|~~~)/.exec(line);
    if (open) {
      if (fence === null) fence = open[1];
      else if (open[1] === fence) fence = null;
      return;
    }
    if (fence === null) lines.push({ line, number: i + 1 });
  });
  return lines;
}

/** GitHub's heading anchor: lower case, punctuation dropped, spaces as hyphens; repeats get -1, -2, ... */
function anchorsOf(file) {
  const seen = new Map();
  const anchors = new Set();
  for (const { line } of proseLines(fs.readFileSync(file, 'utf8'))) {
    const heading = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!heading) continue;
    const text = heading[1].replace(/\[([^\]]*)\]\([^)]*\)/g, '$1');
    const base = text
      .toLowerCase()
      .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '')
      .replace(/ /g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

const anchorCache = new Map();
const anchors = (file) => {
  if (!anchorCache.has(file)) anchorCache.set(file, anchorsOf(file));
  return anchorCache.get(file);
};

/**
 * What a backticked reference is: a path whose first part is a tracked entry of the repository's
 * root (`lib/...`, `.ci/run`, `README.md`), optionally `:symbol` (a word, dotted for a member) or
 * `:line`. Run-folder paths (`weights/step_N`), config keys and commands are none.
 */
const ROOT_ENTRIES = new Set(
  fs.readdirSync(root).filter((n) => !SKIP.has(n) && n !== '.git' && !n.startsWith('.venv') && !n.startsWith('dist.')),
);
/** Paths of prime-rl's repository (the Python original) the docs name: its files we hold a copy of. */
const PRIME_RL_REPO = 'test/fixtures/prime-rl/repo';
const SYMBOL = '[A-Za-z_$][\\w$]*(?:(?:\\.|::)[A-Za-z_$][\\w$]*)*';
const REFERENCE = new RegExp(`^([\\w.-]+(?:/[\\w.*<>{}-]+)*/?)(?::(\\d+)|:(${SYMBOL})(?:\\(\\))?)?$`);
/** "`symbol` in `file`", "`a`, `b` and `c` in `file`": each a `file:symbol` reference. */
const SYMBOLS_IN = new RegExp(`((?:\`${SYMBOL}(?:\\(\\))?\`(?:,\\s*|\\s+and\\s+)?)+)\\s+in\\s+\`([^\`\\s:]+)\``, 'g');

/** What is wrong with backticked `span` as a reference into the repository; null when nothing (or it is none). */
function referenceProblem(span) {
  const m = REFERENCE.exec(span);
  if (!m || !ROOT_ENTRIES.has(m[1].split('/')[0])) return null;
  const [, ref, line, symbol] = m;
  // A pattern (`native/src/*.cc`, `test/<name>.test.ts`): the folder before its first wildcard.
  const wild = ref.search(/[*<>{}]/);
  const checked = wild < 0 ? ref : ref.slice(0, ref.lastIndexOf('/', wild) + 1);
  const here = path.join(root, checked);
  const full = fs.existsSync(here) ? here : path.join(root, PRIME_RL_REPO, checked);
  if (!fs.existsSync(full)) return `no such file or folder (nor in prime-rl's, ${PRIME_RL_REPO}/)`;
  if (wild >= 0 || (line === undefined && symbol === undefined)) return null;
  if (!fs.statSync(full).isFile()) return `${checked} is a folder, not a file`;
  const text = fs.readFileSync(full, 'utf8');
  if (line !== undefined) {
    const lines = text.split('\n').length;
    return Number(line) <= lines ? null : `${checked} has ${lines} lines`;
  }
  const missing = symbol
    .split(/\.|::/)
    .find((word) => !new RegExp(`(?<![\\w$])${word.replace(/\$/g, '\\$')}(?![\\w$])`).test(text));
  return missing === undefined ? null : `no \`${missing}\` in ${checked}`;
}

const problems = [];
for (const file of markdownFiles(root)) {
  const rel = path.relative(root, file);
  for (const { line, number } of proseLines(fs.readFileSync(file, 'utf8'))) {
    const spans = [...line.matchAll(/`([^`\s]+)`/g)].map((m) => m[1]);
    for (const [, symbols, file] of line.matchAll(SYMBOLS_IN))
      for (const [, symbol] of symbols.matchAll(new RegExp(`\`(${SYMBOL})`, 'g'))) spans.push(`${file}:${symbol}`);
    for (const span of spans) {
      const problem = referenceProblem(span);
      if (problem) problems.push(`${rel}:${number}: \`${span}\`: ${problem}`);
    }
    const prose = line.replace(/`[^`]*`/g, '');
    for (const m of prose.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) {
      const target = m[1];
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // http:, https:, mailto:
      const hash = target.indexOf('#');
      const linkPath = decodeURIComponent(hash < 0 ? target : target.slice(0, hash));
      const anchor = hash < 0 ? null : decodeURIComponent(target.slice(hash + 1));
      const resolved = linkPath === '' ? file : path.resolve(path.dirname(file), linkPath);
      if (!fs.existsSync(resolved)) {
        problems.push(`${rel}:${number}: ${target}: no such file`);
      } else if (anchor !== null) {
        if (!resolved.endsWith('.md'))
          problems.push(`${rel}:${number}: ${target}: an anchor into a file that is not Markdown`);
        else if (!anchors(resolved).has(anchor)) {
          problems.push(`${rel}:${number}: ${target}: no heading "#${anchor}" in ${path.relative(root, resolved)}`);
        }
      }
    }
  }
}

if (problems.length > 0) {
  console.error(`Broken links and references in Markdown files (${problems.length}):\n${problems.join('\n')}`);
  process.exit(1);
}

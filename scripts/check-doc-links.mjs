// Checks that every relative link in the project's Markdown files resolves: the file or folder
// exists, and a #anchor names a heading of the target file, slugged as GitHub does. Part of
// `npm run lint`; dependency-free and fast (it reads a few dozen files).
//   node scripts/check-doc-links.mjs
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
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

const problems = [];
for (const file of markdownFiles(root)) {
  const rel = path.relative(root, file);
  for (const { line, number } of proseLines(fs.readFileSync(file, 'utf8'))) {
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
  console.error(`Broken links in Markdown files (${problems.length}):\n${problems.join('\n')}`);
  process.exit(1);
}

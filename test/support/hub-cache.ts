/**
 * A Hugging Face hub cache made by hand, laid out as huggingface_hub writes it: each file of a
 * snapshot is a relative link into the repository's `blobs/` (named by the content's sha256),
 * `refs/main` names the snapshot's commit. Tests put one of our tiny models and a parquet dataset
 * in it under `Org/Name`s and set HF_HUB_CACHE, as a user's `hf download` would have.
 */
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import { createRequire } from 'node:module';
import * as path from 'node:path';
import type { FileMetaData } from 'hyparquet';

/** Adds a repository snapshot of `files` (relative path -> content) to the cache; returns the snapshot folder. */
export function addToHubCache(
  cache: string,
  type: 'model' | 'dataset',
  repo: string,
  files: Record<string, Buffer | string>,
): string {
  const repoDir = path.join(cache, [`${type}s`, ...repo.split('/')].join('--'));
  const commit = createHash('sha1')
    .update(`${repo}:${Object.keys(files).sort().join(',')}`)
    .digest('hex');
  const snapshot = path.join(repoDir, 'snapshots', commit);
  for (const [rel, content] of Object.entries(files)) {
    const sha = createHash('sha256').update(content).digest('hex');
    const blob = path.join(repoDir, 'blobs', sha);
    fs.mkdirSync(path.dirname(blob), { recursive: true });
    fs.writeFileSync(blob, content);
    const link = path.join(snapshot, rel);
    fs.mkdirSync(path.dirname(link), { recursive: true });
    fs.symlinkSync(path.relative(path.dirname(link), blob), link);
  }
  fs.mkdirSync(path.join(repoDir, 'refs'), { recursive: true });
  fs.writeFileSync(path.join(repoDir, 'refs', 'main'), commit);
  return snapshot;
}

/** The files of a folder (recursively), for addToHubCache. */
export function folderFiles(dir: string): Record<string, Buffer> {
  const out: Record<string, Buffer> = {};
  for (const entry of fs.readdirSync(dir, { recursive: true, withFileTypes: true })) {
    if (!entry.isFile()) continue;
    const full = path.join(entry.parentPath, entry.name);
    out[path.relative(dir, full)] = fs.readFileSync(full);
  }
  return out;
}

type Message = { role: string; content: string };

/**
 * A parquet file of prompt/completion message lists, written by hyparquet-writer with the schema
 * the datasets library gives such columns (list<struct<content: string, role: string>>).
 */
export function conversationsParquet(rows: { prompt: Message[]; completion: Message[] }[]): Buffer {
  const messages = (name: string) => [
    { name, repetition_type: 'OPTIONAL', converted_type: 'LIST', num_children: 1 },
    { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
    { name: 'element', repetition_type: 'OPTIONAL', num_children: 2 },
    { name: 'content', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' },
    { name: 'role', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' },
  ];
  const options = {
    columnData: [
      { name: 'prompt', data: rows.map((r) => r.prompt) },
      { name: 'completion', data: rows.map((r) => r.completion) },
    ],
    schema: [{ name: 'schema', num_children: 2 }, ...messages('prompt'), ...messages('completion')],
    codec: 'SNAPPY',
  };
  // hyparquet-writer is an ES module, which jest's module registry does not load: plain Node writes it.
  const script = `const { parquetWriteBuffer } = require('hyparquet-writer');
    const options = JSON.parse(require('node:fs').readFileSync(0, 'utf8'));
    process.stdout.write(Buffer.from(parquetWriteBuffer(options)).toString('base64'));`;
  const r = spawnSync(process.execPath, ['-e', script], {
    input: JSON.stringify(options),
    cwd: path.join(__dirname, '..', '..'),
    encoding: 'utf8',
    maxBuffer: 1 << 28,
  });
  if (r.status !== 0) throw new Error(`writing parquet failed: ${r.stderr}`);
  return Buffer.from(r.stdout, 'base64');
}

/**
 * `parquet` with its footer rewritten by `edit` (its pages as they were): a file that lies about
 * its rows, values or chunks, as a hostile dataset would.
 */
export function withFooter(parquet: Buffer, edit: (metadata: FileMetaData) => void): Buffer {
  // ES modules: loaded with require (require(esm), Node >= 20.19; jest transforms them).
  const nodeRequire = createRequire(__filename);
  const { parquetMetadata } = nodeRequire('hyparquet') as typeof import('hyparquet');
  const { writeMetadata } = nodeRequire('hyparquet-writer/src/metadata.js') as {
    writeMetadata(writer: unknown, metadata: FileMetaData): void;
  };
  const { ByteWriter } = nodeRequire('hyparquet-writer') as {
    ByteWriter: new () => { getBytes(): Uint8Array };
  };
  const metadata = parquetMetadata(new Uint8Array(parquet));
  edit(metadata);
  const writer = new ByteWriter();
  writeMetadata(writer, metadata);
  const footer = Buffer.from(writer.getBytes());
  const length = Buffer.alloc(4);
  length.writeUInt32LE(footer.length);
  const data = parquet.subarray(0, parquet.length - 8 - parquet.readUInt32LE(parquet.length - 8));
  return Buffer.concat([data, footer, length, Buffer.from('PAR1')]);
}

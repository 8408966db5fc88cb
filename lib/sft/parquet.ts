/**
 * The rows of a parquet file (read with hyparquet and its compressors: snappy, zstd, gzip, brotli,
 * lz4), once its structure has been checked against the file. A parquet file says in its footer,
 * and in a header before each page, how many rows and values it holds and where; hyparquet
 * allocates by those numbers. A 1.2 KB file claiming 10^9 rows in a row group took the reader's
 * process down (V8 heap exhausted), 2^53 rows gave "Invalid array length", 20,000 row-group entries
 * pointing at the same bytes made 781 MB of rows. So before anything is allocated by them: both
 * magic numbers, the footer within the file, every column chunk within the data and apart from the
 * others, every page within its chunk, the counts adding up, and at most one row or value per bit
 * of a row group's bytes (far more than any dataset's text compresses to). Every error names the file.
 */
import * as fs from 'node:fs';
import { createRequire } from 'node:module';
import type { FileMetaData, PageHeader } from 'hyparquet';

// hyparquet is an ES module: loaded with require (require(esm), Node >= 20.19; jest transforms it).
const nodeRequire = createRequire(__filename);

const MAGIC = 'PAR1';
/** Rows, and values of a column, a row group may claim per byte of its column chunks: one per bit. */
const VALUES_PER_BYTE = 8;
/** The largest page hyparquet may allocate (writers make pages of about 1 MiB). */
const MAX_PAGE_BYTES = 256 << 20;

/** A parquet file that cannot be read as what it claims to be; the message names the file. */
export class ParquetError extends Error {
  override readonly name = 'ParquetError';
}

/** The rows of `file`, each an object of its columns. Throws a ParquetError naming the file. */
export async function readParquetRows(file: string): Promise<Record<string, unknown>[]> {
  const bad = (why: string) => new ParquetError(`${file}: not a readable parquet file: ${why}`);
  let bytes: Buffer;
  try {
    bytes = fs.readFileSync(file);
  } catch (e) {
    throw bad(`cannot read it (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
  }
  const whole = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength) as ArrayBuffer;
  const { parquetMetadata, parquetReadObjects } = nodeRequire('hyparquet') as typeof import('hyparquet');
  const { compressors } = nodeRequire('hyparquet-compressors') as typeof import('hyparquet-compressors');
  let metadata: FileMetaData;
  try {
    metadata = checkFooter(bytes, (view) => parquetMetadata(view));
  } catch (e) {
    throw bad((e as Error).message);
  }
  const problem = checkStructure(bytes, metadata);
  if (problem) throw bad(problem);
  try {
    return await parquetReadObjects({ file: whole, metadata, compressors });
  } catch (e) {
    throw bad((e as Error).message);
  }
}

/** Both magic numbers and the footer's length, then the footer parsed. */
function checkFooter(bytes: Buffer, parse: (footer: Uint8Array) => FileMetaData): FileMetaData {
  const size = bytes.length;
  if (size < 12) throw new Error(`it is ${size} bytes, less than the 12 of an empty one`);
  if (bytes.toString('latin1', 0, 4) !== MAGIC) throw new Error(`it does not start with ${MAGIC}`);
  if (bytes.toString('latin1', size - 4) !== MAGIC) throw new Error(`it does not end with ${MAGIC}`);
  const footer = bytes.readUInt32LE(size - 8);
  if (footer > size - 12) throw new Error(`its footer claims ${footer} bytes, more than the file's ${size - 12}`);
  try {
    return parse(new Uint8Array(bytes.buffer, bytes.byteOffset + size - 8 - footer, footer + 8));
  } catch (e) {
    throw new Error(`its footer cannot be parsed (${(e as Error).message})`);
  }
}

/** A column chunk: where its bytes are, and the values it claims. */
interface Chunk {
  start: number;
  end: number;
  values: number;
  where: string;
}

/**
 * What is wrong with the row groups, column chunks and pages `metadata` describes, if anything:
 * first what the footer says (cheap), then each chunk's page headers.
 */
function checkStructure(bytes: Buffer, metadata: FileMetaData): string | undefined {
  const dataEnd = bytes.length - 8 - bytes.readUInt32LE(bytes.length - 8);
  const leaves = metadata.schema.filter((e) => e.type !== undefined).length;
  const chunks: Chunk[] = [];
  let rows = 0;
  for (const [g, group] of metadata.row_groups.entries()) {
    const groupRows = Number(group.num_rows);
    if (!Number.isSafeInteger(groupRows) || groupRows < 0) return `row group ${g} claims ${group.num_rows} rows`;
    if (group.columns.length !== leaves)
      return `row group ${g} has ${group.columns.length} column chunks for ${leaves} columns`;
    let groupBytes = 0;
    let most = groupRows;
    for (const [c, column] of group.columns.entries()) {
      const where = `row group ${g}, column ${c}`;
      const meta = column.meta_data;
      if (!meta) return `${where} has no metadata`;
      if (column.file_path) return `${where} is in another file (${JSON.stringify(column.file_path.slice(0, 80))})`;
      const data = Number(meta.data_page_offset);
      const dictionary = Number(meta.dictionary_page_offset ?? 0);
      const start = dictionary > 0 ? Math.min(dictionary, data) : data;
      const end = start + Number(meta.total_compressed_size);
      if (!(start >= 4 && end >= start && end <= dataEnd))
        return `${where} claims bytes ${start} to ${end}, outside the data (bytes 4 to ${dataEnd})`;
      const values = Number(meta.num_values);
      if (!Number.isSafeInteger(values) || values < groupRows)
        return `${where} claims ${meta.num_values} values for ${groupRows} rows (each row has at least one)`;
      chunks.push({ start, end, values, where });
      groupBytes += end - start;
      most = Math.max(most, values);
    }
    if (most > VALUES_PER_BYTE * groupBytes)
      return `row group ${g} claims ${most} rows or values in ${groupBytes} bytes, more than one a bit`;
    rows += groupRows;
  }
  if (rows !== Number(metadata.num_rows)) return `it claims ${metadata.num_rows} rows, and its row groups hold ${rows}`;
  const byStart = [...chunks].sort((a, b) => a.start - b.start);
  for (let i = 1; i < byStart.length; i++)
    if (byStart[i].start < byStart[i - 1].end) return `${byStart[i].where} overlaps ${byStart[i - 1].where}`;
  const { parquetHeader } = nodeRequire('hyparquet/src/column.js') as {
    parquetHeader(reader: { view: DataView; offset: number }): PageHeader;
  };
  for (const chunk of chunks) {
    const pages = checkPages(bytes, chunk, parquetHeader);
    if (typeof pages === 'string') return `${chunk.where}: ${pages}`;
    if (pages !== chunk.values) return `${chunk.where} claims ${chunk.values} values, and its pages hold ${pages}`;
  }
  return undefined;
}

/** The values of the data pages of `chunk`, or what is wrong with a page. */
function checkPages(
  bytes: Buffer,
  { start, end }: Chunk,
  parquetHeader: (reader: { view: DataView; offset: number }) => PageHeader,
): number | string {
  let values = 0;
  // Its view ends where the chunk does: a header running past it fails to parse.
  const reader = { view: new DataView(bytes.buffer, bytes.byteOffset, end), offset: start };
  for (let p = 0; reader.offset < end; p++) {
    let header: PageHeader;
    try {
      header = parquetHeader(reader);
    } catch (e) {
      return `page ${p} has no readable header (${(e as Error).message})`;
    }
    const { compressed_page_size: compressed, uncompressed_page_size: uncompressed } = header;
    if (!(compressed >= 0 && reader.offset + compressed <= end))
      return `page ${p} claims ${compressed} bytes, past the end of its column chunk`;
    if (!(uncompressed >= 0 && uncompressed <= MAX_PAGE_BYTES))
      return `page ${p} claims ${uncompressed} bytes uncompressed (at most ${MAX_PAGE_BYTES} are read)`;
    reader.offset += compressed;
    const data = header.data_page_header ?? header.data_page_header_v2;
    if (data) {
      if (!(Number.isSafeInteger(data.num_values) && data.num_values >= 0))
        return `page ${p} claims ${data.num_values} values`;
      values += data.num_values;
    }
  }
  return values;
}

import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type { WeightTensor } from '../../lib/model/arch';
import {
  INDEX_FILE,
  parseSafetensors,
  readSafetensors,
  readSafetensorsAsync,
  readSafetensorsDir,
  readSafetensorsDirAsync,
  readFileRange,
  readSafetensorsIndex,
  serializeSafetensors,
  writeSafetensors,
  writeSafetensorsStream,
  type SelectTensors,
} from '../../lib/model/safetensors';
import { fileSha256 } from '../../lib/runfolder/checkpoint';

const FIXTURES = path.join(__dirname, '..', 'fixtures', 'hf-reference');

function f32(name: string, shape: number[], values: number[]): WeightTensor {
  return { name, dtype: 'F32', shape, data: Buffer.from(new Float32Array(values).buffer) };
}

const sample: WeightTensor[] = [
  f32('b.weight', [2, 3], [1, -2, 3.5, Number.MIN_VALUE, -0, 1e30]),
  { name: 'a.bias', dtype: 'BF16', shape: [3], data: Buffer.from([0x80, 0x3f, 0x00, 0xc0, 0x7f, 0x7f]) },
  { name: 'c.half', dtype: 'F16', shape: [1], data: Buffer.from([0x00, 0x3c]) },
  f32('d.scalar', [], [7]),
  f32('e.empty', [0, 4], []),
];

/** A safetensors file with a hand-written header, for the error paths. */
function rawFile(header: unknown, dataBytes: number, headerLength?: number): Buffer {
  const json = Buffer.from(typeof header === 'string' ? header : JSON.stringify(header));
  const prefix = Buffer.alloc(8);
  prefix.writeBigUInt64LE(BigInt(headerLength ?? json.length));
  return Buffer.concat([prefix, json, Buffer.alloc(dataBytes)]);
}

let tmp: string;
beforeEach(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'st-'));
});
afterEach(() => fs.rmSync(tmp, { recursive: true, force: true }));

describe('streamed writes (tensors in batches, the header first)', () => {
  const entries = sample.map(({ name, dtype, shape }) => ({ name, dtype, shape }));
  async function* batches(tensors: WeightTensor[]) {
    yield tensors.slice(0, 2);
    yield tensors.slice(2);
  }

  test('the file reads back as written, in the order given; its index locates each tensor; the sha256 is returned', async () => {
    const file = path.join(tmp, 'streamed.safetensors');
    const sha256 = await writeSafetensorsStream(file, entries, batches(sample), { format: 'pt' });
    expect(sha256).toBe(fileSha256(file));
    const back = readSafetensors(file);
    expect(back.metadata).toEqual({ format: 'pt' });
    expect(back.tensors.map((t) => t.name)).toEqual(sample.map((t) => t.name));
    for (const t of readSafetensorsIndex(file).tensors) {
      const original = sample.find((x) => x.name === t.name)!;
      expect(readFileRange(file, t.begin, t.end - t.begin).equals(original.data)).toBe(true);
    }
  });

  test('a tensor out of order or missing fails the write and leaves no file', async () => {
    const file = path.join(tmp, 'bad.safetensors');
    await expect(
      writeSafetensorsStream(file, entries, batches([sample[1], sample[0], ...sample.slice(2)])),
    ).rejects.toThrow(/tensor 0 is 'a.bias'.*expected .*b.weight/);
    await expect(writeSafetensorsStream(file, entries, batches(sample.slice(0, 3)))).rejects.toThrow(
      /3 of 5 tensors arrived/,
    );
    expect(fs.readdirSync(tmp)).toEqual([]);
  });
});

describe('round trip', () => {
  test('serialize then parse gives the same tensors, bitwise, sorted by name', () => {
    const bytes = serializeSafetensors(sample, { format: 'pt' });
    const { tensors, metadata } = parseSafetensors(bytes);
    expect(metadata).toEqual({ format: 'pt' });
    expect(tensors.map((t) => t.name)).toEqual(['a.bias', 'b.weight', 'c.half', 'd.scalar', 'e.empty']);
    for (const t of tensors) {
      const orig = sample.find((s) => s.name === t.name)!;
      expect(t.dtype).toBe(orig.dtype);
      expect(t.shape).toEqual(orig.shape);
      expect(Buffer.compare(t.data, orig.data)).toBe(0);
    }
    expect(Buffer.compare(serializeSafetensors(tensors, metadata), bytes)).toBe(0);
  });

  test('header is padded with spaces to a multiple of 8 and tensor data are zero-copy slices', () => {
    const bytes = serializeSafetensors(sample);
    const n = Number(bytes.readBigUInt64LE(0));
    expect(n % 8).toBe(0);
    expect(bytes.subarray(8, 8 + n).toString()).toMatch(/^\{.*\} *$/);
    const { tensors } = parseSafetensors(bytes);
    expect(tensors[0].data.buffer).toBe(bytes.buffer);
  });

  test('files written atomically read back identically and leave no temp files', () => {
    const file = path.join(tmp, 'model.safetensors');
    writeSafetensors(file, sample, { format: 'pt' });
    writeSafetensors(file, sample, { format: 'pt' });
    expect(fs.readdirSync(tmp)).toEqual(['model.safetensors']);
    expect(Buffer.compare(fs.readFileSync(file), serializeSafetensors(sample, { format: 'pt' }))).toBe(0);
    expect(readSafetensors(file).tensors.map((t) => t.name)).toEqual([
      'a.bias',
      'b.weight',
      'c.half',
      'd.scalar',
      'e.empty',
    ]);
  });

  test.each(['llama', 'qwen2', 'qwen3'])(
    're-serialising a file written by the reference (Rust) writer reproduces it byte for byte (%s)',
    (arch) => {
      const file = path.join(FIXTURES, arch, 'model.safetensors');
      const bytes = fs.readFileSync(file);
      const { tensors, metadata } = readSafetensors(file);
      expect(Buffer.compare(serializeSafetensors(tensors, metadata), bytes)).toBe(0);
    },
  );

  test('sharded folders are read through the index weight_map', () => {
    writeSafetensors(path.join(tmp, 'model-00001-of-00002.safetensors'), sample.slice(0, 2));
    writeSafetensors(path.join(tmp, 'model-00002-of-00002.safetensors'), sample.slice(2));
    const weightMap = Object.fromEntries(
      sample.map((t, i) => [t.name, `model-0000${i < 2 ? 1 : 2}-of-00002.safetensors`]),
    );
    fs.writeFileSync(path.join(tmp, INDEX_FILE), JSON.stringify({ metadata: {}, weight_map: weightMap }));
    expect(
      readSafetensorsDir(tmp)
        .map((t) => t.name)
        .sort(),
    ).toEqual(sample.map((t) => t.name).sort());
  });
});

describe('reading without blocking the event loop (a server loading new weights)', () => {
  const same = (a: { name: string; dtype: string; shape: number[]; data: Buffer }[], b: typeof a) => {
    expect(a.map(({ name, dtype, shape }) => ({ name, dtype, shape }))).toEqual(
      b.map(({ name, dtype, shape }) => ({ name, dtype, shape })),
    );
    a.forEach((t, i) => expect(Buffer.compare(t.data, b[i].data)).toBe(0));
  };

  test('the async reader gives what the sync one gives, tensors larger than its 64 MiB pieces included', async () => {
    // 70 MB: read in two pieces at two offsets of one buffer, beside small tensors.
    const big = new Float32Array(17_500_000);
    for (let i = 0; i < big.length; i += 4099) big[i] = i;
    const tensors = [
      ...sample,
      { name: 'big', dtype: 'F32' as const, shape: [big.length], data: Buffer.from(big.buffer) },
    ];
    const file = path.join(tmp, 'model.safetensors');
    writeSafetensors(file, tensors, { format: 'pt' });
    const [sync, async] = [readSafetensors(file), await readSafetensorsAsync(file)];
    same(async.tensors, sync.tensors);
    expect(async.metadata).toEqual({ format: 'pt' });
  });

  test('sharded folders: the async reader follows the index as the sync one does', async () => {
    writeSafetensors(path.join(tmp, 'model-00001-of-00002.safetensors'), sample.slice(0, 2));
    writeSafetensors(path.join(tmp, 'model-00002-of-00002.safetensors'), sample.slice(2));
    const weightMap = Object.fromEntries(
      sample.map((t, i) => [t.name, `model-0000${i < 2 ? 1 : 2}-of-00002.safetensors`]),
    );
    fs.writeFileSync(path.join(tmp, INDEX_FILE), JSON.stringify({ metadata: {}, weight_map: weightMap }));
    same(await readSafetensorsDirAsync(tmp), readSafetensorsDir(tmp));
  });
});

describe('a folder read chosen by its headers (how a model is loaded: one check, on the headers)', () => {
  test.each([
    ['sync', (select: SelectTensors) => Promise.resolve(readSafetensorsDir(tmp, select))],
    ['async', (select: SelectTensors) => readSafetensorsDirAsync(tmp, select)],
  ])('%s: select sees every header once, and the tensors it chose come back in its order', async (_, read) => {
    writeSafetensors(path.join(tmp, 'model.safetensors'), sample);
    const seen: string[][] = [];
    const back = await read((h) => {
      seen.push(h.map((t) => t.name));
      return [h[3], h[0]];
    });
    // The headers in the file's order (the writer sorts by name); the data of the two chosen only.
    const byName = [...sample].sort((x, y) => x.name.localeCompare(y.name));
    expect(seen).toEqual([byName.map((t) => t.name)]);
    expect(back).toEqual([byName[3], byName[0]]);
  });

  test.each([
    ['sync', (select: SelectTensors) => Promise.resolve().then(() => readSafetensorsDir(tmp, select))],
    ['async', (select: SelectTensors) => readSafetensorsDirAsync(tmp, select)],
  ])('%s: a file replaced between the header read and the data read is refused, naming the tensor', async (_, read) => {
    const file = path.join(tmp, 'model.safetensors');
    writeSafetensors(file, sample);
    const changed = sample.map((t) => (t.name === 'b.weight' ? f32('b.weight', [3, 2], [1, 2, 3, 4, 5, 6]) : t));
    const replace: SelectTensors = (h) => {
      writeSafetensors(file, changed);
      return h;
    };
    expect(readSafetensorsDir(tmp).find((t) => t.name === 'b.weight')?.shape).toEqual([2, 3]);
    await expect(read(replace)).rejects.toThrow(`${tmp}: tensor 'b.weight' changed while the folder was read`);
  });
});

describe('errors name the file and the tensor', () => {
  const ok = { w: { dtype: 'F32', shape: [2], data_offsets: [0, 8] } };

  test.each<[string, Buffer, RegExp]>([
    ['file shorter than the length prefix', Buffer.from([1, 2, 3]), /x\.safetensors: file too short/],
    ['header length beyond the file', rawFile(ok, 8, 10_000), /header length 10000 exceeds the file/],
    ['absurd header length', rawFile(ok, 8, 2 ** 40), /header length \d+ is too large/],
    ['truncated data', rawFile(ok, 4), /tensor 'w': data_offsets \[0, 8\] out of range \(data region is 4 bytes\)/],
    ['header not JSON', rawFile('{"w": {', 0), /header is not valid JSON/],
    ['header not starting with {', rawFile('[1, 2]', 0), /does not start with '\{'/],
    ['entry not an object', rawFile({ w: 1 }, 0), /tensor 'w': entry is not an object/],
    [
      'unsupported dtype',
      rawFile({ w: { dtype: 'F8_E4M3', shape: [1], data_offsets: [0, 1] } }, 1),
      /tensor 'w': unsupported dtype "F8_E4M3"/,
    ],
    [
      'size not matching shape x dtype',
      rawFile({ w: { dtype: 'F32', shape: [3], data_offsets: [0, 8] } }, 8),
      /tensor 'w': data_offsets span 8 bytes but F32\[3\] needs 12/,
    ],
    [
      'begin after end',
      rawFile({ w: { dtype: 'F32', shape: [0], data_offsets: [8, 0] } }, 8),
      /tensor 'w': data_offsets \[8, 0\] out of range/,
    ],
    [
      'negative shape',
      rawFile({ w: { dtype: 'F32', shape: [-1], data_offsets: [0, 0] } }, 0),
      /tensor 'w': shape must be/,
    ],
    ['missing offsets', rawFile({ w: { dtype: 'F32', shape: [1] } }, 4), /tensor 'w': data_offsets must be/],
    [
      'overlapping tensors',
      rawFile(
        {
          a: { dtype: 'F32', shape: [2], data_offsets: [0, 8] },
          b: { dtype: 'F32', shape: [1], data_offsets: [4, 8] },
        },
        8,
      ),
      /tensor 'b' overlaps the previous tensor/,
    ],
    [
      'gap before a tensor',
      rawFile({ w: { dtype: 'F32', shape: [1], data_offsets: [4, 8] } }, 8),
      /gap in data region before tensor 'w'/,
    ],
    ['bytes after the last tensor', rawFile(ok, 12), /data region is 12 bytes but tensors cover only 8/],
    ['bad metadata', rawFile({ __metadata__: { n: 1 }, ...ok }, 8), /__metadata__\.n is not a string/],
  ])('%s', async (_what, bytes, message) => {
    const file = path.join(tmp, 'x.safetensors');
    fs.writeFileSync(file, bytes);
    expect(() => readSafetensors(file)).toThrow(message);
    expect(() => readSafetensors(file)).toThrow(file);
    await expect(readSafetensorsAsync(file)).rejects.toThrow(message);
  });

  test('a missing shard names the index and the shard', () => {
    fs.writeFileSync(
      path.join(tmp, INDEX_FILE),
      JSON.stringify({ weight_map: { w: 'model-00001-of-00001.safetensors' } }),
    );
    expect(() => readSafetensorsDir(tmp)).toThrow(
      /model\.safetensors\.index\.json: shard model-00001-of-00001\.safetensors \(holding 'w'\) is missing/,
    );
  });

  test('a tensor the index promises but the shard lacks', async () => {
    writeSafetensors(path.join(tmp, 's.safetensors'), [sample[0]]);
    fs.writeFileSync(
      path.join(tmp, INDEX_FILE),
      JSON.stringify({ weight_map: { 'b.weight': 's.safetensors', ghost: 's.safetensors' } }),
    );
    expect(() => readSafetensorsDir(tmp)).toThrow(
      /s\.safetensors: tensor 'ghost' listed in model\.safetensors\.index\.json is not in the shard/,
    );
    await expect(readSafetensorsDirAsync(tmp)).rejects.toThrow(/tensor 'ghost' listed in .* is not in the shard/);
  });

  test('an index without weight_map, and a folder without weights', () => {
    fs.writeFileSync(path.join(tmp, INDEX_FILE), JSON.stringify({ metadata: {} }));
    expect(() => readSafetensorsDir(tmp)).toThrow(/missing object field 'weight_map'/);
    fs.rmSync(path.join(tmp, INDEX_FILE));
    expect(() => readSafetensorsDir(tmp)).toThrow(
      /neither model\.safetensors nor model\.safetensors\.index\.json exists/,
    );
  });

  test('the writer refuses duplicates and buffers that do not match their shape', () => {
    expect(() => serializeSafetensors([sample[0], sample[0]])).toThrow(/duplicate tensor 'b\.weight'/);
    expect(() => serializeSafetensors([f32('w', [3], [1, 2])])).toThrow(/tensor 'w' has 8 bytes but F32\[3\] needs 12/);
    expect(() => writeSafetensors(path.join(tmp, 'bad.safetensors'), [f32('w', [3], [1, 2])])).toThrow(
      /bad\.safetensors/,
    );
    expect(fs.readdirSync(tmp)).toEqual([]);
  });
});

describe('integer dtypes (training batches)', () => {
  test('round trip I32, U8, I64 and F64', () => {
    const tensors = [
      {
        name: 'ids',
        dtype: 'I32' as const,
        shape: [2, 2],
        data: Buffer.from(new Int32Array([1, -2, 3, 2 ** 30]).buffer),
      },
      { name: 'mask', dtype: 'U8' as const, shape: [3], data: Buffer.from([0, 1, 255]) },
      { name: 'big', dtype: 'I64' as const, shape: [1], data: Buffer.from(new BigInt64Array([-5n]).buffer) },
      { name: 'f64', dtype: 'F64' as const, shape: [1], data: Buffer.from(new Float64Array([Math.PI]).buffer) },
    ];
    const back = parseSafetensors(serializeSafetensors(tensors)).tensors;
    expect(back.map((t) => [t.name, t.dtype, t.shape, [...t.data]])).toEqual(
      [...tensors].sort((a, b) => a.name.localeCompare(b.name)).map((t) => [t.name, t.dtype, t.shape, [...t.data]]),
    );
  });

  test('a model folder with integer weights is rejected, naming the tensor', () => {
    writeSafetensors(path.join(tmp, 'model.safetensors'), [
      { name: 'model.norm.weight', dtype: 'I32', shape: [1], data: Buffer.alloc(4) },
    ]);
    expect(() => readSafetensorsDir(tmp)).toThrow(
      /tensor 'model\.norm\.weight' has dtype I32; model weights must be F32, F16, BF16/,
    );
  });
});

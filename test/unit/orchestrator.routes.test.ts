/** MoE router replay through packing and batch files: the experts of each token reach the trainer's rows. */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { readBatch, writeBatch } from '../../lib/runfolder/batch';
import { buildSample } from '../../lib/orchestrator/sample';
import { packSamples } from '../../lib/runfolder/packing';
import { loadConfig } from '../../lib/config/loader';
import { RL_SECTIONS, RL_SHARED_KEYS, rlSchema, sftSchema } from '../../lib/config/schemas';

const W = 4; // sparse layers x experts per token

/** Routes of `n` tokens whose entries encode (token id, slot): easy to tell apart after packing. */
const routesOf = (ids: number[]) => ids.flatMap((t) => Array.from({ length: W }, (_, k) => (t * W + k) % 1000));

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-rl-routes-'));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));

describe('routes in samples, rows and batch files', () => {
  test('segments without routes are -1 in the sample; packing keeps each sample next to its routes', () => {
    const a = buildSample(
      [
        { tokens: [1, 2, 3], generated: false, routes: routesOf([1, 2, 3]) },
        { tokens: [4, 5], generated: true, logprobs: [-1, -1], routes: routesOf([4, 5]) },
        { tokens: [6], generated: false }, // env tokens no request fed
        { tokens: [7], generated: true, logprobs: [-1] },
      ],
      1,
    );
    expect(Array.from(a.routes!)).toEqual([...routesOf([1, 2, 3, 4, 5]), ...new Array(2 * W).fill(-1)]);
    const b = buildSample(
      [
        { tokens: [10, 11], generated: false, routes: routesOf([10, 11]) },
        {
          tokens: [12, 13, 14, 15, 16, 17],
          generated: true,
          logprobs: new Array(6).fill(-1),
          routes: routesOf([12, 13, 14, 15, 16, 17]),
        },
      ],
      1,
    );
    // A sample with no routes at all (e.g. a verifiers env server sampled it) is -1 everywhere.
    const c = buildSample([{ tokens: [20, 21], generated: true, logprobs: [-1, -1] }], 1);
    expect(c.routes).toBeUndefined();

    const seqLen = 10;
    const { rows, counts } = packSamples([a, b, c], seqLen);
    // Longest first: b (8 tokens) then c (2) in row 0, a (7) in row 1.
    expect(rows.map((r) => Array.from(r.sampleIndices))).toEqual([[1, 2], [0]]);
    expect(rows.every((r) => r.routes!.length === seqLen * W)).toBe(true);
    const file = path.join(root, 'step_0.safetensors');
    writeBatch(file, 0, seqLen, rows, counts);
    const batch = readBatch(file);
    // Rows come back trimmed to their samples' tokens, routes too.
    expect(Array.from(batch.rows[0].routes!)).toEqual([
      ...routesOf([10, 11, 12, 13, 14, 15, 16, 17]),
      ...new Array(2 * W).fill(-1),
    ]);
    expect(Array.from(batch.rows[1].routes!)).toEqual(Array.from(a.routes!));
    expect(batch.rows[1].routes).toBeInstanceOf(Int32Array);
  });

  test('a truncated sample keeps the routes of its kept tokens', () => {
    const s = buildSample(
      [{ tokens: [1, 2, 3, 4], generated: true, logprobs: [0, 0, 0, 0], routes: routesOf([1, 2, 3, 4]) }],
      1,
    );
    const { rows } = packSamples([s], 3);
    expect(Array.from(rows[0].routes!)).toEqual(routesOf([1, 2, 3]));
  });

  test('batches without routes have none (dense runs, replay off)', () => {
    const file = path.join(root, 'plain.safetensors');
    const { rows, counts } = packSamples([buildSample([{ tokens: [1, 2], generated: true, logprobs: [0, 0] }], 1)], 4);
    writeBatch(file, 0, 4, rows, counts);
    expect(readBatch(file).rows[0].routes).toBeUndefined();
  });

  test('bad routes are errors that say what is wrong', () => {
    expect(() =>
      buildSample(
        [
          { tokens: [1, 2], generated: false, routes: [0, 1, 2, 3] },
          { tokens: [3], generated: true, logprobs: [0], routes: [0, 1, 2] },
        ],
        1,
      ),
    ).toThrow('segment 1: routes has 3 entries for 1 tokens, expected tokens x 2');
    const s = (width: number) =>
      buildSample([{ tokens: [1], generated: true, logprobs: [0], routes: new Array(width).fill(0) }], 1);
    expect(() => packSamples([s(2), s(3)], 4)).toThrow('packing: sample 1: routes has 3 entries for 1 tokens');
    const { rows, counts } = packSamples(
      [buildSample([{ tokens: [1], generated: true, logprobs: [0], routes: [40000] }], 1)],
      2,
    );
    const file = path.join(root, 'wide.safetensors');
    expect(() => writeBatch(file, 0, 2, rows, counts)).toThrow(
      `${file}: route 40000 does not fit a batch's I16 routes`,
    );
    expect(fs.existsSync(file)).toBe(false);
  });
});

describe('trainer.moe.router_replay', () => {
  const parse = (schema: typeof rlSchema | typeof sftSchema, argv: string[]) =>
    loadConfig({
      schema,
      argv: ['--model.name', 'm', ...argv],
      env: {},
      ...(schema === rlSchema ? { shared: { keys: RL_SHARED_KEYS, sections: RL_SECTIONS } } : {}),
    }).config as {
      trainer?: { moe: Record<string, unknown> };
      moe?: Record<string, unknown>;
    };

  test('an RL option, off by default; SFT has no routes to replay', () => {
    expect(parse(rlSchema, []).trainer!.moe.router_replay).toBe(false);
    expect(parse(rlSchema, ['--trainer.moe.router-replay']).trainer!.moe.router_replay).toBe(true);
    expect(() => parse(sftSchema, ['--moe.router-replay'])).toThrow(/router.replay/);
  });
});

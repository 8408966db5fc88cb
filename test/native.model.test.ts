/** Native model: HF math against a plain TS reference, packed scoring, weight I/O, error paths. */
import type { ArchConfig } from '../lib/model/arch';
import { setThreads, type WeightTensor } from '../native';
import { loadModel } from '../lib/model/engine';
import { decode, encode, packRow, randomTokens, randomWeights, tinyConfig } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';
import { tensorSpecs } from '../lib/model/tensors';
import { ARCHS } from '../lib/config/names';
import { FAMILIES, isSparseLayer } from '../lib/model/families';

setThreads(2);

/**
 * Reference forward of one sample in float64, written straight from the HF modelling code:
 * returns log-softmax rows (logits[t] predicts token t+1).
 */
function referenceLogprobs(c: ArchConfig, weights: WeightTensor[], ids: number[]): Float64Array[] {
  const W = new Map(weights.map((t) => [t.name, decode(t)]));
  const w = (n: string) => W.get(n)!;
  const D = c.hiddenSize,
    hd = c.headDim,
    H = c.numHeads,
    KV = c.numKvHeads,
    T = ids.length;
  const linear = (x: Float64Array, m: Float64Array, rows: number, bias?: Float64Array) => {
    const cols = x.length,
      y = new Float64Array(rows);
    for (let r = 0; r < rows; r++) {
      let s = bias ? bias[r] : 0;
      for (let k = 0; k < cols; k++) s += m[r * cols + k] * x[k];
      y[r] = s;
    }
    return y;
  };
  const rms = (x: Float64Array, g: Float64Array) => {
    let ms = 0;
    for (const v of x) ms += v * v;
    const inv = 1 / Math.sqrt(ms / x.length + c.rmsNormEps);
    return x.map((v, i) => v * inv * g[i]);
  };
  const rope = (x: Float64Array, pos: number) => {
    const half = hd / 2,
      out = new Float64Array(hd);
    for (let i = 0; i < half; i++) {
      const f = pos / Math.pow(c.ropeTheta, (2 * i) / hd),
        cos = Math.cos(f),
        sin = Math.sin(f);
      out[i] = x[i] * cos - x[i + half] * sin; // rotate_half = cat(-x2, x1)
      out[i + half] = x[i + half] * cos + x[i] * sin;
    }
    return out;
  };
  let xs = ids.map((t) => w('model.embed_tokens.weight').slice(t * D, (t + 1) * D));
  for (let l = 0; l < c.numLayers; l++) {
    const p = `model.layers.${l}.`,
      b = (n: string) => (c.attentionBias ? w(`${p}self_attn.${n}_proj.bias`) : undefined);
    const qs: Float64Array[][] = [],
      ks: Float64Array[][] = [],
      vs: Float64Array[][] = [];
    for (let t = 0; t < T; t++) {
      const h = rms(xs[t], w(p + 'input_layernorm.weight'));
      const q = linear(h, w(p + 'self_attn.q_proj.weight'), H * hd, b('q'));
      const k = linear(h, w(p + 'self_attn.k_proj.weight'), KV * hd, b('k'));
      const v = linear(h, w(p + 'self_attn.v_proj.weight'), KV * hd, b('v'));
      const head = (a: Float64Array, i: number, norm?: string) => {
        const s = a.slice(i * hd, (i + 1) * hd);
        return rope(norm ? rms(s, w(p + `self_attn.${norm}_norm.weight`)) : s, t);
      };
      qs.push(Array.from({ length: H }, (_, i) => head(q, i, c.qkNorm ? 'q' : undefined)));
      ks.push(Array.from({ length: KV }, (_, i) => head(k, i, c.qkNorm ? 'k' : undefined)));
      vs.push(Array.from({ length: KV }, (_, i) => v.slice(i * hd, (i + 1) * hd)));
    }
    xs = xs.map((x, t) => {
      const attn = new Float64Array(H * hd);
      for (let h = 0; h < H; h++) {
        const g = Math.floor(h / (H / KV)); // GQA
        const s = Array.from(
          { length: t + 1 },
          (_, j) => qs[t][h].reduce((a, qv, i) => a + qv * ks[j][g][i], 0) / Math.sqrt(hd),
        );
        const m = Math.max(...s),
          e = s.map((v) => Math.exp(v - m)),
          z = e.reduce((a, v) => a + v, 0);
        for (let j = 0; j <= t; j++) for (let i = 0; i < hd; i++) attn[h * hd + i] += (e[j] / z) * vs[j][g][i];
      }
      const o = linear(attn, w(p + 'self_attn.o_proj.weight'), D);
      const h1 = x.map((v, i) => v + o[i]);
      const m = rms(h1, w(p + 'post_attention_layernorm.weight'));
      const swiglu = (prefix: string, width: number) => {
        const gate = linear(m, w(prefix + 'gate_proj.weight'), width);
        const up = linear(m, w(prefix + 'up_proj.weight'), width);
        const act = gate.map((gv, i) => (gv / (1 + Math.exp(-gv))) * up[i]);
        return linear(act, w(prefix + 'down_proj.weight'), D);
      };
      let down: Float64Array;
      if (!isSparseLayer(c.moe, l)) {
        down = swiglu(p + 'mlp.', c.intermediateSize);
      } else {
        // Qwen3MoeSparseMoeBlock: softmax over the router logits, top-k, optional renormalisation.
        const moe = c.moe!;
        const logits = linear(m, w(p + 'mlp.gate.weight'), moe.numExperts);
        const mx = Math.max(...logits),
          e = logits.map((v) => Math.exp(v - mx)),
          z = e.reduce((a, v) => a + v, 0);
        const probs = Array.from(e, (v) => v / z);
        const top = probs
          .map((pr, i) => [pr, i])
          .sort((a, b) => b[0] - a[0])
          .slice(0, moe.numExpertsPerTok);
        const sum = top.reduce((a, [pr]) => a + pr, 0);
        down = new Float64Array(D);
        for (const [pr, i] of top) {
          const y = swiglu(p + `mlp.experts.${i}.`, moe.moeIntermediateSize);
          const wt = moe.normTopkProb ? pr / sum : pr;
          for (let d = 0; d < D; d++) down[d] += wt * y[d];
        }
      }
      return h1.map((v, i) => v + down[i]);
    });
  }
  const head = c.tieWordEmbeddings ? w('model.embed_tokens.weight') : w('lm_head.weight');
  return xs.map((x) => {
    const logits = linear(rms(x, w('model.norm.weight')), head, c.vocabSize);
    const m = Math.max(...logits),
      lse = m + Math.log(logits.reduce((a, v) => a + Math.exp(v - m), 0));
    return logits.map((v) => v - lse);
  });
}

const maxAbsDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
};

describe.each(ARCHS)('%s', (arch) => {
  const cfg = tinyConfig(arch);
  const rng = new Rng(7);
  const ids = randomTokens(rng, 12, cfg.vocabSize);

  // This reference is the dense decoder's; Qwen3.5's hybrid blocks are checked against transformers'
  // own fixtures (native.hf-reference.test.ts) and their recurrent form against their chunked one
  // (native.qwen35.test.ts).
  const dense = FAMILIES[arch].defaults.linearAttention === undefined;
  if (dense)
    test('matches the float64 reference (fp64 to the precision of the Float32Array outputs; fp32)', async () => {
      const ref = referenceLogprobs(cfg, randomWeights(cfg, 1, 'F64'), ids);
      const want = ids.map((t, i) => (i === 0 ? 0 : ref[i - 1][t]));
      for (const [dtype, tol, wdtype] of [
        ['float64', 2e-6, 'F64'],
        ['float32', 2e-5, 'F32'],
      ] as const) {
        const model = await loadModel(cfg, randomWeights(cfg, 1, wdtype), { dtype });
        const [row] = await model.score([packRow([ids])]);
        expect(maxAbsDiff(row.logprobs, want)).toBeLessThan(tol);
        const ent = ids.map((_, i) => (i === 0 ? 0 : -ref[i - 1].reduce((a, lp) => a + Math.exp(lp) * lp, 0)));
        expect(maxAbsDiff(row.entropies, ent)).toBeLessThan(tol);
      }
    });

  test('packed rows score like separate forwards', async () => {
    const model = await loadModel(cfg, randomWeights(cfg, 2));
    const samples = [5, 17, 1, 30, 9].map((n) => randomTokens(rng, n, cfg.vocabSize));
    for (const temperature of [1, 0.7]) {
      const [packed] = await model.score([packRow(samples)], { temperature });
      const separate = await model.score(
        samples.map((s) => packRow([s])),
        { temperature },
      );
      const flat = (k: 'logprobs' | 'entropies') => separate.flatMap((r) => Array.from(r[k]));
      expect(maxAbsDiff(packed.logprobs, flat('logprobs'))).toBeLessThanOrEqual(1e-5);
      expect(maxAbsDiff(packed.entropies, flat('entropies'))).toBeLessThanOrEqual(1e-5);
    }
  });
});

describe('weights', () => {
  const cfg = tinyConfig('qwen2');
  const row = packRow([
    [1, 2, 3, 4, 5, 6],
    [7, 8, 9],
  ]);

  test('F16/BF16 inputs convert exactly to the compute dtype', async () => {
    for (const dtype of ['BF16', 'F16'] as const) {
      const half = randomWeights(cfg, 3, dtype);
      // The same values widened in TS: the engine's conversion must agree bit for bit.
      const widened = half.map((t) => ({ ...t, dtype: 'F32' as const, data: encode(halfToF64(t), 'F32') }));
      const [a] = await (await loadModel(cfg, half)).score([row]);
      const [b] = await (await loadModel(cfg, widened)).score([row]);
      expect(Buffer.from(a.logprobs.buffer)).toEqual(Buffer.from(b.logprobs.buffer));
    }
  });

  test('read-out -> load round trip is bitwise; loadWeights swaps in place', async () => {
    const a = await loadModel(cfg, randomWeights(cfg, 4));
    const out = await a.readWeights();
    const given = randomWeights(cfg, 4);
    const byName = new Map(given.map((t) => [t.name, t]));
    expect(out.map((t) => t.name).sort()).toEqual([...byName.keys()].sort());
    expect(out.every((t) => t.data.equals(byName.get(t.name)!.data))).toBe(true);
    const b = await loadModel(cfg, randomWeights(cfg, 5));
    const [before] = await b.score([row]);
    await b.loadWeights(out);
    const [after] = await b.score([row]);
    const [ref] = await a.score([row]);
    expect(Buffer.from(after.logprobs.buffer)).toEqual(Buffer.from(ref.logprobs.buffer));
    expect(maxAbsDiff(before.logprobs, ref.logprobs)).toBeGreaterThan(1e-3);
    expect((await b.readWeights('BF16'))[0].dtype).toBe('BF16');
  });

  test('q/k/v and gate/up as one matmul each (no gradient recorded) give what the projections one by one give', async () => {
    for (const arch of ['qwen2', 'qwen3', 'llama'] as const) {
      const c = tinyConfig(arch); // qwen2: q/k/v biases; qwen3: q/k norms
      const model = await loadModel(c, randomWeights(c, 7));
      // Adapters on each of them (B = 0: the adapted model is the base model) keep the trainer's
      // scoring on the projections one by one; the model's own scoring takes the fused weights.
      const targetModules = ['q_proj', 'k_proj', 'v_proj', 'gate_proj', 'up_proj'] as const;
      const trainer = model.createTrainer({ lora: { rank: 2, alpha: 4, targetModules: [...targetModules] } });
      const [fused] = await model.score([row]);
      const [separate] = await trainer.score([row], {});
      expect(maxAbsDiff(fused.logprobs, separate.logprobs)).toBeLessThan(1e-5);
      expect(maxAbsDiff(fused.entropies, separate.entropies)).toBeLessThan(1e-5);
      // fusedProjections: false takes the one-by-one matmuls everywhere (same weights, same sums).
      const unfused = await loadModel(c, randomWeights(c, 7), { fusedProjections: false });
      const [plain] = await unfused.score([row]);
      expect(Buffer.from(plain.logprobs.buffer)).toEqual(Buffer.from(separate.logprobs.buffer));
    }
    await expect(
      loadModel(cfg, randomWeights(cfg, 7), { fusedProjections: 'no' as unknown as boolean }),
    ).rejects.toThrow(/fusedProjections must be true or false/);
  });

  test('bf16 compute runs and stays close to fp32', async () => {
    const w = randomWeights(cfg, 6);
    const [a] = await (await loadModel(cfg, w, { dtype: 'bfloat16' })).score([row]);
    const [b] = await (await loadModel(cfg, w)).score([row]);
    expect(maxAbsDiff(a.logprobs, b.logprobs)).toBeLessThan(0.3);
  });

  test('concurrent calls on one model are queued', async () => {
    const m = await loadModel(cfg, randomWeights(cfg, 4));
    const results = await Promise.all([m.score([row]), m.readWeights(), m.score([row])]);
    expect(Buffer.from(results[0][0].logprobs.buffer)).toEqual(Buffer.from(results[2][0].logprobs.buffer));
  });
});

function halfToF64(t: WeightTensor): Float64Array {
  if (t.dtype === 'BF16') return decode(t);
  const u = new Uint16Array(t.data.buffer.slice(t.data.byteOffset, t.data.byteOffset + t.data.length));
  return Float64Array.from(u, (h) => {
    const e = (h >> 10) & 0x1f,
      m = h & 0x3ff,
      s = h & 0x8000 ? -1 : 1;
    return e === 0 ? s * m * 2 ** -24 : s * (1 + m / 1024) * 2 ** (e - 15);
  });
}

describe('errors name the problem', () => {
  const cfg = tinyConfig('qwen3');
  const good = () => randomWeights(cfg, 8);

  test.each([
    [
      'missing tensor',
      (w: WeightTensor[]) => w.filter((t) => t.name !== 'model.layers.1.mlp.up_proj.weight'),
      /missing tensor 'model.layers.1.mlp.up_proj.weight'/,
    ],
    [
      'wrong shape',
      (w: WeightTensor[]) => w.map((t) => (t.name === 'model.norm.weight' ? { ...t, shape: [32, 2] } : t)),
      /'model.norm.weight': shape \[32, 2\], expected \[64\]/,
    ],
    [
      'unsupported dtype',
      (w: WeightTensor[]) =>
        w.map((t) => (t.name === 'model.norm.weight' ? { ...t, dtype: 'I8' as unknown as 'F32' } : t)),
      /'model.norm.weight': unsupported dtype 'I8'/,
    ],
    [
      'truncated data',
      (w: WeightTensor[]) => w.map((t) => (t.name === 'model.norm.weight' ? { ...t, data: t.data.subarray(4) } : t)),
      /'model.norm.weight': 252 data bytes, expected 256/,
    ],
    [
      'unexpected tensor',
      (w: WeightTensor[]) => [...w, { ...w[1], name: 'model.layers.9.foo.weight' }],
      /unexpected tensor 'model.layers.9.foo.weight'/,
    ],
    ['duplicate tensor', (w: WeightTensor[]) => [...w, w[1]], /given twice/],
  ])('%s', async (_, mutate, message) => {
    await expect(loadModel(cfg, mutate(good()))).rejects.toThrow(message);
  });

  test('bad config and device', async () => {
    await expect(loadModel({ ...cfg, arch: 'gpt2' as 'llama' }, good())).rejects.toThrow(
      /unsupported architecture 'gpt2'/,
    );
    await expect(loadModel(cfg, good(), { device: 'cuda' })).rejects.toThrow(/CUDA/);
  });

  test('out-of-range token ids, bad rows, bad weight updates', async () => {
    const m = await loadModel(cfg, good());
    await expect(m.score([packRow([[1, 2, 300]])])).rejects.toThrow(
      /token id 300 at index 2 is out of range \[0, 300\)/,
    );
    await expect(m.score([packRow([[-1, 2]])])).rejects.toThrow(/token id -1/);
    await expect(m.score([{ inputIds: [1, 2], positionIds: [0] }])).rejects.toThrow(/same non-zero length/);
    const w = good().map((t) => (t.name === 'model.layers.0.self_attn.k_proj.weight' ? { ...t, shape: [16, 128] } : t));
    await expect(m.loadWeights(w)).rejects.toThrow(
      /'model.layers.0.self_attn.k_proj.weight': shape \[16, 128\], expected \[32, 64\]/,
    );
    await expect(m.loadWeights(good().slice(1))).rejects.toThrow(/missing tensor 'model.embed_tokens.weight'/);
    await m.loadWeights(good().slice(1), { strict: false });
    // The model still works after rejected calls.
    expect((await m.score([packRow([[1, 2, 3]])]))[0].logprobs.length).toBe(3);
  });
  // The engine's parameters are its family's tensor table (lib/model/families), in table order;
  // llama with attention_bias covers the o_proj bias the tiny configs lack.
  test.each([...ARCHS.map((a) => tinyConfig(a)), tinyConfig('llama', { attentionBias: true })])(
    'holds exactly the tensor table of $arch (bias $attentionBias)',
    async (c) => {
      const m = await loadModel(c, randomWeights(c, 3));
      const read = await m.readWeights();
      expect(read.map((t) => [t.name, t.shape])).toEqual(tensorSpecs(c).map((s) => [s.name, s.shape]));
    },
  );

  test('checkpoint extras (RoPE buffers, a tied duplicate lm_head) are ignored on load and update', async () => {
    const w = good();
    const extras: WeightTensor[] = [
      { ...w[0], name: 'lm_head.weight' },
      { name: 'model.layers.0.self_attn.rotary_emb.inv_freq', dtype: 'F32', shape: [8], data: Buffer.alloc(32) },
    ];
    const m = await loadModel(cfg, [...w, ...extras]);
    await m.loadWeights([...w, ...extras]);
    expect((await m.readWeights()).length).toBe(w.length);
    const untied = tinyConfig('qwen3', { tieWordEmbeddings: false });
    await expect(loadModel(untied, [...randomWeights(untied, 1), extras[1]])).resolves.toBeDefined();
    await expect(loadModel(cfg, [...w, { ...w[0], name: 'model.layers.0.self_attn.rotary_emb.foo' }])).rejects.toThrow(
      /unexpected tensor 'model.layers.0.self_attn.rotary_emb.foo'/,
    );
  });
});

/** Architecture families: the registry, each family's tensor table over the decoder skeleton, its config.json mapping. */
import { ARCHS } from '../lib/config/names';
import { FAMILIES, family, isSparseLayer, LAYER_SLOTS, sparseLayerCount } from '../lib/model/families';
import { parseHfConfig, toHfConfig } from '../lib/model/hf-config';
import { tinyConfig } from '../lib/model/testing';
import { parameterCount, tensorSpecs } from '../lib/model/tensors';
import { loadConfig } from '../lib/config/loader';
import { modelCreateSchema } from '../lib/config/schemas';
import { layerSlots } from '../native';

const REQUIRED_LAYER_SLOTS = ['inputNorm', 'postNorm'];
// A block's token mixer: attention, or a hybrid model's Gated DeltaNet (Qwen3.5).
const ATTENTION = ['q', 'k', 'v', 'o'];
const GATED_DELTANET = ['linQkv', 'linZ', 'linB', 'linA', 'linConv', 'linDtBias', 'linALog', 'linNorm', 'linOut'];
const DENSE_MLP = ['gate', 'up', 'down'];

describe.each(ARCHS)('%s', (arch) => {
  const variants = [tinyConfig(arch), tinyConfig(arch, { tieWordEmbeddings: !tinyConfig(arch).tieWordEmbeddings })];
  const moe = FAMILIES[arch].defaults.moe;
  // Qwen3-MoE's rule of which blocks are sparse (Qwen3.5-MoE's blocks are all sparse).
  const sparseRule = moe !== undefined && !FAMILIES[arch].defaults.linearAttention;
  // MoE: every other block sparse, and one of those kept dense.
  if (sparseRule)
    variants.push(tinyConfig(arch, { numLayers: 5, moe: { ...moe, decoderSparseStep: 2, mlpOnlyLayers: [3] } }));
  // A hybrid model of more blocks: linear, linear, linear, full, linear, linear, linear.
  if (FAMILIES[arch].defaults.linearAttention) variants.push(tinyConfig(arch, { numLayers: 7 }));

  test('its table fills every required slot once, with unique names, blocks in order', () => {
    for (const c of variants) {
      const specs = tensorSpecs(c);
      expect(new Set(specs.map((s) => s.name)).size).toBe(specs.length);
      expect(new Set(specs.map((s) => `${s.layer}/${s.slot}/${s.expert}`)).size).toBe(specs.length);
      expect(specs.filter((s) => s.layer < 0).map((s) => s.slot)).toEqual(
        c.tieWordEmbeddings ? ['embed', 'norm'] : ['embed', 'norm', 'lmHead'],
      );
      for (let l = 0; l < c.numLayers; l++) {
        const slots = specs.filter((s) => s.layer === l).map((s) => s.slot);
        expect(slots).toEqual(expect.arrayContaining(REQUIRED_LAYER_SLOTS));
        const linear = c.layerTypes?.[l] === 'linear_attention';
        expect(slots).toEqual(expect.arrayContaining(linear ? GATED_DELTANET : ATTENTION));
        for (const other of linear ? ATTENTION : GATED_DELTANET) expect(slots).not.toContain(other);
        if (linear) continue;
        expect(slots.includes('qNorm')).toBe(c.qkNorm);
        expect(slots.includes('qBias')).toBe(c.attentionBias);
        if (!isSparseLayer(c.moe, l)) {
          expect(slots).toEqual(expect.arrayContaining(DENSE_MLP));
          expect(slots).not.toContain('router');
          continue;
        }
        expect(slots).not.toEqual(expect.arrayContaining(['gate']));
        expect(slots.filter((s) => s === 'router')).toHaveLength(1);
        for (const slot of ['expertGate', 'expertUp', 'expertDown']) {
          const experts = specs.filter((s) => s.layer === l && s.slot === slot).map((s) => s.expert);
          expect(experts).toEqual(Array.from({ length: c.moe!.numExperts }, (_, e) => e));
        }
      }
      if (c.moe && c.numLayers === 5) expect([0, 1, 2, 3, 4].filter((l) => isSparseLayer(c.moe, l))).toEqual([1]); // 3 is mlp-only
      const layers = specs.map((s) => s.layer).filter((l) => l >= 0);
      expect(layers).toEqual([...layers].sort((a, b) => a - b));
    }
  });

  test('parameterCount, which counts one block of each kind, is the sum over its table', () => {
    const more = sparseRule
      ? [
          tinyConfig(arch, {
            numLayers: 7,
            moe: { ...moe, numExperts: 5, decoderSparseStep: 3, mlpOnlyLayers: [2, 4] },
          }),
          tinyConfig(arch, { numLayers: 4, moe: { ...moe, mlpOnlyLayers: [0, 1, 2, 3] } }),
        ]
      : [tinyConfig(arch, { numLayers: 3, vocabSize: 1000, intermediateSize: 7 })];
    for (const c of [...variants, ...more]) {
      const sum = tensorSpecs(c).reduce((n, s) => n + s.shape.reduce((x, y) => x * y, 1), 0);
      expect(parameterCount(c)).toBe(sum);
      const sparse = Array.from({ length: c.numLayers }, (_, l) => l).filter((l) => isSparseLayer(c.moe, l));
      expect(sparseLayerCount(c.moe, c.numLayers)).toBe(sparse.length);
    }
  });

  test('its defaults round-trip through config.json', () => {
    const c = tinyConfig(arch);
    expect(c).toMatchObject(FAMILIES[arch].defaults);
    const json = toHfConfig(c, { bos: 1, eos: 2, pad: 0 }, 'float32');
    expect(json).toMatchObject({ model_type: arch, architectures: [FAMILIES[arch].hfClass] });
    expect(parseHfConfig(json)).toEqual(c);
  });
});

test('an unregistered architecture is an error listing the registered ones', () => {
  expect(() => family('gpt2')).toThrow(`unsupported architecture 'gpt2' (supported: ${ARCHS.join(', ')})`);
  expect(() => family('toString')).toThrow(/unsupported architecture 'toString'/);
  expect(() => tensorSpecs({ ...tinyConfig('llama'), arch: 'gpt2' as 'llama' })).toThrow(
    /unsupported architecture 'gpt2'/,
  );
});

test('a family rejects features it cannot express when writing config.json', () => {
  expect(() =>
    toHfConfig(tinyConfig('qwen2', { attentionBias: false }), { bos: 1, eos: 2, pad: 0 }, 'float32'),
  ).toThrow(/qwen2 always has attention biases/);
  expect(() => toHfConfig(tinyConfig('llama', { qkNorm: true }), { bos: 1, eos: 2, pad: 0 }, 'float32')).toThrow(
    /llama has no q\/k norms/,
  );
  expect(() => toHfConfig(tinyConfig('qwen3', { qkNorm: false }), { bos: 1, eos: 2, pad: 0 }, 'float32')).toThrow(
    /qwen3 always has q\/k norms/,
  );
  const moe = FAMILIES.qwen3_moe.defaults.moe!;
  expect(() => toHfConfig(tinyConfig('qwen3', { moe }), { bos: 1, eos: 2, pad: 0 }, 'float32')).toThrow(
    /qwen3 has no MoE blocks/,
  );
  expect(() =>
    toHfConfig(tinyConfig('qwen3_moe', { moe: { ...moe, mlpOnlyLayers: [7] } }), { bos: 1, eos: 2, pad: 0 }, 'float32'),
  ).toThrow(/moe.mlpOnlyLayers: 7 is not a layer index in \[0, 2\)/);
  expect(() =>
    toHfConfig(
      tinyConfig('qwen3_moe', { moe: { ...moe, numExpertsPerTok: 9 } }),
      { bos: 1, eos: 2, pad: 0 },
      'float32',
    ),
  ).toThrow(/numExpertsPerTok \(9\) exceeds moe.numExperts \(8\)/);
});

test('model create offers exactly the registered families', () => {
  for (const arch of ARCHS) expect(modelCreateSchema.parse({ arch, out: 'm' }).arch).toBe(arch);
  // What `prime-rl model create --arch gpt2` answers: the key, the registered names, the flag it came from.
  expect(() => loadConfig({ schema: modelCreateSchema, argv: ['--arch', 'gpt2', '--out', 'm'], env: {} })).toThrow(
    `arch: Invalid option: expected one of ${ARCHS.map((a) => `"${a}"`).join('|')} (from --arch)`,
  );
});

test("the engine's block slots are LAYER_SLOTS: the names are written in TS and in native/src/model.cc", () => {
  // Order does not matter; a slot on one side only is a table row the engine cannot fill, or a
  // parameter no family can name.
  expect([...layerSlots()].sort()).toEqual([...LAYER_SLOTS].sort());
});

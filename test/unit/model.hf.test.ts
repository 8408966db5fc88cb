import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { family } from '../../lib/model/families';
import { parseHfConfig, toHfConfig } from '../../lib/model/hf-config';
import { loadHfModel, readHfConfig, writeHfModel } from '../../lib/model/hf';
import { readSafetensors } from '../../lib/model/safetensors';
import { initTensors, resolveArchConfig } from '../../lib/model/create';
import type { ArchConfig } from '../../lib/model/arch';
import { HF_FIXTURES } from '../support/hf-fixtures';
import { isIgnorable, tensorSpecs } from '../../lib/model/tensors';

/** Excerpts of the real Hub configs (Llama-3.2-1B without its llama3 rope scaling, Qwen2.5-0.5B, Qwen3-0.6B). */
const llama = {
  architectures: ['LlamaForCausalLM'],
  model_type: 'llama',
  vocab_size: 128256,
  hidden_size: 2048,
  intermediate_size: 8192,
  num_hidden_layers: 16,
  num_attention_heads: 32,
  num_key_value_heads: 8,
  hidden_act: 'silu',
  max_position_embeddings: 131072,
  rms_norm_eps: 1e-5,
  rope_theta: 500000.0,
  attention_bias: false,
  mlp_bias: false,
  tie_word_embeddings: true,
};
const qwen2 = {
  architectures: ['Qwen2ForCausalLM'],
  model_type: 'qwen2',
  vocab_size: 151936,
  hidden_size: 896,
  intermediate_size: 4864,
  num_hidden_layers: 24,
  num_attention_heads: 14,
  num_key_value_heads: 2,
  max_position_embeddings: 32768,
  rms_norm_eps: 1e-6,
  rope_theta: 1000000.0,
  sliding_window: 32768,
  use_sliding_window: false,
  tie_word_embeddings: true,
};
const qwen3 = {
  architectures: ['Qwen3ForCausalLM'],
  model_type: 'qwen3',
  vocab_size: 151936,
  hidden_size: 1024,
  intermediate_size: 3072,
  num_hidden_layers: 28,
  num_attention_heads: 16,
  num_key_value_heads: 8,
  head_dim: 128,
  max_position_embeddings: 40960,
  rms_norm_eps: 1e-6,
  rope_theta: 1000000,
  rope_scaling: null,
  attention_bias: false,
  tie_word_embeddings: true,
};

describe('parseHfConfig', () => {
  test('llama: head_dim defaults to hidden / heads, attention_bias read', () => {
    expect(parseHfConfig(llama)).toEqual<ArchConfig>({
      arch: 'llama',
      vocabSize: 128256,
      hiddenSize: 2048,
      intermediateSize: 8192,
      numLayers: 16,
      numHeads: 32,
      numKvHeads: 8,
      headDim: 64,
      rmsNormEps: 1e-5,
      ropeTheta: 500000,
      maxPositionEmbeddings: 131072,
      tieWordEmbeddings: true,
      attentionBias: false,
      qkNorm: false,
    });
    expect(parseHfConfig({ ...llama, attention_bias: true }).attentionBias).toBe(true);
  });

  test('qwen2 always has q/k/v biases', () => {
    const a = parseHfConfig(qwen2);
    expect(a).toMatchObject({
      arch: 'qwen2',
      headDim: 64,
      attentionBias: true,
      qkNorm: false,
      ropeTheta: 1e6,
      numKvHeads: 2,
    });
    expect(parseHfConfig({ ...qwen2, attention_bias: false }).attentionBias).toBe(true);
  });

  test('qwen3: explicit head_dim, q/k norms, no biases', () => {
    expect(parseHfConfig(qwen3)).toMatchObject({
      arch: 'qwen3',
      headDim: 128,
      qkNorm: true,
      attentionBias: false,
      tieWordEmbeddings: true,
    });
  });

  // Qwen3-30B-A3B's MoE fields.
  const qwen3Moe = {
    ...qwen3,
    architectures: ['Qwen3MoeForCausalLM'],
    model_type: 'qwen3_moe',
    hidden_size: 2048,
    intermediate_size: 6144,
    num_hidden_layers: 48,
    num_attention_heads: 32,
    num_key_value_heads: 4,
    num_experts: 128,
    num_experts_per_tok: 8,
    moe_intermediate_size: 768,
    decoder_sparse_step: 1,
    mlp_only_layers: [],
    norm_topk_prob: true,
    output_router_logits: false,
    router_aux_loss_coef: 0.001,
  };

  test('qwen3_moe: experts, top-k, expert width, sparse layers (v4 and v5 names)', () => {
    const moe = {
      numExperts: 128,
      numExpertsPerTok: 8,
      moeIntermediateSize: 768,
      decoderSparseStep: 1,
      mlpOnlyLayers: [],
      normTopkProb: true,
    };
    expect(parseHfConfig(qwen3Moe)).toMatchObject({ arch: 'qwen3_moe', qkNorm: true, moe });
    const { num_experts: _n, ...v5 } = { ...qwen3Moe, num_local_experts: 128 };
    expect(parseHfConfig(v5).moe).toEqual(moe);
    // transformers' Qwen3MoeConfig defaults.
    const {
      num_experts: _a,
      num_experts_per_tok: _b,
      moe_intermediate_size: _c,
      norm_topk_prob: _d,
      ...bare
    } = qwen3Moe;
    expect(parseHfConfig(bare).moe).toMatchObject({
      numExperts: 128,
      numExpertsPerTok: 8,
      moeIntermediateSize: 768,
      normTopkProb: false,
    });
    const bad: [Record<string, unknown>, RegExp][] = [
      [{ num_experts_per_tok: 200 }, /field 'num_experts_per_tok' \(200\) exceeds num_experts \(128\)/],
      [{ mlp_only_layers: [1, -1] }, /field 'mlp_only_layers' must be an array of non-negative integers/],
      [{ mlp_only_layers: [2, 2] }, /field 'mlp_only_layers' has duplicates/],
      [{ num_local_experts: 64 }, /field 'num_local_experts' \(64\) differs from num_experts \(128\)/],
      [{ decoder_sparse_step: 0 }, /field 'decoder_sparse_step' must be a positive integer/],
      [{ norm_topk_prob: 'yes' }, /field 'norm_topk_prob' must be a boolean/],
    ];
    for (const [patch, err] of bad) expect(() => parseHfConfig({ ...qwen3Moe, ...patch })).toThrow(err);
  });

  test('transformers v5 rope_parameters are accepted', () => {
    const { rope_theta: _drop, rope_scaling: _none, ...rest } = qwen3;
    const v5 = { ...rest, rope_parameters: { rope_type: 'default', rope_theta: 5e6 } };
    expect(parseHfConfig(v5).ropeTheta).toBe(5e6);
  });

  test('defaults of the transformers config classes fill absent fields', () => {
    const minimal = {
      model_type: 'llama',
      vocab_size: 10,
      hidden_size: 8,
      intermediate_size: 16,
      num_hidden_layers: 1,
      num_attention_heads: 2,
    };
    expect(parseHfConfig(minimal)).toMatchObject({
      numKvHeads: 2,
      headDim: 4,
      rmsNormEps: 1e-6,
      ropeTheta: 10000,
      maxPositionEmbeddings: 2048,
      tieWordEmbeddings: false,
      attentionBias: false,
    });
  });

  test.each<[string, Record<string, unknown>, RegExp]>([
    [
      'unsupported architecture',
      { ...llama, architectures: ['MistralForCausalLM'], model_type: undefined },
      /field 'architectures' names unsupported class "MistralForCausalLM"/,
    ],
    [
      'unsupported model_type',
      { ...llama, architectures: undefined, model_type: 'gemma' },
      /field 'model_type' is unsupported: "gemma"/,
    ],
    [
      'architectures and model_type disagree',
      { ...llama, model_type: 'qwen2' },
      /field 'model_type' is 'qwen2' but architectures names LlamaForCausalLM/,
    ],
    [
      'neither',
      { ...llama, architectures: undefined, model_type: undefined },
      /field 'architectures' and model_type are both missing/,
    ],
    ['missing size', { ...llama, hidden_size: undefined }, /field 'hidden_size' is required/],
    ['bad size', { ...llama, num_hidden_layers: 1.5 }, /field 'num_hidden_layers' must be a positive integer, got 1.5/],
    [
      'kv heads not dividing heads',
      { ...llama, num_key_value_heads: 5 },
      /field 'num_key_value_heads' \(5\) must divide/,
    ],
    [
      'llama3 rope scaling',
      { ...llama, rope_scaling: { rope_type: 'llama3', factor: 32 } },
      /field 'rope_scaling' is .*only plain RoPE/,
    ],
    [
      'yarn in rope_parameters',
      { ...qwen3, rope_parameters: { rope_type: 'yarn', rope_theta: 1e6 } },
      /field 'rope_parameters.rope_type' is "yarn"/,
    ],
    ['other activation', { ...llama, hidden_act: 'gelu' }, /field 'hidden_act' is "gelu"/],
    ['mlp bias', { ...llama, mlp_bias: true }, /field 'mlp_bias' is true/],
    ['sliding window', { ...qwen2, use_sliding_window: true }, /field 'use_sliding_window' is true/],
    ['head_dim not derivable', { ...llama, hidden_size: 2050 }, /field 'head_dim' is absent and hidden_size \(2050\)/],
  ])('%s is an error naming config.json and the field', (_what, raw, message) => {
    expect(() => parseHfConfig(raw, '/models/m/config.json')).toThrow(message);
    expect(() => parseHfConfig(raw, '/models/m/config.json')).toThrow('/models/m/config.json');
  });

  test.each([
    ['llama', llama],
    ['qwen2', qwen2],
    ['qwen3', qwen3],
  ])('toHfConfig round-trips through parseHfConfig (%s)', (_arch, raw) => {
    const a = parseHfConfig(raw);
    const back = toHfConfig(a, { bos: 1, eos: 2, pad: 0 }, 'bfloat16');
    expect(parseHfConfig(back)).toEqual(a);
    expect(back).toMatchObject({ bos_token_id: 1, eos_token_id: 2, pad_token_id: 0, torch_dtype: 'bfloat16' });
  });
});

describe('model folders', () => {
  let tmp: string;
  beforeEach(() => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'hf-'));
  });
  afterEach(() => fs.rmSync(tmp, { recursive: true, force: true }));

  test.each(HF_FIXTURES.map((f) => [f.name, f] as const))(
    'loads the folder transformers saved (%s fixture, v5 config layout) as the config it was created with',
    (_, { dir, meta }) => {
      const m = loadHfModel(dir);
      expect(m.config).toEqual(resolveArchConfig(meta.createOptions));
      // The Hub's multimodal checkpoints keep the text model under model.language_model.
      const text = family(m.config.arch).nested ? 'model.language_model.' : 'model.';
      expect(m.tensors[0].name).toBe(`${text}embed_tokens.weight`);
      expect(m.tensors.every((t) => t.dtype === 'F32')).toBe(true);
    },
  );

  const tiny: ArchConfig = {
    arch: 'qwen3',
    vocabSize: 16,
    hiddenSize: 8,
    intermediateSize: 12,
    numLayers: 1,
    numHeads: 2,
    numKvHeads: 1,
    headDim: 4,
    rmsNormEps: 1e-6,
    ropeTheta: 10000,
    maxPositionEmbeddings: 64,
    tieWordEmbeddings: false,
    attentionBias: false,
    qkNorm: true,
  };
  const config = toHfConfig(tiny, { bos: 0, eos: 1, pad: 0 }, 'float32');

  test('write then load returns the same config and tensors; side files are copied', () => {
    const src = path.join(tmp, 'src');
    fs.mkdirSync(src);
    fs.writeFileSync(path.join(src, 'tokenizer.json'), '{"tok": 1}');
    const tensors = initTensors(tiny, 3);
    const out = path.join(tmp, 'out');
    writeHfModel(out, { config, tensors, copyFrom: src });
    expect(fs.readdirSync(out).sort()).toEqual([
      'config.json',
      'generation_config.json',
      'model.safetensors',
      'tokenizer.json',
    ]);
    expect(JSON.parse(fs.readFileSync(path.join(out, 'generation_config.json'), 'utf8'))).toEqual({
      bos_token_id: 0,
      eos_token_id: 1,
      pad_token_id: 0,
    });
    expect(readSafetensors(path.join(out, 'model.safetensors')).metadata).toEqual({ format: 'pt' });
    const back = loadHfModel(out);
    expect(back.config).toEqual(tiny);
    expect(
      back.tensors.map((t) => [t.name, Buffer.compare(t.data, tensors.find((x) => x.name === t.name)!.data)]),
    ).toEqual(tensors.map((t) => [t.name, 0]));
    expect(readHfConfig(out).rawConfig).toEqual(config);
  });

  test('an existing folder is replaced whole, without temp leftovers', () => {
    const out = path.join(tmp, 'out');
    fs.mkdirSync(out);
    fs.writeFileSync(path.join(out, 'stale.txt'), 'old');
    writeHfModel(out, { config, tensors: initTensors(tiny, 0), files: { 'extra.json': '{}' } });
    expect(fs.readdirSync(out).sort()).toEqual([
      'config.json',
      'extra.json',
      'generation_config.json',
      'model.safetensors',
    ]);
    expect(fs.readdirSync(tmp)).toEqual(['out']);
  });

  test('a failed write leaves the previous folder untouched', () => {
    const out = path.join(tmp, 'out');
    writeHfModel(out, { config, tensors: initTensors(tiny, 0) });
    const before = fs.readFileSync(path.join(out, 'model.safetensors'));
    expect(() => writeHfModel(out, { config, tensors: initTensors(tiny, 1), files: { '../evil': 'x' } })).toThrow(
      /extra file name '\.\.\/evil'/,
    );
    expect(Buffer.compare(fs.readFileSync(path.join(out, 'model.safetensors')), before)).toBe(0);
    expect(fs.readdirSync(tmp)).toEqual(['out']);
  });

  test('tensors that do not match config.json are reported by name', () => {
    const tensors = initTensors(tiny, 0);
    expect(() => writeHfModel(path.join(tmp, 'a'), { config, tensors: tensors.slice(1) })).toThrow(
      /missing tensor 'model\.embed_tokens\.weight'/,
    );
    const wrong = tensors.map((t) => (t.name === 'model.norm.weight' ? { ...t, shape: [2, 4] } : t));
    expect(() => writeHfModel(path.join(tmp, 'b'), { config, tensors: wrong })).toThrow(
      /tensor 'model\.norm\.weight' has shape \[2,4\], config\.json implies \[8\]/,
    );
    const extra = [...tensors, { ...tensors[1], name: 'model.layers.9.mlp.up_proj.weight' }];
    expect(() => writeHfModel(path.join(tmp, 'c'), { config, tensors: extra })).toThrow(
      /unexpected tensor\(s\) for qwen3: model\.layers\.9\.mlp\.up_proj\.weight/,
    );
  });

  test('RoPE buffers and a duplicate lm_head next to tied embeddings are ignored on load', () => {
    const tied = { ...tiny, tieWordEmbeddings: true };
    const tensors = initTensors(tied, 0);
    const embed = tensors[0];
    const extras = [
      { ...embed, name: 'lm_head.weight' },
      {
        name: 'model.layers.0.self_attn.rotary_emb.inv_freq',
        dtype: 'F32' as const,
        shape: [2],
        data: Buffer.alloc(8),
      },
    ];
    const out = path.join(tmp, 'tied');
    writeHfModel(out, {
      config: toHfConfig(tied, { bos: 0, eos: 1, pad: 0 }, 'float32'),
      tensors: [...tensors, ...extras],
    });
    expect(loadHfModel(out).tensors.map((t) => t.name)).toEqual(tensors.map((t) => t.name));
  });

  test('config.json sizes beyond what the weight files hold are refused before anything is allocated, naming the field and the bytes', () => {
    const out = path.join(tmp, 'm');
    writeHfModel(out, { config, tensors: initTensors(tiny, 0) });
    const file = path.join(out, 'config.json');
    const heap = process.memoryUsage().heapUsed;
    for (const [field, value, bytes] of [
      // 10^7 blocks used to build a table of 10^8 tensors: V8 heap out of memory, exit 134.
      ['num_hidden_layers', 10_000_000, /at least [\d.]+ GiB of weights/],
      ['vocab_size', 1e12, /at least [\d.]+ TiB of weights/],
      ['intermediate_size', 2 ** 40, /at least [\d.]+ TiB of weights/],
    ] as const) {
      fs.writeFileSync(file, JSON.stringify({ ...config, [field]: value }));
      for (const read of [() => readHfConfig(out), () => loadHfModel(out)]) {
        const err = (() => {
          try {
            read();
          } catch (e) {
            return e as Error;
          }
          throw new Error(`${field} ${value} was accepted`);
        })();
        expect(err.message).toMatch(
          new RegExp(`^${file}: field '${field}' \\(${value}\\) makes [\\d,e+.]+ parameters: `),
        );
        expect(err.message).toMatch(bytes);
        expect(err.message).toMatch(/but the folder's weight files hold [\d.]+ KiB/);
      }
    }
    expect(process.memoryUsage().heapUsed - heap).toBeLessThan(64 << 20);
  });

  test('a folder without config.json or with broken JSON names the file', () => {
    expect(() => loadHfModel(tmp)).toThrow(`${path.join(tmp, 'config.json')}: cannot read (ENOENT)`);
    fs.writeFileSync(path.join(tmp, 'config.json'), '{"model_type": ');
    expect(() => loadHfModel(tmp)).toThrow(/config\.json: not valid JSON/);
  });
});

describe('qwen3_5: the hybrid config', () => {
  const text = {
    architectures: ['Qwen3_5ForCausalLM'],
    model_type: 'qwen3_5_text',
    vocab_size: 300,
    hidden_size: 64,
    intermediate_size: 128,
    num_hidden_layers: 4,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    head_dim: 16,
    linear_num_key_heads: 2,
    linear_num_value_heads: 4,
    linear_key_head_dim: 16,
    linear_value_head_dim: 16,
    rope_parameters: { rope_type: 'default', rope_theta: 1e7, partial_rotary_factor: 0.25, mrope_section: [2, 1, 1] },
  };

  test("reads the layer kinds (transformers' every-4th rule when absent), the linear sizes and partial RoPE", () => {
    const a = parseHfConfig(text);
    expect(a.layerTypes).toEqual(['linear_attention', 'linear_attention', 'linear_attention', 'full_attention']);
    expect(a).toMatchObject({
      linearAttention: { numKeyHeads: 2, numValueHeads: 4, keyHeadDim: 16, valueHeadDim: 16, convKernel: 4 },
      partialRotaryFactor: 0.25,
      ropeTheta: 1e7,
      normOffset: true,
      attnOutputGate: true,
    });
    expect(parseHfConfig({ ...text, full_attention_interval: 2 }).layerTypes).toEqual([
      'linear_attention',
      'full_attention',
      'linear_attention',
      'full_attention',
    ]);
    expect(parseHfConfig(toHfConfig(a, { bos: 0, eos: 1, pad: 0 }, 'float32'))).toEqual(a);
  });

  test("an unknown layer_types entry, or a count that is not the layers', is refused by name", () => {
    const kinds = ['linear_attention', 'sliding_attention', 'linear_attention', 'full_attention'];
    expect(() => parseHfConfig({ ...text, layer_types: kinds }, 'm/config.json')).toThrow(
      'm/config.json: field \'layer_types\' has an unknown entry "sliding_attention" at index 1 (known: linear_attention, full_attention)',
    );
    expect(() => parseHfConfig({ ...text, layer_types: ['full_attention'] })).toThrow(
      "field 'layer_types' has 1 entries for num_hidden_layers 4",
    );
    expect(() => parseHfConfig({ ...text, linear_num_value_heads: 3 })).toThrow(/linear_num_value_heads/);
    expect(() => parseHfConfig({ ...text, head_dim: undefined })).toThrow(/field 'head_dim' is required/);
  });

  test("qwen3_5_moe: every block sparse with a shared expert; intermediate_size may be absent (the Hub's)", () => {
    const { intermediate_size: _, ...rest } = text;
    const moe = {
      ...rest,
      architectures: ['Qwen3_5MoeForCausalLM'],
      model_type: 'qwen3_5_moe_text',
      num_experts: 8,
      num_experts_per_tok: 2,
      moe_intermediate_size: 32,
      shared_expert_intermediate_size: 48,
    };
    const a = parseHfConfig(moe);
    expect(a.moe).toEqual({
      numExperts: 8,
      numExpertsPerTok: 2,
      moeIntermediateSize: 32,
      sharedExpertIntermediateSize: 48,
      decoderSparseStep: 1,
      mlpOnlyLayers: [],
      normTopkProb: true,
    });
    expect(a.intermediateSize).toBe(32);
    const block = tensorSpecs(a).filter((t) => t.layer === 0);
    expect(block.find((t) => t.slot === 'sharedExpertGate')).toMatchObject({
      name: 'model.layers.0.mlp.shared_expert_gate.weight',
      shape: [1, 64],
    });
    expect(block.filter((t) => t.slot === 'expertUp')).toHaveLength(8);
    expect(parseHfConfig(toHfConfig(a, { bos: 0, eos: 1, pad: 0 }, 'float32'))).toEqual(a);
    expect(() => parseHfConfig({ ...moe, mlp_only_layers: [1] })).toThrow(
      "field 'mlp_only_layers' is not a Qwen3.5-MoE field: every block is sparse",
    );
  });

  test("the Hub's multimodal layout: the text fields under text_config, the top level's tie_word_embeddings", () => {
    const { architectures: _, model_type: __, ...fields } = text;
    const vlm = {
      architectures: ['Qwen3_5ForConditionalGeneration'],
      model_type: 'qwen3_5',
      text_config: { ...fields, model_type: 'qwen3_5_text', tie_word_embeddings: false },
      vision_config: { depth: 27 },
      tie_word_embeddings: true,
    };
    const a = parseHfConfig(vlm);
    expect(a).toMatchObject({ arch: 'qwen3_5', tieWordEmbeddings: true, hiddenSize: 64 });
    expect(tensorSpecs(a)[0].name).toBe('model.language_model.embed_tokens.weight');
    expect(() =>
      parseHfConfig({ ...vlm, text_config: { ...vlm.text_config, layer_types: ['x', 'x', 'x', 'x'] } }, 'c.json'),
    ).toThrow('c.json (text_config): field \'layer_types\' has an unknown entry "x" at index 0');
    expect(() => parseHfConfig({ ...vlm, text_config: undefined }, 'c.json')).toThrow(
      "c.json: field 'text_config' must be an object",
    );
    // The vision tower and the multi-token-prediction head are not the text model's.
    expect(isIgnorable('model.visual.blocks.0.attn.qkv.weight', a)).toBe(true);
    expect(isIgnorable('mtp.fc.weight', a)).toBe(true);
    expect(isIgnorable('model.visual.x', parseHfConfig(text))).toBe(false);
  });
});

import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import {
  createModel,
  createModelFromConfig,
  initTensors,
  MODEL_PRESETS,
  MOE_PRESETS,
  resolveArchConfig,
} from '../../lib/model/create';
import { modelCreateSchema } from '../../lib/config/schemas';
import { ARCHS } from '../../lib/config/names';
import { loadHfModel } from '../../lib/model/hf';
import { parameterCount } from '../../lib/model/tensors';
import { Tokenizer } from '../../lib/model/tokenizer';
import { applyChatTemplate } from '../../lib/model/chat';
import { Rng } from '../../lib/model/rng';

let tmp: string;
beforeEach(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'create-'));
});
afterEach(() => fs.rmSync(tmp, { recursive: true, force: true }));

const read = (dir: string, file: string) => fs.readFileSync(path.join(dir, file));

describe('createModel', () => {
  // Every registered family; a new one fails here until its HF class name is below.
  test.each(ARCHS)('writes a complete %s folder that loads back', (arch) => {
    const out = path.join(tmp, arch);
    const created = createModel({ arch, preset: 'tiny', tokenizer: 'bytes', seed: 0, out });
    expect(fs.readdirSync(out).sort()).toEqual([
      'config.json',
      'generation_config.json',
      'model.safetensors',
      'tokenizer.json',
      'tokenizer_config.json',
    ]);
    const config = JSON.parse(read(out, 'config.json').toString());
    expect(config).toMatchObject({
      architectures: [
        {
          llama: 'LlamaForCausalLM',
          qwen2: 'Qwen2ForCausalLM',
          qwen3: 'Qwen3ForCausalLM',
          qwen3_moe: 'Qwen3MoeForCausalLM',
          qwen3_5_text: 'Qwen3_5ForCausalLM',
          qwen3_5: 'Qwen3_5ForConditionalGeneration',
          qwen3_5_moe_text: 'Qwen3_5MoeForCausalLM',
          qwen3_5_moe: 'Qwen3_5MoeForConditionalGeneration',
        }[arch],
      ],
      model_type: arch,
      torch_dtype: 'float32',
    });
    // The Hub's multimodal checkpoints (qwen3_5) keep the text model's fields in text_config.
    expect(config.text_config ?? config).toMatchObject({
      vocab_size: 265,
      bos_token_id: 256,
      eos_token_id: 258,
      pad_token_id: 256,
    });
    expect(JSON.parse(read(out, 'generation_config.json').toString())).toEqual({
      bos_token_id: 256,
      eos_token_id: [258, 256],
      pad_token_id: 256,
    });
    const model = loadHfModel(out);
    expect(model.config).toEqual(created.config);
    expect(created.parameterCount).toBe(model.tensors.reduce((n, t) => n + t.shape.reduce((a, b) => a * b, 1), 0));
    const tok = Tokenizer.fromDir(out);
    expect(tok.eosTokenIds).toEqual([258, 256]);
    expect(applyChatTemplate(tok, [{ role: 'user', content: 'hi' }], { addGenerationPrompt: true })).toEqual([
      257,
      ...Buffer.from('user\nhi'),
      258,
      10,
      257,
      ...Buffer.from('assistant\n'),
    ]);
  });

  test('the same seed gives byte-identical files; another seed gives other weights', () => {
    const opts = { arch: 'qwen3', preset: 'tiny', tokenizer: 'bytes' } as const;
    createModel({ ...opts, seed: 7, out: path.join(tmp, 'a') });
    createModel({ ...opts, seed: 7, out: path.join(tmp, 'b') });
    createModel({ ...opts, seed: 8, out: path.join(tmp, 'c') });
    for (const f of fs.readdirSync(path.join(tmp, 'a'))) {
      expect(Buffer.compare(read(path.join(tmp, 'a'), f), read(path.join(tmp, 'b'), f))).toBe(0);
    }
    expect(
      Buffer.compare(read(path.join(tmp, 'a'), 'model.safetensors'), read(path.join(tmp, 'c'), 'model.safetensors')),
    ).not.toBe(0);
  });

  test('initialisation follows transformers: normal(0, 0.02) weights, unit norms, zero biases', () => {
    const a = resolveArchConfig({ arch: 'qwen2', preset: 'tiny', tokenizer: 'bytes' });
    const byName = new Map(
      initTensors(a, 0).map((t) => [t.name, new Float32Array(t.data.buffer, t.data.byteOffset, t.data.length / 4)]),
    );
    const embed = byName.get('model.embed_tokens.weight')!;
    const mean = embed.reduce((s, x) => s + x, 0) / embed.length;
    const std = Math.sqrt(embed.reduce((s, x) => s + (x - mean) ** 2, 0) / embed.length);
    expect(Math.abs(mean)).toBeLessThan(0.001);
    expect(std).toBeGreaterThan(0.019);
    expect(std).toBeLessThan(0.021);
    expect([...byName.get('model.norm.weight')!].every((x) => x === 1)).toBe(true);
    expect([...byName.get('model.layers.0.self_attn.q_proj.bias')!].every((x) => x === 0)).toBe(true);
    expect(byName.get('model.layers.0.self_attn.q_proj.weight')).not.toEqual(
      byName.get('model.layers.1.self_attn.q_proj.weight'),
    );
  });

  test('bfloat16 storage rounds the float32 init to nearest even', () => {
    const a = resolveArchConfig({ arch: 'llama', preset: 'tiny', tokenizer: 'bytes' });
    const f32 = initTensors(a, 1, 'float32')[0];
    const bf16 = initTensors(a, 1, 'bfloat16')[0];
    expect(bf16.dtype).toBe('BF16');
    expect(bf16.data.length).toBe(f32.data.length / 2);
    for (let i = 0; i < 100; i++) {
      const x = f32.data.readFloatLE(i * 4);
      const back = Buffer.alloc(4);
      back.writeUInt16LE(bf16.data.readUInt16LE(i * 2), 2);
      expect(Math.abs(back.readFloatLE(0) - x)).toBeLessThanOrEqual(Math.abs(x) * 2 ** -8);
    }
    const out = path.join(tmp, 'bf16');
    createModel({ arch: 'llama', preset: 'tiny', tokenizer: 'bytes', seed: 1, out, dtype: 'bfloat16' });
    expect(JSON.parse(read(out, 'config.json').toString()).torch_dtype).toBe('bfloat16');
    expect(loadHfModel(out).tensors.every((t) => t.dtype === 'BF16')).toBe(true);
  });

  test('explicit sizes override the preset; head_dim defaults to hidden / heads', () => {
    const a = resolveArchConfig({
      arch: 'qwen3',
      preset: 'tiny',
      tokenizer: 'bytes',
      hiddenSize: 96,
      numHeads: 6,
      numKvHeads: 3,
      tieWordEmbeddings: false,
    });
    expect(a).toMatchObject({
      hiddenSize: 96,
      numHeads: 6,
      numKvHeads: 3,
      headDim: 16,
      numLayers: MODEL_PRESETS.tiny.numLayers,
      tieWordEmbeddings: false,
    });
    expect(resolveArchConfig({ arch: 'qwen3', preset: 'tiny', tokenizer: 'bytes', headDim: 32 }).headDim).toBe(32);
  });

  test.each<[string, object, RegExp]>([
    ['kv heads not dividing heads', { numKvHeads: 3 }, /numKvHeads \(3\) must divide numHeads \(4\)/],
    [
      'width not divisible by heads',
      { hiddenSize: 66 },
      /hiddenSize \(66\) is not divisible by numHeads \(4\); give headDim/,
    ],
    ['odd head_dim', { headDim: 15 }, /headDim must be even/],
    [
      'vocabulary smaller than the tokenizer',
      { vocabSize: 100 },
      /vocabSize 100 is smaller than the bytes tokenizer \(265 tokens\)/,
    ],
    ['a zero size', { numLayers: 0 }, /numLayers must be a positive integer/],
  ])('rejects %s', (_what, override, message) => {
    expect(() =>
      createModel({
        arch: 'qwen3',
        preset: 'tiny',
        tokenizer: 'bytes',
        seed: 0,
        out: path.join(tmp, 'x'),
        ...override,
      }),
    ).toThrow(message);
    expect(fs.existsSync(path.join(tmp, 'x'))).toBe(false);
  });

  test('qwen3_moe: MoE presets and options; experts x top-k width equals the dense preset MLP', () => {
    for (const preset of ['tiny', 'small'] as const) {
      const a = resolveArchConfig({ arch: 'qwen3_moe', preset, tokenizer: 'bytes' });
      const { numExpertsPerTok, moeIntermediateSize } = MOE_PRESETS[preset];
      expect(a.moe).toMatchObject(MOE_PRESETS[preset]);
      expect(numExpertsPerTok * moeIntermediateSize).toBe(MODEL_PRESETS[preset].intermediateSize);
    }
    const out = path.join(tmp, 'moe');
    createModelFromConfig(
      modelCreateSchema.parse({
        arch: 'qwen3_moe',
        out,
        num_layers: 4,
        num_experts: 6,
        num_experts_per_tok: 3,
        moe_intermediate_size: 24,
        decoder_sparse_step: 2,
        mlp_only_layers: [3],
        norm_topk_prob: false,
      }),
    );
    const config = JSON.parse(read(out, 'config.json').toString());
    expect(config).toMatchObject({
      model_type: 'qwen3_moe',
      num_experts: 6,
      num_experts_per_tok: 3,
      moe_intermediate_size: 24,
      decoder_sparse_step: 2,
      mlp_only_layers: [3],
      norm_topk_prob: false,
    });
    // Layer 1 is the only sparse one (3 is mlp-only; 0 and 2 are off the step).
    const names = loadHfModel(out).tensors.map((t) => t.name);
    expect(names.filter((n) => n.endsWith('mlp.gate.weight'))).toEqual(['model.layers.1.mlp.gate.weight']);
    expect(names.filter((n) => /experts\.\d+\.up_proj/.test(n))).toHaveLength(6);
    expect(names.filter((n) => n.endsWith('mlp.up_proj.weight'))).toHaveLength(3);
    expect(() =>
      createModel({ arch: 'qwen3', preset: 'tiny', tokenizer: 'bytes', seed: 0, out, moe: { numExperts: 4 } }),
    ).toThrow(/MoE options need an MoE architecture \(qwen3_moe\); 'qwen3' is dense/);
    expect(() =>
      createModel({
        arch: 'qwen3_moe',
        preset: 'tiny',
        tokenizer: 'bytes',
        seed: 0,
        out,
        moe: { numExpertsPerTok: 9 },
      }),
    ).toThrow(/numExpertsPerTok \(9\) exceeds moe.numExperts \(8\)/);
  });

  test('presets: the small one is 50-100M parameters with the Qwen3 vocabulary', () => {
    const small = resolveArchConfig({ arch: 'qwen3', preset: 'small', tokenizer: 'qwen3' });
    expect(small.vocabSize).toBe(151936);
    expect(parameterCount(small)).toBe(99_821_056);
    expect(parameterCount(resolveArchConfig({ arch: 'qwen3', preset: 'tiny', tokenizer: 'bytes' }))).toBe(115_648);
  });

  test('the qwen3 tokenizer ships the Qwen3 vocabulary with our ChatML template', () => {
    const out = path.join(tmp, 'q');
    createModel({
      arch: 'qwen3',
      preset: 'tiny',
      tokenizer: 'qwen3',
      seed: 0,
      out,
      hiddenSize: 16,
      intermediateSize: 32,
      numLayers: 1,
    });
    const tok = Tokenizer.fromDir(out);
    expect(tok.encode('Hello, world!')).toEqual([9707, 11, 1879, 0]);
    expect(tok.eosTokenIds).toEqual([151645, 151643]);
    const config = JSON.parse(read(out, 'tokenizer_config.json').toString());
    expect(config.chat_template).not.toContain("split('</think>')");
    expect(config.eos_token).toBe('<|im_end|>');
    expect(JSON.parse(read(out, 'config.json').toString())).toMatchObject({
      vocab_size: 151936,
      bos_token_id: 151643,
      eos_token_id: 151645,
    });
  });
});

describe('Rng', () => {
  test('streams are reproducible and independent by name and seed', () => {
    const draw = (seed: number, stream: string) => {
      const r = new Rng(seed, stream);
      return [r.nextU32(), r.nextU32(), r.nextU32()];
    };
    expect(draw(0, 'a')).toEqual(draw(0, 'a'));
    expect(draw(0, 'a')).not.toEqual(draw(0, 'b'));
    expect(draw(0, 'a')).not.toEqual(draw(1, 'a'));
    expect(draw(2 ** 40, 'a')).not.toEqual(draw(0, 'a'));
    expect(() => new Rng(0.5)).toThrow(/seed must be a safe integer/);
  });
});

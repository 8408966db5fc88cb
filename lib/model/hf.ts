/**
 * Hugging Face model folders: `config.json` + safetensors weights (single or sharded) + tokenizer
 * files. Reading yields what the native engine consumes (`ArchConfig` + `WeightTensor[]`); writing
 * produces a folder transformers' `from_pretrained` loads, atomically (readers such as an inference
 * server told to load `weights/step_n/` never see a half-written folder).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { ArchConfig, DiskDType, WeightTensor } from './arch';
import { writeDirAtomic, writeDirAtomicAsync, writeFileAtomic } from '../atomic';
import { readJsonFile } from '../json';
import { parseHfConfig } from './hf-config';
import { checkWeightsFit } from './bounds';
import {
  locateSafetensorsDir,
  readSafetensorsDir,
  readSafetensorsDirAsync,
  weightFilesBytes,
  writeSafetensors,
  writeSafetensorsStream,
  type SelectTensors,
  type TensorEntry,
} from './safetensors';
import { checkModelTensors, skippedParts } from './tensors';

export interface HfModel {
  dir: string;
  config: ArchConfig;
  /** config.json as found, so a derived checkpoint can keep fields we do not interpret. */
  rawConfig: Record<string, unknown>;
  /** In `tensorSpecs` order, checked against `config`. */
  tensors: WeightTensor[];
}

/** Files besides config and weights that make a folder self-contained for transformers and for us. */
export const SIDE_FILES = [
  'generation_config.json',
  'tokenizer.json',
  'tokenizer_config.json',
  'special_tokens_map.json',
  'chat_template.jinja',
  'vocab.json',
  'merges.txt',
] as const;

/**
 * The dtype a model folder stores its weights in (the most bytes among its floating-point tensors,
 * read from the safetensors headers): what weights trained from it are written in, so that a bf16
 * model's policy folders are bf16 like the model, half the bytes of fp32.
 */
export function storedWeightsDtype(dir: string): DiskDType {
  const bytes = new Map<DiskDType, number>();
  for (const t of locateSafetensorsDir(dir).values()) {
    if (t.dtype !== 'F32' && t.dtype !== 'BF16' && t.dtype !== 'F16') continue;
    bytes.set(t.dtype, (bytes.get(t.dtype) ?? 0) + t.end - t.begin);
  }
  let best: DiskDType = 'F32';
  for (const [dtype, n] of bytes) if (n > (bytes.get(best) ?? -1)) best = dtype;
  return best;
}

/**
 * A model folder's config.json, checked against the folder before anything is allocated by it: its
 * sizes must fit in the folder's weight files (`checkWeightsFit`), so a hostile or mistaken config
 * is refused by name here, once, for every reader (servers, trainer, preflight checks).
 */
export function readHfConfig(dir: string): { config: ArchConfig; rawConfig: Record<string, unknown> } {
  const read = readHfConfigShape(dir);
  checkWeightsFit(read.config, path.join(dir, 'config.json'), weightFilesBytes(dir));
  return read;
}

/**
 * A folder's config.json alone, for what only reasons about the shapes and allocates nothing by
 * them (the memory plan of a model whose weights are not here, such as a preset of public shapes).
 */
export function readHfConfigShape(dir: string): { config: ArchConfig; rawConfig: Record<string, unknown> } {
  const file = path.join(dir, 'config.json');
  const rawConfig = readJsonFile(file);
  return { config: parseHfConfig(rawConfig, file), rawConfig };
}

/**
 * Loads config and weights of an HF model folder. Nothing is allocated by what the folder claims
 * before it is checked: config.json against the files' sizes (readHfConfig), then the tensors'
 * names, shapes and dtypes against config.json by the files' headers (`modelTensorsOf`, the one
 * check), then the data of the model's tensors is read, in `tensorSpecs` order.
 */
export function loadHfModel(dir: string): HfModel {
  const { config, rawConfig } = readHfConfig(dir);
  return { dir, config, rawConfig, tensors: readSafetensorsDir(dir, modelTensorsOf(config, dir)) };
}

/** loadHfModel without blocking the event loop while the weights are read (a serving process). */
export async function loadHfModelAsync(dir: string): Promise<HfModel> {
  const { config, rawConfig } = readHfConfig(dir);
  return { dir, config, rawConfig, tensors: await readSafetensorsDirAsync(dir, modelTensorsOf(config, dir)) };
}

/**
 * The model's tensors of the folder by their headers, checked against `config` and in its order;
 * says once per folder what of a multimodal checkpoint a text run skips.
 */
function modelTensorsOf(config: ArchConfig, dir: string): SelectTensors {
  return (headers) => {
    const chosen = checkModelTensors(config, headers, dir);
    const note = skippedParts(
      config,
      headers.map((h) => h.name),
    );
    if (note && !saidSkipped.has(dir)) {
      saidSkipped.add(dir);
      console.warn(`[model] ${dir}: ${note}`);
    }
    return chosen;
  };
}
const saidSkipped = new Set<string>();

export interface WriteHfModelOptions {
  /** The full config.json object; it is validated and must describe `tensors`. */
  config: Record<string, unknown>;
  tensors: readonly WeightTensor[];
  /** A folder to copy the `SIDE_FILES` it has from (tokenizer, generation config); usually the base model. */
  copyFrom?: string;
  /** Extra files by name, written after the copies (so they win). */
  files?: Record<string, string | Buffer>;
}

/**
 * Writes an HF model folder at `dir`, replacing an existing one only once the new one is complete.
 * A `generation_config.json` is derived from config.json's token ids when no other source has one.
 */
export function writeHfModel(dir: string, opts: WriteHfModelOptions): void {
  const tensors = checkModelTensors(configOf(dir, opts), opts.tensors, dir);
  writeDirAtomic(dir, (tmp) => {
    // transformers refuses safetensors files whose metadata lacks a known `format`.
    writeSafetensors(path.join(tmp, WEIGHTS_FILE), tensors, { format: 'pt' });
    fillHfFolder(dir, tmp, opts);
  });
}

export interface WriteHfModelStreamOptions extends Omit<WriteHfModelOptions, 'tensors'> {
  /** Every tensor's name, dtype and shape, in the order `batches` yields them. */
  entries: TensorEntry[];
  batches: AsyncIterable<readonly WeightTensor[]>;
}

/**
 * `writeHfModel` for weights that arrive in batches (a sharded trainer gathers them unit by unit):
 * the safetensors file is written as they come, never more than a batch in memory.
 */
export async function writeHfModelStream(dir: string, opts: WriteHfModelStreamOptions): Promise<void> {
  checkModelTensors(configOf(dir, opts), opts.entries, dir);
  await writeDirAtomicAsync(dir, async (tmp) => {
    await writeSafetensorsStream(path.join(tmp, WEIGHTS_FILE), opts.entries, opts.batches, { format: 'pt' });
    fillHfFolder(dir, tmp, opts);
  });
}

const WEIGHTS_FILE = 'model.safetensors';

/** The ArchConfig of the config.json object a folder at `dir` is to get. */
function configOf(dir: string, opts: Pick<WriteHfModelOptions, 'config'>): ArchConfig {
  return parseHfConfig(opts.config, path.join(dir, 'config.json'));
}

/** config.json, the side files, the extra files and a generation config into `tmp`, the folder `dir` becomes. */
function fillHfFolder(dir: string, tmp: string, opts: Omit<WriteHfModelOptions, 'tensors'>): void {
  writeFileAtomic(path.join(tmp, 'config.json'), JSON.stringify(opts.config, null, 2) + '\n');
  if (opts.copyFrom) {
    for (const name of SIDE_FILES) {
      const src = path.join(opts.copyFrom, name);
      if (fs.existsSync(src)) fs.copyFileSync(src, path.join(tmp, name));
    }
  }
  for (const [name, content] of Object.entries(opts.files ?? {})) {
    // Names are relative paths inside the folder (`lora/adapter_config.json`): no `..`, no
    // absolute path, and never the two files written above.
    const parts = name.split('/');
    if (
      name.includes('\\') ||
      parts.some((p) => p === '' || p === '.' || p === '..') ||
      name === 'config.json' ||
      name === WEIGHTS_FILE
    ) {
      throw new Error(`${dir}: extra file name '${name}' is not allowed`);
    }
    fs.mkdirSync(path.join(tmp, ...parts.slice(0, -1)), { recursive: true });
    writeFileAtomic(path.join(tmp, ...parts), content);
  }
  const generation = path.join(tmp, 'generation_config.json');
  if (!fs.existsSync(generation)) {
    const { bos_token_id, eos_token_id, pad_token_id } = opts.config;
    writeFileAtomic(generation, JSON.stringify({ bos_token_id, eos_token_id, pad_token_id }, null, 2) + '\n');
  }
}

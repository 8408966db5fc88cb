/**
 * The tokenizer of a model folder: `tokenizer.json` run by `@huggingface/tokenizers` (a pure-JS
 * port of the Rust crate), plus what transformers keeps beside it in `tokenizer_config.json` and
 * `generation_config.json` (chat template, eos/pad tokens), plus streaming detokenization.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';
import { readBoundedText } from '../files';
import { resolveModelDir } from '../hub';
import { readJsonFile } from '../json';

type Json = Record<string, unknown>;

/** Chat templates on the Hub are a few KiB; a larger file is not one. */
const MAX_TEMPLATE_BYTES = 1 << 20;

/** `tokenizer_config.json` spells a token as a string or as an AddedToken object `{content, ...}`. */
function tokenContent(v: unknown): string | undefined {
  if (typeof v === 'string') return v;
  if (v !== null && typeof v === 'object' && typeof (v as Json).content === 'string')
    return (v as Json).content as string;
  return undefined;
}

/** `chat_template` is a string, or a list of named templates of which transformers uses 'default'. */
function chatTemplateOf(config: Json, source: string): string | undefined {
  const t = config.chat_template;
  if (t === undefined || t === null) return undefined;
  if (typeof t === 'string') return t;
  if (Array.isArray(t)) {
    const named = t.find((x) => x && typeof x === 'object' && (x as Json).name === 'default');
    if (named && typeof (named as Json).template === 'string') return (named as Json).template as string;
  }
  throw new Error(`${source}: field 'chat_template' must be a string or a list with a 'default' entry`);
}

/**
 * The most bytes of normalized input one token can stand for, where such a bound holds: a
 * byte-level BPE (every token spells its bytes, one character each, in GPT-2's byte alphabet; no
 * unknown token can swallow a run of text) whose added tokens do not absorb whitespace (lstrip /
 * rstrip), normalized by nothing or NFC. Then `bytes / maxTokenBytes` bounds the token count from
 * below. Undefined for any other tokenizer: no cheap bound.
 */
function maxTokenBytesOf(json: Json): number | undefined {
  const normalizer = json.normalizer as Json | null | undefined;
  if (normalizer !== null && normalizer !== undefined && normalizer.type !== 'NFC') return undefined;
  const model = json.model as Json | undefined;
  if (model?.type !== 'BPE' || model.vocab === null || typeof model.vocab !== 'object') return undefined;
  const byteLevel = (p: unknown): boolean => {
    const q = p as Json | null | undefined;
    return (
      q?.type === 'ByteLevel' ||
      (q?.type === 'Sequence' && Array.isArray(q.pretokenizers) && q.pretokenizers.some(byteLevel))
    );
  };
  if (!byteLevel(json.pre_tokenizer)) return undefined;
  let max = 1;
  for (const token of Object.keys(model.vocab as Json)) max = Math.max(max, [...token].length);
  for (const t of (json.added_tokens ?? []) as Json[]) {
    if (t.lstrip || t.rstrip) return undefined;
    if (typeof t.content === 'string') max = Math.max(max, Buffer.byteLength(t.content));
  }
  return max;
}

/**
 * Refuses token ids far outside the vocabulary before the tokenizer library sees them: it sizes its
 * tables by the largest id, so a single id of 10^9 in tokenizer.json cost a minute of start-up and
 * gigabytes. Real vocabularies are dense (added tokens follow the model's), so "far" is at or
 * beyond twice the number of distinct ids.
 */
function checkTokenIds(json: Json, file: string): void {
  const model = json.model as Json | null | undefined;
  const entries: [unknown, unknown][] = [];
  const vocab = model?.vocab;
  // Unigram's vocab is a list of [token, score]: its ids are the positions.
  if (vocab !== null && typeof vocab === 'object' && !Array.isArray(vocab))
    for (const entry of Object.entries(vocab)) entries.push(entry);
  for (const t of Array.isArray(json.added_tokens) ? (json.added_tokens as unknown[]) : [])
    entries.push([(t as Json | null)?.content, (t as Json | null)?.id]);
  const ids = new Set<number>(Array.isArray(vocab) ? vocab.map((_, i) => i) : []);
  for (const [token, id] of entries) {
    if (typeof id !== 'number' || !Number.isSafeInteger(id) || id < 0)
      throw new Error(
        `${file}: token ${JSON.stringify(token)} has id ${JSON.stringify(id)}; ids are non-negative integers`,
      );
    ids.add(id);
  }
  const limit = 2 * ids.size;
  const far = entries.find(([, id]) => (id as number) >= limit);
  if (far)
    throw new Error(
      `${file}: token ${JSON.stringify(far[0])} has id ${String(far[1])}, far outside a vocabulary of ${ids.size} ids (at most ${limit - 1} is taken)`,
    );
}

export interface TokenizerFiles {
  tokenizerJson: Json;
  tokenizerConfig: Json;
  generationConfig?: Json;
  /** Contents of `chat_template.jinja`, which newer transformers writes instead of the config field. */
  chatTemplateFile?: string;
  /** Names the origin in errors. */
  source?: string;
}

export class Tokenizer {
  private readonly hf: HfTokenizer;
  /** Number of ids the tokenizer can produce or decode (model vocabularies may be padded beyond). */
  readonly size: number;
  readonly chatTemplate: string | undefined;
  /** Where the chat template comes from (a file of the folder), for messages about it. */
  readonly chatTemplateSource: string | undefined;
  /** Ids that end generation: tokenizer_config's `eos_token` and generation_config's `eos_token_id`(s). */
  readonly eosTokenIds: number[];
  readonly padTokenId: number | undefined;
  readonly bosTokenId: number | undefined;
  /** Named special tokens (`bos_token`, `eos_token`, ...) as chat templates expect them. */
  readonly specialTokensMap: Record<string, string>;
  /** See maxTokenBytesOf; undefined: this tokenizer has no cheap lower bound of token counts. */
  readonly maxTokenBytes: number | undefined;
  private readonly nfc: boolean;

  constructor(files: TokenizerFiles) {
    const source = files.source ?? 'tokenizer';
    const config = files.tokenizerConfig;
    checkTokenIds(files.tokenizerJson, files.source ? path.join(files.source, 'tokenizer.json') : 'tokenizer.json');
    // tokenizers.js cleans up spaces unless told otherwise; transformers' current default is not to.
    this.hf = new HfTokenizer(files.tokenizerJson, {
      ...config,
      clean_up_tokenization_spaces: config.clean_up_tokenization_spaces ?? false,
    });
    let maxId = -1;
    for (const id of this.hf.get_vocab(true).values()) maxId = Math.max(maxId, id);
    this.size = maxId + 1;
    this.chatTemplate = files.chatTemplateFile ?? chatTemplateOf(config, source);
    this.chatTemplateSource =
      this.chatTemplate === undefined
        ? undefined
        : path.join(source, files.chatTemplateFile !== undefined ? 'chat_template.jinja' : 'tokenizer_config.json');
    this.maxTokenBytes = maxTokenBytesOf(files.tokenizerJson);
    this.nfc = (files.tokenizerJson.normalizer as Json | null | undefined)?.type === 'NFC';

    this.specialTokensMap = {};
    for (const key of ['bos_token', 'eos_token', 'unk_token', 'pad_token']) {
      const content = tokenContent(config[key]);
      if (content !== undefined) this.specialTokensMap[key] = content;
    }
    const idOf = (key: string): number | undefined => {
      const content = this.specialTokensMap[key];
      if (content === undefined) return undefined;
      const id = this.tokenToId(content);
      if (id === undefined) throw new Error(`${source}: ${key} ${JSON.stringify(content)} is not in the vocabulary`);
      return id;
    };
    this.bosTokenId = idOf('bos_token');
    this.padTokenId = idOf('pad_token');
    const eos = new Set<number>();
    const configEos = idOf('eos_token');
    if (configEos !== undefined) eos.add(configEos);
    const genEos = files.generationConfig?.eos_token_id;
    for (const id of Array.isArray(genEos) ? genEos : genEos === undefined || genEos === null ? [] : [genEos]) {
      if (typeof id !== 'number' || !Number.isInteger(id))
        throw new Error(`${source}: generation_config eos_token_id must be integers`);
      eos.add(id);
    }
    this.eosTokenIds = [...eos];
  }

  /** Loads `tokenizer.json`, `tokenizer_config.json` and, if present, `generation_config.json` and `chat_template.jinja`. */
  static fromDir(dir: string): Tokenizer {
    const file = (name: string) => path.join(dir, name);
    const exists = (name: string) => fs.existsSync(file(name));
    return new Tokenizer({
      tokenizerJson: readJsonFile(file('tokenizer.json')),
      tokenizerConfig: exists('tokenizer_config.json') ? readJsonFile(file('tokenizer_config.json')) : {},
      generationConfig: exists('generation_config.json') ? readJsonFile(file('generation_config.json')) : undefined,
      chatTemplateFile: exists('chat_template.jinja')
        ? readBoundedText(file('chat_template.jinja'), MAX_TEMPLATE_BYTES)
        : undefined,
      source: dir,
    });
  }

  /**
   * Text to ids. Special-token strings in the text become their ids. `addSpecialTokens` (default
   * false) applies the tokenizer's post-processor, e.g. a BOS; chat templates already write theirs.
   */
  encode(text: string, opts: { addSpecialTokens?: boolean } = {}): number[] {
    if (text.length === 0) return [];
    return this.hf.encode(text, { add_special_tokens: opts.addSpecialTokens ?? false }).ids;
  }

  /**
   * A lower bound of `encode(text).length` that costs a pass over the bytes, not a tokenization
   * (0 when this tokenizer has no such bound): lets a server refuse a prompt that cannot fit its
   * context without spending seconds tokenizing it.
   */
  minTokens(text: string): number {
    if (this.maxTokenBytes === undefined) return 0;
    return Math.floor(Buffer.byteLength(this.nfc ? text.normalize('NFC') : text) / this.maxTokenBytes);
  }

  /**
   * Ids to text. Ids the tokenizer does not know (a padded model vocabulary) are skipped, as the
   * Rust crate does; incomplete UTF-8 sequences decode to U+FFFD.
   */
  decode(ids: readonly number[], opts: { skipSpecialTokens?: boolean } = {}): string {
    const known = ids.filter((id) => Number.isInteger(id) && id >= 0 && this.hf.id_to_token(id) !== undefined);
    if (known.length === 0) return '';
    return this.hf.decode(known, { skip_special_tokens: opts.skipSpecialTokens ?? false });
  }

  tokenToId(token: string): number | undefined {
    return this.hf.token_to_id(token);
  }

  /** Like `tokenToId` but throws when the tokenizer lacks the token (e.g. `<|im_start|>` for ChatML). */
  requireTokenId(token: string): number {
    const id = this.tokenToId(token);
    if (id === undefined) throw new Error(`tokenizer has no token ${JSON.stringify(token)}`);
    return id;
  }

  idToToken(id: number): string | undefined {
    return this.hf.id_to_token(id);
  }

  /** Ids of tokens marked special in tokenizer.json (dropped by `skipSpecialTokens`). */
  specialTokenIds(): number[] {
    return [...this.hf.get_added_tokens_decoder().values()].filter((t) => t.special).map((t) => t.id);
  }
}

/**
 * Streaming detokenization: feed sampled ids as they arrive, get back only text that is final.
 * A multi-byte character split across tokens decodes to U+FFFD until its last byte arrives, so a
 * trailing run of U+FFFD is held back. Each step decodes only the tokens since the last complete
 * boundary plus the chunk before it (context for decoders whose output depends on the previous
 * token, like SentencePiece's leading space), so streaming costs O(1) per token.
 */
export class IncrementalDetokenizer {
  private readonly ids: number[] = [];
  /** Start of the decoding window; tokens before it are never decoded again. */
  private prefixOffset = 0;
  /** Tokens before this are fully emitted; it always sits on a character boundary. */
  private readOffset = 0;
  /** Characters after the readOffset boundary already emitted (the complete part of a pending tail). */
  private tailEmitted = 0;

  constructor(
    private readonly tokenizer: Tokenizer,
    private readonly opts: { skipSpecialTokens?: boolean } = {},
  ) {}

  /** Adds ids; returns the newly completed text ('' while a character is still incomplete). */
  push(ids: readonly number[]): string {
    this.ids.push(...ids);
    return this.emit(false);
  }

  /** Returns whatever is still held back (an unfinished character becomes U+FFFD). */
  flush(): string {
    return this.emit(true);
  }

  private emit(final: boolean): string {
    const prefixText = this.tokenizer.decode(this.ids.slice(this.prefixOffset, this.readOffset), this.opts);
    const fullText = this.tokenizer.decode(this.ids.slice(this.prefixOffset), this.opts);
    const complete = final || !fullText.endsWith('\uFFFD');
    const tail = (complete ? fullText : fullText.replace(/\uFFFD+$/, '')).slice(prefixText.length);
    const out = tail.slice(this.tailEmitted);
    this.tailEmitted = Math.max(this.tailEmitted, tail.length);
    if (complete && fullText.length > prefixText.length) {
      this.prefixOffset = this.readOffset;
      this.readOffset = this.ids.length;
      this.tailEmitted = 0;
    }
    return out;
  }
}

/** Tokenizers by model (a folder or a Hugging Face name), loaded once per worker process. */
const tokenizers = new Map<string, Tokenizer>();
export function tokenizerOf(model: string): Tokenizer {
  let t = tokenizers.get(model);
  if (!t) {
    t = Tokenizer.fromDir(resolveModelDir(model));
    tokenizers.set(model, t);
  }
  return t;
}

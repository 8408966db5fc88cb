/**
 * A byte-level tokenizer in Hugging Face `tokenizer.json` form, for small models trained from
 * scratch: every UTF-8 byte of the NFC-normalised text is one token (id = byte value), plus ChatML
 * control tokens. It is a BPE
 * model with the 256 GPT-2 byte characters as vocabulary and no merges, so transformers, the Rust
 * `tokenizers` crate and `@huggingface/tokenizers` all load it unchanged.
 */
import { CHATML_TEMPLATE } from './chat';

/**
 * GPT-2's printable stand-in for each byte (`bytes_to_unicode`): printable Latin-1 bytes map to
 * themselves, the rest to code points from U+0100 on. The ByteLevel pre-tokenizer and decoder use
 * this table, so the vocabulary must be spelled with it.
 */
export function bytesToUnicode(): string[] {
  const table: string[] = new Array(256);
  const printable = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  let next = 0;
  for (let b = 0; b < 256; b++) table[b] = String.fromCodePoint(printable(b) ? b : 256 + next++);
  return table;
}

/** Control tokens after the 256 bytes, in id order. Special ones are dropped by `skip_special_tokens`. */
export const BYTE_ADDED_TOKENS: ReadonlyArray<{ content: string; special: boolean }> = [
  { content: '<|endoftext|>', special: true },
  { content: '<|im_start|>', special: true },
  { content: '<|im_end|>', special: true },
  // Single tokens for the markup our chat template and tool-calling envs use, as in Qwen3's vocabulary.
  { content: '<think>', special: false },
  { content: '</think>', special: false },
  { content: '<tool_call>', special: false },
  { content: '</tool_call>', special: false },
  { content: '<tool_response>', special: false },
  { content: '</tool_response>', special: false },
];

export const BYTE_VOCAB_SIZE = 256 + BYTE_ADDED_TOKENS.length;

function addedTokenEntry(content: string, special: boolean) {
  return { content, single_word: false, lstrip: false, rstrip: false, normalized: false, special };
}

/** The `tokenizer.json` object. */
export function byteTokenizerJson(): Record<string, unknown> {
  const vocab: Record<string, number> = {};
  bytesToUnicode().forEach((ch, byte) => (vocab[ch] = byte));
  // Regex splitting would not change the result (there are no merges to cross split points).
  const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false };
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: BYTE_ADDED_TOKENS.map((t, i) => ({ id: 256 + i, ...addedTokenEntry(t.content, t.special) })),
    // NFC as in Qwen's tokenizer: transformers rebuilds Qwen2-type tokenizers with it regardless of
    // tokenizer.json, so without it a qwen2 folder would tokenize differently there than here.
    normalizer: { type: 'NFC' },
    pre_tokenizer: byteLevel,
    post_processor: byteLevel,
    decoder: byteLevel,
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges: [],
    },
  };
}

/** The `tokenizer_config.json` object: ChatML template, `<|im_end|>` ends a turn, `<|endoftext|>` pads. */
export function byteTokenizerConfig(modelMaxLength: number): Record<string, unknown> {
  const decoder: Record<string, unknown> = {};
  BYTE_ADDED_TOKENS.forEach((t, i) => (decoder[String(256 + i)] = addedTokenEntry(t.content, t.special)));
  return {
    added_tokens_decoder: decoder,
    additional_special_tokens: ['<|im_start|>', '<|im_end|>'],
    bos_token: null,
    chat_template: CHATML_TEMPLATE,
    clean_up_tokenization_spaces: false,
    eos_token: '<|im_end|>',
    errors: 'replace',
    model_max_length: modelMaxLength,
    pad_token: '<|endoftext|>',
    split_special_tokens: false,
    tokenizer_class: 'PreTrainedTokenizerFast',
    unk_token: null,
  };
}

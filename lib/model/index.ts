/** Model folders, weights, tokenizers and chat templates (see each module for details). */
export * from './arch';
export * from './safetensors';
export * from './hf-config';
export * from './tensors';
export * from './hf';
export * from './tokenizer';
export * from './chat';
export * from './byte-tokenizer';
export * from './create';

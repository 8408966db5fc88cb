/** Every workflow type the workers register: `rl`, `sft` and `eval`. */
export * from './rl';
export * from './sft';
export * from './eval';

/** Every workflow type the workers register: `rl` (and, with their issues, `sft` and `eval`). */
export * from './rl';

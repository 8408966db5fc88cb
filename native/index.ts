/**
 * TypeScript facade of the native libtorch engine (`build/native/Release/prime_native.node`): the
 * production entry points, one module per object as native/src/addon/ has them (model.ts,
 * generator.ts, trainer.ts, dist.ts; process.ts for process-wide settings). The rest of the code
 * base touches the addon only through this module; test-only entry points are apart
 * (checks.ts: kernel checks, registries, yardsticks; testing.ts: a checked generator, CacheBook).
 *
 * Every compute call (load, score, generation steps, training steps, checkpoints) runs on a libuv
 * worker thread and returns a Promise, so the Node event loop stays responsive. Calls on one model
 * (and on the generators/trainers created from it) are queued and run one at a time.
 */
export * from './dist';
export * from './engine-types.generated';
export * from './errors';
export * from './generator';
export * from './loss-kinds';
export * from './model';
export * from './model-binding';
export * from './process';
export * from './rows';
export * from './trainer';

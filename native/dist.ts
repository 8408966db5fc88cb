/**
 * Process groups over c10d (native/src/addon/dist_wrap.cc): the TCP store ranks rendezvous
 * through, the group (Gloo, and NCCL for CUDA tensors where the build has it) a trainer's
 * collectives run on, and broadcasts of raw buffers (weights to inference servers).
 */
import { loadAddon } from './addon';
import type { DistBackend } from './engine-types.generated';

/** A c10d TCPStore: rank 0 serves it, the other ranks connect (the trainer's rendezvous). */
export interface DistStoreOptions {
  host: string;
  /** 0 with isServer: any free port (see `port()`). */
  port: number;
  isServer?: boolean;
  /** A client gives up connecting after this long. */
  timeoutS: number;
}

export interface DistStore {
  set(key: string, value: string): Promise<void>;
  /** The value of `key`, or null when it is not set within `timeoutMs`; rejects when the store is gone. */
  get(key: string, timeoutMs: number): Promise<string | null>;
  add(key: string, delta: number): Promise<number>;
  port(): number;
}

export interface DistGroupOptions {
  /** Keys of this group in the store: a fresh prefix per group, so it never meets an older one's. */
  prefix: string;
  rank: number;
  size: number;
  /** Forming the group and every collective fail after this long without progress. */
  timeoutS: number;
  /** What moves CUDA tensors: NCCL (`auto` where the build has it) or Gloo; CPU tensors always go over Gloo. */
  backend?: DistBackend;
}

interface DistAddon {
  createStore(opts: DistStoreOptions): Promise<DistStore>;
  createGroup(store: DistStore, opts: DistGroupOptions): Promise<DistGroup>;
}
const addon = () => loadAddon<DistAddon>();

/** A process group (opaque: `Trainer.setGroup` uses it). */
export type DistGroup = { readonly __brand: 'DistGroup' };

/** Connects to (or, isServer, serves) a c10d TCP store. */
export function createStore(opts: DistStoreOptions): Promise<DistStore> {
  return addon().createStore(opts);
}

/** Joins a Gloo process group through `store`; resolves once all `size` ranks have joined. */
export function createGroup(store: DistStore, opts: DistGroupOptions): Promise<DistGroup> {
  return addon().createGroup(store, opts);
}

/**
 * Rank `root`'s bytes into every rank's `buffers`, in place (a collective: every rank of `group`
 * calls it with buffers of the same sizes, in the same order). In buckets of at most `bucketBytes`;
 * through device memory on a CUDA `device` (NCCL where the build has it), else over Gloo.
 */
export function broadcastBuffers(
  group: DistGroup,
  buffers: Buffer[],
  opts: { root: number; bucketBytes: number; device?: string },
): Promise<void> {
  return (
    group as unknown as { broadcast(b: Buffer[], root: number, bucket: number, device: string): Promise<void> }
  ).broadcast(buffers, opts.root, opts.bucketBytes, opts.device ?? 'cpu');
}

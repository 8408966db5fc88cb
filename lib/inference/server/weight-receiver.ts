/**
 * A server's side of the weight broadcast (`weight_broadcast.type = "nccl"`; the trainer's side:
 * lib/trainer/broadcast.ts). Trainer rank 0 drives it over HTTP: `/weights/join` makes the server
 * a member of a process group generation the trainer forms (on the trainer's store), and
 * `/weights/receive` takes one policy version into host buffers, unit by unit as the trainer sends
 * them, answering once all of it is here. `/update_weights` of that version then loads these
 * instead of reading its folder: the same bytes as the folder's model.safetensors, so the same
 * tokens. One version is kept; a receive that fails keeps none, and the folder serves. A group that
 * broke (the trainer died, a member timed out) is left behind: the trainer forms a new one.
 */
import * as path from 'node:path';
import type { z } from 'zod';
import * as native from '../../../native';
import type { ArchConfig, WeightTensor } from '../../model/arch';
import { DTYPE_BYTES, numel } from '../../model/safetensors';
import { checkModelTensors } from '../../model/tensors';
import { ApiError, type weightsJoinRequest, type weightsReceiveRequest } from '../protocol';

type JoinRequest = z.output<typeof weightsJoinRequest>;
type ReceiveRequest = z.output<typeof weightsReceiveRequest>;

/** A version received, waiting for its `/update_weights`. */
interface Staged {
  version: number;
  weightDir: string;
  tensors: WeightTensor[];
}

export class WeightReceiver {
  private member?: { generation: string; device: string; group: Promise<native.DistGroup> };
  private staged?: Staged;
  private receiving = false;

  constructor(private readonly arch: ArchConfig) {}

  /** Starts joining `req.generation` (in the background: the trainer forms the group meanwhile). */
  join(req: JoinRequest): void {
    if (req.device !== 'cpu' && !native.info().cuda)
      throw new ApiError(409, `device: ${req.device} asked for, and this server has no CUDA device`, 'device');
    const [host, port] = [req.store.slice(0, req.store.lastIndexOf(':')), Number(req.store.split(':').pop())];
    const group = (async () => {
      const store = await native.createStore({ host, port, timeoutS: req.timeout_s });
      return native.createGroup(store, {
        prefix: `${req.generation}/`,
        rank: req.rank,
        size: req.size,
        timeoutS: req.timeout_s,
      });
    })();
    group.catch(() => undefined); // reported by the receive that waits for it
    this.member = { generation: req.generation, device: req.device, group };
  }

  /** Receives a version from the current generation's rank 0; resolves once all of it is here. */
  async receive(req: ReceiveRequest): Promise<{ version: number; bytes: number }> {
    const member = this.member;
    if (member?.generation !== req.generation)
      throw new ApiError(
        409,
        `generation: this server is not a member of ${req.generation} (${member ? `it joined ${member.generation}` : 'it joined none'})`,
        'generation',
      );
    if (this.receiving) throw new ApiError(409, 'a receive is already under way', null, 'busy');
    // The units must be this model's tensors: nothing is allocated by a request of another model.
    const entries = req.units.flat();
    try {
      checkModelTensors(this.arch, entries, 'units');
    } catch (e) {
      throw new ApiError(400, `units: ${(e as Error).message}`, 'units');
    }
    this.receiving = true;
    this.staged = undefined;
    try {
      let group: native.DistGroup;
      try {
        group = await member.group;
      } catch (e) {
        throw new ApiError(503, `the weight broadcast group ${req.generation} was not formed: ${(e as Error).message}`);
      }
      const tensors: WeightTensor[] = [];
      let bytes = 0;
      for (const unit of req.units) {
        const received = unit.map((e) => ({
          ...e,
          data: Buffer.allocUnsafe(numel(e.shape) * DTYPE_BYTES[e.dtype]),
        }));
        try {
          await native.broadcastBuffers(
            group,
            received.map((t) => t.data),
            { root: 0, bucketBytes: req.bucket_bytes, device: member.device },
          );
        } catch (e) {
          if (this.member === member) this.member = undefined; // a broken group is never used again
          throw new ApiError(503, `the weight broadcast broke: ${(e as Error).message}`);
        }
        for (const t of received) bytes += t.data.length;
        tensors.push(...received);
      }
      // In the model's tensor order, as a folder's load gives them.
      this.staged = {
        version: req.version,
        weightDir: path.resolve(req.weight_dir),
        tensors: checkModelTensors(this.arch, tensors, 'received weights'),
      };
      return { version: req.version, bytes };
    } finally {
      this.receiving = false;
    }
  }

  /** The received tensors of `version` to be loaded as `weightDir`, once; undefined when not received. */
  take(version: number, weightDir: string): WeightTensor[] | undefined {
    const s = this.staged;
    if (!s || s.version !== version || s.weightDir !== path.resolve(weightDir)) return undefined;
    this.staged = undefined;
    return s.tensors;
  }
}

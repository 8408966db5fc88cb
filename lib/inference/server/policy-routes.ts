/**
 * The routes RL drives: token-in `/v1/generate`, and the policy the server serves: `/update_weights`
 * (a weight folder under a version label; its weights taken from a broadcast when one brought them:
 * `/weights/join` and `/weights/receive`, weight-receiver.ts) and `/reload_weights` (back to the
 * base model).
 */
import { randomUUID } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { FastifyInstance } from 'fastify';
import type { ArchConfig } from '../../model/arch';
import { sparseLayerCount } from '../../model/families';
import { HF_FIELDS } from '../../model/hf-config';
import { loadHfModelAsync, readHfConfig } from '../../model/hf';
import { SerialQueue } from '../../../native/serial';
import {
  ApiError,
  generateRequest,
  parseBody,
  updateWeightsRequest,
  weightsJoinRequest,
  weightsReceiveRequest,
} from '../protocol';
import { WeightReceiver } from './weight-receiver';
import { LazyArray, sendJson } from './json-body';
import { disconnectSignal, promptLogprobList, usage, type Served } from './served';

/** How `b` (`file`, a config.json) differs in shape from the served `a`, naming the field (undefined: the same). */
function sameShape(a: ArchConfig, b: ArchConfig, file: string): string | undefined {
  const flat = ({ moe, ...rest }: ArchConfig): Record<string, unknown> => ({ ...rest, ...moe });
  const [fa, fb] = [flat(a), flat(b)];
  for (const k of Object.keys(HF_FIELDS) as (keyof typeof HF_FIELDS)[]) {
    if (JSON.stringify(fa[k]) !== JSON.stringify(fb[k]))
      return `${file}: field '${HF_FIELDS[k]}' is ${JSON.stringify(fb[k])}, the served model has ${JSON.stringify(fa[k])}`;
  }
  return undefined;
}

/** Entries of the allowed roots looked at, at most, to find the other names of a hard-linked file. */
const MAX_LINK_SEARCH = 200_000;

/** A file of a weight folder with more than one name (hard links), and the names found inside the roots. */
interface Linked {
  shown: string;
  names: number;
  inside: number;
}

/**
 * The roots `/update_weights` may read from, and the one check of a weight folder against them.
 * A path outside the roots, one that does not exist and a symbolic link that leads out of them get
 * the same 403: a client learns nothing about paths outside the roots, neither whether they exist
 * nor any byte of them. A file with several names (hard links) is judged by where its names are:
 * the checkpoint trees `cp -al` and `rsync --link-dest` make have them all inside the roots, while
 * a name inside for a file outside would let the loader read it (and errors quote bytes); such a
 * refusal says what was found.
 */
class WeightRoots {
  /** Each root as given (resolved) and as its real path. */
  private readonly roots: string[];

  constructor(private readonly given: string[]) {
    this.roots = given.flatMap((r) => {
      try {
        return [r, fs.realpathSync(r)];
      } catch {
        return [r];
      }
    });
  }

  private inside(real: string): boolean {
    return this.roots.some((r) => real === r || real.startsWith(r.endsWith(path.sep) ? r : r + path.sep));
  }

  /** The roots, for messages. */
  private get shownRoots(): string {
    return `the allowed roots (${this.given.join(', ')})`;
  }

  private refusal(
    shown: string,
    why = `is outside ${this.shownRoots} or does not exist; a file linked from outside them counts as outside`,
  ): ApiError {
    return new ApiError(403, `weight_dir: ${shown} ${why}`, 'weight_dir', 'forbidden_path', 'permission_error');
  }

  /** The real path of folder `weightDir`, once it and every entry in it resolve inside the roots. */
  async check(weightDir: string): Promise<string> {
    let real: string;
    try {
      real = fs.realpathSync(path.resolve(weightDir));
    } catch {
      throw this.refusal(weightDir);
    }
    if (!this.inside(real)) throw this.refusal(weightDir);
    if (!fs.statSync(real).isDirectory())
      throw new ApiError(400, `weight_dir: ${weightDir} is not a folder`, 'weight_dir', 'invalid_model');
    const linked = new Map<string, Linked>();
    for (const name of fs.readdirSync(real)) {
      const shown = path.join(weightDir, name);
      let target: string;
      let st: fs.Stats;
      try {
        target = fs.realpathSync(path.join(real, name));
        st = fs.statSync(target);
      } catch {
        throw this.refusal(shown); // a dangling link: where it points must not be told either
      }
      if (!this.inside(target)) throw this.refusal(shown);
      if (!st.isDirectory() && st.nlink > 1) linked.set(`${st.dev}:${st.ino}`, { shown, names: st.nlink, inside: 0 });
    }
    if (linked.size > 0) {
      const searched = await this.countNames(linked);
      for (const f of linked.values())
        if (f.inside < f.names)
          throw this.refusal(
            f.shown,
            `has ${f.names} names (hard links), ${f.inside} of them ${searched < MAX_LINK_SEARCH ? '' : `(among the first ${searched} entries) `}inside ${this.shownRoots}: another name may be a file from outside them; copy the file, or link it from inside the roots`,
          );
    }
    return real;
  }

  /**
   * Counts the names of the `linked` files inside the roots (breadth first, links not followed;
   * done when all are found, or after MAX_LINK_SEARCH entries). Returns the entries looked at.
   */
  private async countNames(linked: Map<string, Linked>): Promise<number> {
    const realRoots = [...new Set(this.roots.filter((r) => fs.existsSync(r)).map((r) => fs.realpathSync(r)))];
    // A root inside another is searched with it.
    const queue = realRoots.filter((r) => !realRoots.some((o) => o !== r && r.startsWith(o + path.sep)));
    let missing = [...linked.values()].reduce((a, f) => a + f.names, 0);
    let searched = 0;
    while (queue.length > 0 && missing > 0 && searched < MAX_LINK_SEARCH) {
      const dir = queue.shift()!;
      let entries: fs.Dirent[];
      try {
        entries = await fs.promises.readdir(dir, { withFileTypes: true });
      } catch {
        continue; // unreadable: its names are not found
      }
      for (const e of entries) {
        if (++searched >= MAX_LINK_SEARCH) break;
        const full = path.join(dir, e.name);
        if (e.isDirectory()) queue.push(full);
        else if (e.isFile()) {
          const st = await fs.promises.lstat(full).catch(() => undefined);
          const f = st && st.nlink > 1 ? linked.get(`${st.dev}:${st.ino}`) : undefined;
          if (f) {
            f.inside++;
            missing--;
          }
        }
      }
    }
    return searched;
  }
}

/** Where the server's weights may come from. */
export interface WeightSources {
  /** The base model (version 0), and its real path. */
  baseDir: string;
  baseReal: string;
  /** Folders `/update_weights` may load from (resolved). */
  allowedRoots: string[];
  /** Each update's source: a broadcast, or the folder (the server's /metrics count them). */
  onWeightUpdate?: (source: 'broadcast' | 'filesystem') => void;
}

/** The RL routes on `served`. */
export function registerPolicyRoutes(
  app: FastifyInstance,
  served: Served,
  { baseDir, baseReal, allowedRoots, onWeightUpdate }: WeightSources,
): void {
  const { scheduler, arch } = served;

  app.post('/v1/generate', async (req, reply) => {
    const body = parseBody(generateRequest, req.body);
    served.checkModel(body.model);
    served.checkPrompt(body.prompt_token_ids, 'prompt_token_ids');
    const maxTokens = served.maxTokensFor(body.prompt_token_ids.length, body.max_tokens, 'max_tokens');
    if (body.return_routes && !arch.moe)
      throw new ApiError(400, `return_routes: ${arch.arch} has no MoE router`, 'return_routes', 'invalid_value');
    served.checkSampling(body, maxTokens);
    const signal = disconnectSignal(reply);
    const sampling = { ...body, stop_token_ids: body.stop_token_ids ?? null };
    const results = await served.start(
      Array.from({ length: body.n }, (_, i) =>
        served.engineRequest(
          body.prompt_token_ids,
          sampling,
          maxTokens,
          i,
          body.prompt_logprobs && i === 0,
          0,
          body.return_routes,
        ),
      ),
      // Stop strings are matched in the decoded text, so only then does the sequence need a tokenizer.
      body.stop?.length ? { signal, tokenizer: served.tokenizer, stopStrings: body.stop } : { signal },
    );
    return sendJson(reply, {
      id: `gen-${randomUUID()}`,
      model: served.modelName,
      policy_version: Math.min(...results.map((r) => r.policyVersion)),
      prompt_token_ids: body.prompt_token_ids,
      choices: results.map((r, index) => ({
        index,
        token_ids: r.tokenIds,
        logprobs: r.logprobs,
        // Weights may change between two decode steps while a sequence runs (in-flight updates):
        // the version that sampled each token.
        policy_versions: r.tokenPolicyVersions,
        finish_reason: r.finishReason,
        ...(body.return_routes ? { routes: new LazyArray(r.routes.length, (t) => Array.from(r.routes[t])) } : {}),
      })),
      usage: usage(body.prompt_token_ids.length, results),
      prompt_logprobs: body.prompt_logprobs ? promptLogprobList(results[0]) : null,
      ...(body.return_routes ? { prompt_routes: promptRoutesPerToken(results[0].promptRoutes, arch) } : {}),
    });
  });

  // The weight broadcast (weight_broadcast nccl): trainer rank 0 makes this server a member of its
  // group and sends it each version before it is loaded.
  const receiver = new WeightReceiver(arch);
  app.post('/weights/join', (req) => {
    const body = parseBody(weightsJoinRequest, req.body);
    receiver.join(body);
    return { status: 'joining', generation: body.generation };
  });
  app.post('/weights/receive', async (req) => {
    const received = await receiver.receive(parseBody(weightsReceiveRequest, req.body));
    return { status: 'ok', ...received };
  });

  /** Version label -> the folder (real path) it names, since start or the last /reload_weights. */
  const labels = new Map<number, string>([[0, baseReal]]);
  const roots = new WeightRoots(allowedRoots);

  // Weight changes run one at a time: each reads the version labels, loads (without blocking the
  // event loop: the server keeps serving meanwhile) and then records its label.
  const weightChanges = new SerialQueue();

  app.post('/update_weights', (req) =>
    weightChanges.run(async () => {
      const body = parseBody(updateWeightsRequest, req.body);
      const real = await roots.check(body.weight_dir);
      // A version names one set of weights: clients skip loading when /health already shows the
      // version they want, so a wrong label silently serves wrong weights. 0 is the base model's,
      // and since start (or the last reload) a label stays with its folder and a folder with its
      // label. Labels may go down: rl evaluates step n, then samples with n - async_level.
      const version = body.version ?? scheduler.policy.version + 1;
      if (version === 0 && real !== baseReal) {
        throw new ApiError(
          400,
          `version: 0 is the base model's version (${baseDir}); ${body.weight_dir} needs a version >= 1`,
          'version',
          'invalid_version',
        );
      }
      const labelled = labels.get(version);
      if (labelled !== undefined && labelled !== real) {
        throw new ApiError(
          409,
          `version: ${version} already names the weights in ${labelled}; ${body.weight_dir} needs its own version (or POST /reload_weights to start a new lineage)`,
          'version',
          'version_conflict',
        );
      }
      const earlier = [...labels].find(([v, dir]) => dir === real && v !== version);
      if (earlier) {
        throw new ApiError(
          409,
          `version: ${body.weight_dir} was loaded as version ${earlier[0]}; the same weights cannot also be version ${version}`,
          'version',
          'version_conflict',
        );
      }
      const unloadable = (e: unknown) =>
        new ApiError(
          400,
          `weight_dir: not a loadable model folder: ${(e as Error).message}`,
          'weight_dir',
          'invalid_model',
        );
      // The folder's config.json is checked against the served model before anything is read by
      // it (readHfConfig has checked its sizes against its files): nothing is allocated for a
      // folder of another model, or of a config claiming 10^7 blocks.
      let config: ArchConfig;
      try {
        config = readHfConfig(real).config;
      } catch (e) {
        throw unloadable(e);
      }
      const mismatch = sameShape(arch, config, path.join(body.weight_dir, 'config.json'));
      if (mismatch)
        throw new ApiError(400, `weight_dir: not the same model shape: ${mismatch}`, 'weight_dir', 'shape_mismatch');
      // The version's bytes from the broadcast that brought them, else from the folder.
      let tensors = receiver.take(version, body.weight_dir);
      const source = tensors ? 'broadcast' : 'filesystem';
      try {
        tensors ??= (await loadHfModelAsync(real)).tensors;
      } catch (e) {
        throw unloadable(e);
      }
      await scheduler.updateWeights(tensors, { version, weightDir: real });
      labels.set(version, real);
      onWeightUpdate?.(source);
      return { status: 'ok', policy_version: version, weight_dir: real, source };
    }),
  );

  app.post('/reload_weights', () =>
    weightChanges.run(async () => {
      let loaded;
      try {
        loaded = await loadHfModelAsync(baseDir);
      } catch (e) {
        throw new ApiError(
          500,
          `the base model folder ${baseDir} can no longer be loaded: ${(e as Error).message}`,
          null,
          'base_model_unreadable',
          'server_error',
        );
      }
      const mismatch = sameShape(arch, loaded.config, path.join(baseDir, 'config.json'));
      if (mismatch)
        throw new ApiError(
          500,
          `the base model folder ${baseDir} changed shape since the server started: ${mismatch}`,
          null,
          'base_model_changed',
          'server_error',
        );
      await scheduler.updateWeights(loaded.tensors, { version: 0, weightDir: baseDir });
      labels.clear();
      labels.set(0, baseReal);
      return { status: 'ok', policy_version: 0, weight_dir: baseDir };
    }),
  );
}

/** The prefill's routes [P - 1, sparse layers, K] (flattened) as one array per prompt token. */
function promptRoutesPerToken(routes: Int32Array | undefined, a: ArchConfig): LazyArray<number[]> {
  const width = sparseLayerCount(a.moe, a.numLayers) * a.moe!.numExpertsPerTok;
  const tokens = routes ? routes.length / width : 0;
  return new LazyArray(tokens, (t) => Array.from(routes!.subarray(t * width, (t + 1) * width)));
}

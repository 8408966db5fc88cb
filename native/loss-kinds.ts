/**
 * The native loss registry (native/src/loss_registry.cc) on the TS side: loss names, which are
 * policy losses, and their parameters, derived from `loss-kinds.generated.ts` (a copy of the
 * addon's `lossKinds()`, checked against it by test/loss.registry.test.ts; `npm run
 * gen:loss-kinds` rewrites it). Plain data: importing it does not load the addon.
 */
import { LOSS_KINDS } from './loss-kinds.generated';

export { LOSS_KINDS };

export interface LossParamSpec {
  /** The config key under trainer.loss, and the key in native LossConfig.params. */
  name: string;
  default: number;
  /** Inclusive bounds; no max = unbounded. */
  min: number;
  max?: number;
  doc: string;
}

export interface LossKindSpec {
  name: string;
  /** Needs advantages and inference logprobs (every kind but SFT's cross-entropy). */
  policy: boolean;
  doc: string;
  params: readonly LossParamSpec[];
}

type Kinds = (typeof LOSS_KINDS)[number];
export type LossKindName = Kinds['name'];
export type PolicyLossName = Extract<Kinds, { policy: true }>['name'];
export type LossParamName = Kinds['params'][number]['name'];

const kinds: readonly LossKindSpec[] = LOSS_KINDS;

/** The policy losses, in registry order (the values of trainer.loss.type). */
export const POLICY_LOSSES = kinds.filter((k) => k.policy).map((k) => k.name) as [PolicyLossName, ...PolicyLossName[]];

/** A kind's spec; throws naming the supported kinds. */
export function lossKindSpec(name: string): LossKindSpec {
  const k = kinds.find((x) => x.name === name);
  if (!k) throw new Error(`unknown loss kind '${name}' (supported: ${kinds.map((x) => x.name).join(', ')})`);
  return k;
}

/**
 * Every parameter once, with the kinds that use it. A parameter shared by several kinds (eps_high)
 * is one config key, so its spec must be the same everywhere: checked here, at load.
 */
export const LOSS_PARAMS: ReadonlyMap<LossParamName, LossParamSpec & { kinds: LossKindName[] }> = (() => {
  const out = new Map<LossParamName, LossParamSpec & { kinds: LossKindName[] }>();
  for (const k of kinds)
    for (const p of k.params) {
      const seen = out.get(p.name as LossParamName);
      if (!seen) out.set(p.name as LossParamName, { ...p, kinds: [k.name as LossKindName] });
      else if (seen.default !== p.default || seen.min !== p.min || seen.max !== p.max)
        throw new Error(`loss parameter '${p.name}' is declared differently by '${seen.kinds[0]}' and '${k.name}'`);
      else seen.kinds.push(k.name as LossKindName);
    }
  return out;
})();

/**
 * The loss registry: the TS copy (native/loss-kinds.generated.ts) equals the addon's registry, and
 * the config schema of trainer.loss is derived from it (names, defaults, ranges, which kind owns
 * which key). `npm run gen:loss-kinds` (UPDATE_LOSS_KINDS=1) rewrites the copy.
 */
import * as fs from 'fs';
import * as path from 'path';
import { LOSS_KINDS, LOSS_PARAMS, POLICY_LOSSES } from '../native';
import { lossKinds } from '../native/checks';
import { rlSchema } from '../lib/config/schemas';

const GENERATED = path.join(__dirname, '..', 'native', 'loss-kinds.generated.ts');

function render(kinds: unknown): string {
  return `// Generated from the native loss registry by \`npm run gen:loss-kinds\`: do not edit.\nexport const LOSS_KINDS = ${JSON.stringify(kinds, null, 2)} as const;\n`;
}

test('loss-kinds.generated.ts is the addon registry', () => {
  const native = lossKinds();
  if (process.env.UPDATE_LOSS_KINDS) fs.writeFileSync(GENERATED, render(native));
  // Compared as data (a formatter may restyle the file). On a mismatch: npm run gen:loss-kinds.
  expect(LOSS_KINDS).toEqual(native);
  // Names once each, sorted by name whatever the link order of the units that register them; SFT's
  // cross-entropy is the one loss that is not a policy loss.
  const names = LOSS_KINDS.map((k) => k.name);
  expect(names).toEqual([...new Set(names)].sort());
  expect(LOSS_KINDS.filter((k) => !k.policy).map((k) => k.name)).toEqual(['ce']);
});

const model = { name: 'm' };
const parse = (loss: Record<string, unknown>) =>
  rlSchema.safeParse({ trainer: { model, loss }, orchestrator: { model }, inference: { model } });
const issues = (loss: Record<string, unknown>) => {
  const r = parse(loss);
  expect(r.success).toBe(false);
  return r.error!.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('\n');
};

describe('trainer.loss schema from the registry', () => {
  test('type: the policy losses, dppo by default, with its parameters filled from the registry', () => {
    expect(POLICY_LOSSES).toEqual(LOSS_KINDS.filter((k) => k.name !== 'ce').map((k) => k.name));
    const r = parse({});
    expect(r.success).toBe(true);
    const loss = r.data!.trainer.loss as Record<string, unknown>;
    expect(loss.type).toBe('dppo');
    expect(loss).toMatchObject({ dppo_mask_low: 0.2, dppo_mask_high: 0.2, adv_tau: 1, kl_tau: 1e-3 });
    // Parameters of other kinds stay unset.
    expect(loss.eps_low).toBeUndefined();
    expect(loss.ipo_threshold).toBeUndefined();
    expect(parse({ type: 'grpo' }).data!.trainer.loss).toMatchObject({ type: 'grpo', eps_low: 0.2, eps_high: 0.28 });
    expect(parse({ type: 'ipo', ipo_threshold: 0.3 }).data!.trainer.loss).toMatchObject({
      ipo_threshold: 0.3,
      kl_tau: 1e-3,
    });
    expect(issues({ type: 'ce' })).toMatch(/^trainer\.loss\.type: /);
  });

  test('a parameter of another kind, or out of range, is an error naming the key', () => {
    expect(issues({ type: 'dppo', eps_low: 0.1 })).toMatch(
      /trainer\.loss\.eps_low: .*'dppo'.*dppo_mask_low, dppo_mask_high, adv_tau, kl_tau/,
    );
    expect(issues({ type: 'cispo', eps_low: 0.1 })).toMatch(/trainer\.loss\.eps_low: /);
    expect(issues({ type: 'grpo', eps_low: 1.5 })).toMatch(/trainer\.loss\.eps_low: /);
    expect(issues({ dppo_mask_high: -0.1 })).toMatch(/trainer\.loss\.dppo_mask_high: /);
  });

  test('kl_beta is gone: the error names trainer.kl_penalty', () => {
    expect(issues({ kl_beta: 0.01 })).toMatch(/trainer\.loss\.kl_beta: .*trainer\.kl_penalty/);
    expect(parse({ kl_beta: 0 }).data!.trainer.loss).not.toHaveProperty('kl_beta'); // the old default: off
  });

  test('a shared parameter has one spec; every parameter is a schema key with its range', () => {
    expect(LOSS_PARAMS.get('eps_high')!.kinds).toEqual(['cispo', 'grpo', 'gspo']);
    expect(LOSS_PARAMS.get('kl_tau')!.kinds).toEqual(['dppo', 'ipo']);
    for (const [name, p] of LOSS_PARAMS) {
      const kind = p.kinds[0];
      expect(parse({ type: kind, [name]: p.min }).success).toBe(true);
      expect(issues({ type: kind, [name]: p.min - 1 })).toContain(`trainer.loss.${name}: `);
      if (p.max !== undefined) expect(issues({ type: kind, [name]: p.max + 1 })).toContain(`trainer.loss.${name}: `);
    }
  });
});

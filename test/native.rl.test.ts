/**
 * Native RL training: the policy losses against an independent TS implementation (values and
 * d loss / d logp), on-policy GRPO == REINFORCE on a real model, LoRA, and bitwise resume.
 */
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import {
  setThreads,
  type LossConfig,
  type NativeModel,
  type Trainer,
  type TrainRow,
  type WeightTensor,
} from '../native';
import { lossKinds, policyLoss, type PolicyLossInputs } from '../native/checks';
import { loadModel } from '../lib/model/engine';
import { decode, packRow, randomTokens, randomWeights, tinyConfig } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';

setThreads(2);

// ------------------------------------------------------------------------------------------------
// Reference implementation: plain per-token arithmetic with hand-derived gradients.

interface Reference {
  loss: number;
  grad: number[];
  clippedLow: number;
  clippedHigh: number;
  maskedTokens: number;
  maskedLow: number;
  maskedHigh: number;
  maskedAdvPositive: number;
  maskedAdvNegative: number;
  maskedMismatchKl: number; // sum over masked tokens
  maskedSamples: number;
  mismatchKl: number;
  referenceKl: number;
  lossTokens: number;
  samples: number;
}

function reference(x: Required<Omit<PolicyLossInputs, 'ceWeights'>>, cfg: LossConfig): Reference {
  const kind = cfg.kind ?? 'ce',
    T = x.logp.length;
  const P = {
    eps_low: 0.2,
    eps_high: 0.28,
    dppo_mask_low: 0.2,
    dppo_mask_high: 0.2,
    ipo_threshold: 0.1,
    adv_tau: 1,
    kl_tau: 1e-3,
    ...cfg.params,
  };
  const epsLow = P.eps_low,
    epsHigh = P.eps_high,
    beta = cfg.klBeta ?? 0;
  const lo = 1 - epsLow,
    hi = 1 + epsHigh;
  const clip = (v: number) => Math.min(Math.max(v, lo), hi);
  const mm = { mode: 'none', tisCap: 2, tokenLow: 0.125, tokenHigh: 8, seqLow: 0.1, seqHigh: 10, ...cfg.mismatch };
  const m = Array.from(x.lossMask as ArrayLike<number | boolean>, (v) => (v ? 1 : 0));
  const sampleOf: number[] = x.sampleLengths.flatMap((n, i) => Array<number>(n).fill(i));
  const S = x.sampleLengths.length;
  const n = Array<number>(S).fill(0),
    seqLr = Array<number>(S).fill(0),
    seqA = Array<number>(S).fill(0);
  const lr = Array.from({ length: T }, (_, t) => (m[t] ? x.logp[t] - x.mu[t] : 0));
  for (let t = 0; t < T; t++) {
    n[sampleOf[t]] += m[t];
    seqLr[sampleOf[t]] += lr[t];
    seqA[sampleOf[t]] += m[t] * x.advantages[t];
  }
  for (let i = 0; i < S; i++) {
    seqLr[i] /= Math.max(n[i], 1);
    seqA[i] /= Math.max(n[i], 1);
  }
  const lossTokens = m.reduce((a: number, b) => a + b, 0),
    samples = n.filter((v) => v > 0).length;
  const norm = (cfg.normalization ?? 'token') === 'token' ? lossTokens : samples;
  // coef[t]: d loss / d (token t's term).
  const coef = Array.from({ length: T }, (_, t) =>
    !m[t] ? 0 : (cfg.normalization ?? 'token') === 'token' ? 1 / norm : 1 / (n[sampleOf[t]] * norm),
  );
  const out: Reference = {
    loss: 0,
    grad: Array<number>(T).fill(0),
    clippedLow: 0,
    clippedHigh: 0,
    maskedTokens: 0,
    maskedLow: 0,
    maskedHigh: 0,
    maskedAdvPositive: 0,
    maskedAdvNegative: 0,
    maskedMismatchKl: 0,
    maskedSamples: 0,
    mismatchKl: 0,
    referenceKl: 0,
    lossTokens,
    samples,
  };
  const keepSeq = seqLr.map(
    (v) => kind === 'ce' || mm.mode !== 'mask' || (Math.exp(v) >= mm.seqLow && Math.exp(v) <= mm.seqHigh),
  );
  out.maskedSamples = keepSeq.filter((k, i) => !k && n[i] > 0).length;
  // gspo's per-sample loss and its derivative w.r.t. each of the sample's logps.
  const seqLoss = Array<number>(S).fill(0),
    seqDeriv = Array<number>(S).fill(0);
  for (let i = 0; i < S; i++) {
    const s = Math.exp(seqLr[i]);
    const clipped = (seqA[i] > 0 && s > hi) || (seqA[i] < 0 && s < lo);
    seqLoss[i] = -seqA[i] * (clipped ? clip(s) : s);
    seqDeriv[i] = clipped ? 0 : (-seqA[i] * s) / Math.max(n[i], 1);
    if (kind === 'gspo' && clipped) s > hi ? (out.clippedHigh += n[i]) : (out.clippedLow += n[i]);
  }
  const seqWeightedCoef = Array<number>(S).fill(0); // sum over a sample's tokens of coef * weight
  for (let t = 0; t < T; t++) {
    if (!m[t]) continue;
    const r = Math.exp(lr[t]),
      A = x.advantages[t],
      i = sampleOf[t];
    if (kind !== 'ce') out.mismatchKl += (r - lr[t] - 1) / lossTokens;
    let w = 1;
    let low = false,
      high = false; // dropped for a ratio / probability that fell / rose too far
    if (kind !== 'ce' && mm.mode === 'tis') w = Math.min(r, mm.tisCap);
    if (kind !== 'ce' && mm.mode === 'mask') {
      w = r >= mm.tokenLow && r <= mm.tokenHigh && keepSeq[i] ? 1 : 0;
      low = r < mm.tokenLow;
      high = r > mm.tokenHigh;
    }
    let l: number, g: number;
    let klLoss = 0,
      klGrad = 0; // dppo / ipo: the kl_tau term, which the mismatch weight w leaves alone
    if (kind === 'dppo' || kind === 'ipo') {
      // Trust region on d = p - p_inference; -keep adv_tau A r + kl_tau (log r)^2.
      const d = Math.exp(x.logp[t]) - Math.exp(x.mu[t]);
      const dropLow = kind === 'dppo' ? A <= 0 && d < -P.dppo_mask_low : d < -P.ipo_threshold;
      const dropHigh = kind === 'dppo' ? A > 0 && d > P.dppo_mask_high : d > P.ipo_threshold;
      low ||= dropLow;
      high ||= dropHigh;
      const keep = dropLow || dropHigh ? 0 : 1;
      l = -keep * P.adv_tau * A * r;
      g = -keep * P.adv_tau * A * r;
      klLoss = P.kl_tau * lr[t] ** 2;
      klGrad = 2 * P.kl_tau * lr[t];
    } else if (kind === 'ce') {
      l = -x.logp[t];
      g = -1;
    } else if (kind === 'grpo') {
      const clippedHigh = A > 0 && r > hi,
        clippedLow = A < 0 && r < lo;
      out.clippedHigh += +clippedHigh;
      out.clippedLow += +clippedLow;
      l = -A * (clippedHigh || clippedLow ? clip(r) : r);
      g = clippedHigh || clippedLow ? 0 : -A * r;
    } else if (kind === 'cispo') {
      if (r > hi) out.clippedHigh++;
      l = -Math.min(r, hi) * A * x.logp[t];
      g = -Math.min(r, hi) * A;
    } else if (kind === 'gspo') {
      l = seqLoss[i];
      g = 0;
      seqWeightedCoef[i] += coef[t] * w;
    } else {
      throw new Error(`no reference for loss kind '${kind}': add its case to reference()`);
    }
    if (w === 0 || low || high) {
      out.maskedTokens++;
      out.maskedLow += +low;
      out.maskedHigh += +high;
      out.maskedAdvPositive += +(A > 0);
      out.maskedAdvNegative += +(A < 0);
      out.maskedMismatchKl += r - lr[t] - 1;
    }
    out.loss += coef[t] * (w * l + klLoss);
    out.grad[t] += coef[t] * (w * g + klGrad);
    if (beta > 0) {
      const d = x.refLogp[t] - x.logp[t];
      out.loss += coef[t] * beta * (Math.exp(d) - d - 1);
      out.grad[t] += coef[t] * beta * (1 - Math.exp(d));
      out.referenceKl += (Math.exp(d) - d - 1) / lossTokens;
    }
  }
  if (kind === 'gspo')
    for (let t = 0; t < T; t++) if (m[t]) out.grad[t] += seqWeightedCoef[sampleOf[t]] * seqDeriv[sampleOf[t]];
  return out;
}

// Three samples whose log ratios hit every case: inside the clip range, above and below it (with
// positive and negative advantages), a token outside the mask bounds on each side, and a sample
// whose geometric-mean ratio is outside [0.1, 10].
const sampleLengths = [5, 4, 3];
const lossMask = [0, 1, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1];
const logRatio = [0, 0.5, -0.5, 0.05, 2.5, 0, -0.5, 0.3, -3, 0, 2.4, 2.4];
const advantages = [0, 1, 1, -1, 0.5, 0, -0.5, -0.5, -0.5, 0, 2, 2];
const logp = [-1.1, -2.0, -0.7, -1.3, -0.2, -3.0, -0.9, -1.7, -0.4, -2.2, -0.6, -1.05];
const inputs: Required<Omit<PolicyLossInputs, 'ceWeights'>> = {
  logp,
  mu: logp.map((v, t) => v - logRatio[t]),
  advantages,
  lossMask,
  sampleLengths,
  refLogp: logp.map((v, t) => v + 0.3 * Math.sin(t)),
};

describe('policy losses vs hand computation', () => {
  // Every kind of the registry: a new loss fails here until reference() has its case.
  const kinds = lossKinds();
  const nonDefault: Record<string, LossConfig['params']> = {
    dppo: { kl_tau: 0.05 },
    grpo: { eps_high: 0.25 },
    gspo: { eps_high: 0.25 },
    cispo: { eps_high: 0.25 },
  };
  const cases: LossConfig[] = [];
  for (const { name, policy } of kinds)
    for (const mode of policy ? (['none', 'tis', 'mask'] as const) : (['none'] as const))
      for (const normalization of ['token', 'sequence'] as const)
        for (const klBeta of [0, 0.05])
          cases.push({
            kind: name as LossConfig['kind'],
            normalization,
            klBeta,
            params: nonDefault[name] ?? {},
            mismatch: { mode },
          });

  test('the cases cover the losses the issue names', () => {
    expect(kinds.map((k) => k.name)).toEqual(expect.arrayContaining(['ce', 'dppo', 'ipo', 'grpo', 'gspo', 'cispo']));
  });

  test.each(cases.map((c) => [`${c.kind} ${c.mismatch!.mode} ${c.normalization} beta=${c.klBeta}`, c]))(
    '%s',
    (_, cfg) => {
      const got = policyLoss(inputs, cfg as LossConfig);
      const want = reference(inputs, cfg as LossConfig);
      expect(got.loss).toBeCloseTo(want.loss, 12);
      got.gradLogp.forEach((g, t) => expect(g).toBeCloseTo(want.grad[t], 12));
      const M = got.metrics;
      expect(M.loss_tokens).toBe(9);
      expect(M.loss_samples).toBe(3);
      expect(M.clipped).toBeCloseTo((want.clippedLow + want.clippedHigh) / 9, 12);
      expect(M.masked_tokens).toBeCloseTo(want.maskedTokens / 9, 12);
      expect(M.masked_low).toBeCloseTo(want.maskedLow / 9, 12);
      expect(M.masked_high).toBeCloseTo(want.maskedHigh / 9, 12);
      const masked = Math.max(want.maskedTokens, 1);
      expect(M.masked_adv_positive).toBeCloseTo(want.maskedAdvPositive / masked, 12);
      expect(M.masked_adv_negative).toBeCloseTo(want.maskedAdvNegative / masked, 12);
      expect(M.mismatch_kl_masked).toBeCloseTo(want.maskedMismatchKl / masked, 12);
      expect(M.mismatch_kl_unmasked).toBeCloseTo(
        (want.mismatchKl * 9 - want.maskedMismatchKl) / Math.max(9 - want.maskedTokens, 1),
        12,
      );
      expect(M.masked_sequences).toBeCloseTo(want.maskedSamples / 3, 12);
      expect(M.mismatch_kl).toBeCloseTo(want.mismatchKl, 12);
      expect(M.kl_divergence).toBeCloseTo(want.referenceKl, 12);
    },
  );

  test('the vectors exercise both clip sides and every masking rule', () => {
    const grpo = reference(inputs, { kind: 'grpo' });
    expect(grpo.clippedLow).toBeGreaterThan(0);
    expect(grpo.clippedHigh).toBeGreaterThan(0);
    const gspo = reference(inputs, { kind: 'gspo' });
    expect(gspo.clippedHigh).toBeGreaterThan(0);
    const mask = reference(inputs, { kind: 'grpo', mismatch: { mode: 'mask' } });
    expect(mask.maskedSamples).toBe(1); // sample 2: geometric-mean ratio e^2.4 > 10
    expect(mask.maskedTokens).toBe(2 + 2); // r = e^2.5 > 8, r = e^-3 < 0.125, and sample 2's tokens
    const tis = reference(inputs, { kind: 'grpo', mismatch: { mode: 'tis' } });
    expect(tis.maskedTokens).toBe(0);
    // dppo: tokens 4, 10, 11 rose past 0.2 with A > 0; 6 and 8 fell past it with A < 0; token 2
    // fell by 0.32 but has A > 0, so only ipo (|d| > 0.1 either way) drops it.
    const dppo = reference(inputs, { kind: 'dppo' });
    expect([dppo.maskedHigh, dppo.maskedLow, dppo.maskedAdvPositive, dppo.maskedAdvNegative]).toEqual([3, 2, 3, 2]);
    const ipo = reference(inputs, { kind: 'ipo' });
    expect(ipo.maskedLow).toBeGreaterThan(dppo.maskedLow);
    expect(ipo.maskedAdvPositive).toBeGreaterThan(dppo.maskedAdvPositive);
  });

  test('the cross-entropy component beside any policy loss: sum of w (-logp) over its tokens / their count, by hand', () => {
    // Three tokens of one sample: token 0 a policy token, tokens 1 and 2 echo's observations
    // (mask 0) at weights 0.5 and 0.25; token 0 also carries a ce weight of 1 (sft's teacher
    // tokens are ce-only; a token may be in both components).
    const x = {
      logp: [-1, -2, -4],
      mu: [-1, -2, -4],
      advantages: [0.5, 0, 0],
      lossMask: [1, 0, 0],
      sampleLengths: [3],
    };
    const ceWeights = [1, 0.5, 0.25];
    for (const kind of ['dppo', 'grpo', 'ce'] as const) {
      const without = policyLoss(x, { kind });
      const got = policyLoss({ ...x, ceWeights }, { kind });
      // ce = (1 * 1 + 0.5 * 2 + 0.25 * 4) / 3 tokens = 1; d/dlogp = -w / 3.
      expect(got.loss - without.loss).toBeCloseTo(1, 14);
      [-1 / 3, -0.5 / 3, -0.25 / 3].forEach((g, t) => expect(got.gradLogp[t] - without.gradLogp[t]).toBeCloseTo(g, 14));
      expect(got.metrics).toMatchObject({ ce_tokens: 3, loss_tokens: 1 });
      expect(got.metrics.ce_loss).toBeCloseTo(1, 14);
      expect(got.metrics.ce_nll).toBeCloseTo((1 + 2 + 4) / 3, 14);
      expect(without.metrics).toMatchObject({ ce_tokens: 0, ce_loss: 0 });
    }
    // A weight of 0 is no ce token (not counted in the normaliser).
    const two = policyLoss({ ...x, ceWeights: [0, 0.5, 0.25] }, { kind: 'dppo' });
    expect(two.metrics.ce_tokens).toBe(2);
    expect(two.metrics.ce_loss).toBeCloseTo((0.5 * 2 + 0.25 * 4) / 2, 14);
  });

  test('single tokens, by hand', () => {
    const one = (lr: number, A: number, cfg: LossConfig) =>
      policyLoss({ logp: [-1], mu: [-1 - lr], advantages: [A], lossMask: [1], sampleLengths: [1] }, cfg);
    const r = Math.exp(0.5);
    // A > 0, r above 1 + eps_high (default 0.28): the clipped (constant) branch, no gradient.
    expect(one(0.5, 2, { kind: 'grpo' }).loss).toBeCloseTo(-2 * 1.28, 14);
    expect(one(0.5, 2, { kind: 'grpo' }).gradLogp[0]).toBe(0);
    // A < 0, r above: min picks r A, gradient -A r.
    expect(one(0.5, -2, { kind: 'grpo' }).loss).toBeCloseTo(2 * r, 14);
    expect(one(0.5, -2, { kind: 'grpo' }).gradLogp[0]).toBeCloseTo(2 * r, 14);
    // A < 0, r below 1 - eps: clipped.
    expect(one(-0.5, -2, { kind: 'grpo' }).loss).toBeCloseTo(2 * 0.8, 14);
    expect(one(-0.5, -2, { kind: 'grpo' }).gradLogp[0]).toBe(0);
    // DAPO clip-higher: r = e^0.24 = 1.271 is inside with eps_high 0.28 but clipped with 0.2.
    expect(one(0.24, 1, { kind: 'grpo' }).gradLogp[0]).toBeCloseTo(-Math.exp(0.24), 14);
    expect(one(0.24, 1, { kind: 'grpo', params: { eps_high: 0.2 } }).gradLogp[0]).toBe(0);
    // CISPO keeps the gradient with a clipped, detached weight: -min(r, 1.2) A logp.
    expect(one(0.5, 2, { kind: 'cispo', params: { eps_high: 0.2 } }).loss).toBeCloseTo(-1.2 * 2 * -1, 14);
    expect(one(0.5, 2, { kind: 'cispo', params: { eps_high: 0.2 } }).gradLogp[0]).toBeCloseTo(-1.2 * 2, 14);
    // dppo (logp = -1, p = 0.368): lr = 0.5 gives d = p (1 - e^-0.5) = 0.145, inside 0.2: the
    // ratio term -A r and kl_tau (lr)^2, gradient -A r + 2 kl_tau lr.
    expect(one(0.5, 2, { kind: 'dppo' }).loss).toBeCloseTo(-2 * r + 1e-3 * 0.25, 14);
    expect(one(0.5, 2, { kind: 'dppo' }).gradLogp[0]).toBeCloseTo(-2 * r + 2e-3 * 0.5, 14);
    // lr = 1: d = 0.233 > 0.2 with A > 0: masked, only the KL term (and its gradient) is left.
    expect(one(1, 2, { kind: 'dppo' }).loss).toBeCloseTo(1e-3, 14);
    expect(one(1, 2, { kind: 'dppo' }).gradLogp[0]).toBeCloseTo(2e-3, 14);
    expect(one(1, 2, { kind: 'dppo' }).metrics).toMatchObject({
      masked_tokens: 1,
      masked_high: 1,
      masked_low: 0,
      masked_adv_positive: 1,
    });
    // The same rise with A < 0 is kept (dppo only guards the direction the advantage pushes)...
    expect(one(1, -2, { kind: 'dppo' }).loss).toBeCloseTo(2 * Math.E + 1e-3, 14);
    // ...but ipo's symmetric region drops it; adv_tau and kl_tau scale the two terms.
    expect(one(1, -2, { kind: 'ipo', params: { kl_tau: 0.5 } }).loss).toBeCloseTo(0.5, 14);
    expect(one(0.05, -2, { kind: 'ipo', params: { adv_tau: 0.5 } }).loss).toBeCloseTo(
      Math.exp(0.05) + 1e-3 * 0.0025,
      14,
    );
    // TIS: loss times min(r, cap); the weight is detached.
    expect(one(-0.5, 1, { kind: 'grpo', mismatch: { mode: 'tis', tisCap: 2 } }).loss).toBeCloseTo(
      -Math.exp(-0.5) * Math.exp(-0.5),
      14,
    );
    // dppo with TIS: only the ratio term takes the weight w = min(r, cap); the KL term does not.
    // lr = -0.2: d = e^-1 - e^-0.8 = -0.081, inside the trust region; A = -2.
    const rl = Math.exp(-0.2);
    const dppoTis = one(-0.2, -2, { kind: 'dppo', mismatch: { mode: 'tis', tisCap: 2 } });
    expect(dppoTis.loss).toBeCloseTo(rl * 2 * rl + 1e-3 * 0.04, 14);
    expect(dppoTis.gradLogp[0]).toBeCloseTo(rl * 2 * rl + 2e-3 * -0.2, 14);
    // dppo with the mismatch mask: r = e^2.5 > token_high 8 drops the token's ratio term (which
    // dppo's own region keeps: a rise with A < 0), and the KL term (and its gradient) stays.
    const dppoMask = one(2.5, -1, { kind: 'dppo', mismatch: { mode: 'mask' } });
    expect(dppoMask.loss).toBeCloseTo(1e-3 * 6.25, 14);
    expect(dppoMask.gradLogp[0]).toBeCloseTo(2e-3 * 2.5, 14);
    expect(dppoMask.metrics.masked_tokens).toBe(1);
    // k3 KL: exp(d) - d - 1 with d = ref - logp; gradient 1 - exp(d).
    const kl = policyLoss(
      { logp: [-1], refLogp: [-1.5], lossMask: [1], sampleLengths: [1] },
      { kind: 'ce', klBeta: 0.5 },
    );
    expect(kl.loss).toBeCloseTo(1 + 0.5 * (Math.exp(-0.5) + 0.5 - 1), 14);
    expect(kl.gradLogp[0]).toBeCloseTo(-1 + 0.5 * (1 - Math.exp(-0.5)), 14);
  });

  test('normalisers: masked tokens still count; a given normalizer replaces the count', () => {
    const masked = policyLoss(inputs, { kind: 'grpo', mismatch: { mode: 'mask' } });
    const sum = policyLoss(inputs, { kind: 'grpo', mismatch: { mode: 'mask' }, normalizer: 1 });
    expect(masked.loss * 9).toBeCloseTo(sum.loss, 12); // 9 loss tokens, 4 of them masked
    const seq = policyLoss(inputs, { kind: 'ce', normalization: 'sequence', normalizer: 6 });
    const seqOwn = policyLoss(inputs, { kind: 'ce', normalization: 'sequence' });
    expect(seq.loss * 6).toBeCloseTo(seqOwn.loss * 3, 12);
  });

  test('bad configs', () => {
    expect(() => policyLoss(inputs, { kind: 'ppo' as 'ce' })).toThrow(
      `unknown loss kind 'ppo' (supported: ${lossKinds()
        .map((k) => k.name)
        .join(', ')})`,
    );
    expect(() => policyLoss(inputs, { kind: 'dppo', params: { eps_low: 0.1 } })).toThrow(
      /loss 'dppo' has no parameter 'eps_low' \(its parameters: dppo_mask_low, dppo_mask_high, adv_tau, kl_tau\)/,
    );
    expect(() => policyLoss(inputs, { kind: 'grpo', params: { eps_low: 1.5 } })).toThrow(
      /eps_low = 1.5 is outside \[0, 1\]/,
    );
    expect(() => policyLoss(inputs, { kind: 'ipo', params: { kl_tau: 'x' as unknown as number } })).toThrow(
      /'kl_tau' must be a number/,
    );
    expect(() => policyLoss(inputs, { kind: 'ce', mismatch: { mode: 'tis' } })).toThrow(
      /mismatch correction needs inference logprobs/,
    );
    expect(() => policyLoss(inputs, { kind: 'grpo', normalization: 'row' as 'token' })).toThrow(
      "normalization: 'row' is not one of token, sequence",
    );
    expect(() => policyLoss(inputs, { kind: 'grpo', mismatch: { mode: 'all' as 'tis' } })).toThrow(
      "mismatch.mode: 'all' is not one of none, tis, mask",
    );
    expect(() => policyLoss({ ...inputs, sampleLengths: [5, 4] }, { kind: 'grpo' })).toThrow(
      /sum to the number of tokens/,
    );
  });
});

// ------------------------------------------------------------------------------------------------
// On a model

/** A packed row of samples (second half = completion), with per-sample advantages. */
function rlRow(rng: Rng, lengths: number[], vocab: number): TrainRow & { sampleAdvantages: number[] } {
  const samples = lengths.map((n) => randomTokens(rng, n, vocab));
  const sampleAdvantages = lengths.map(() => rng.normal());
  const lossMask = samples.flatMap((s) => s.map((_, i) => (i >= s.length / 2 ? 1 : 0)));
  return {
    ...packRow(samples),
    lossMask,
    advantages: Float32Array.from(samples.flatMap((s, k) => s.map(() => sampleAdvantages[k]))),
    inferenceLogprobs: Float32Array.from(lossMask.map((m) => (m ? -5 + 0.5 * rng.normal() : 0))),
    sampleAdvantages,
  };
}

const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), 'prime-rl-'));
const equalBytes = (a: WeightTensor[], b: WeightTensor[]) =>
  a.length === b.length && a.every((t, i) => t.name === b[i].name && t.data.equals(b[i].data));

test('on-policy GRPO gradient equals REINFORCE -sum A grad logp / N (built from per-sample CE)', async () => {
  const cfg = tinyConfig('qwen3', { hiddenSize: 32, intermediateSize: 48, headDim: 8, vocabSize: 64 });
  const model = await loadModel(cfg, randomWeights(cfg, 4, 'F64'), { dtype: 'float64' });
  const trainer = model.createTrainer();
  const rng = new Rng(8);
  const lengths = [[9, 7], [11]];
  const rows = lengths.map((l) => rlRow(rng, l, cfg.vocabSize));
  // mu = the trainer's own logprobs: ratio 1, nothing clipped.
  const scores = await model.score(rows);
  rows.forEach((r, i) => (r.inferenceLogprobs = scores[i].logprobs));
  const grpo = await trainer.gradients(rows, { kind: 'grpo' });
  expect(grpo.metrics.clipped).toBe(0);
  expect(grpo.metrics.mismatch_kl).toBeLessThan(1e-12);
  const N = grpo.metrics.loss_tokens;
  // Entropy metric = mean of the scored entropies over loss tokens (first tokens of samples excluded).
  let entropy = 0;
  rows.forEach((r, i) => {
    const starts = new Set(Array.from(r.positionIds).flatMap((p, t) => (p === 0 ? [t] : [])));
    r.lossMask.forEach((m, t) => (entropy += m && !starts.has(t) ? scores[i].entropies[t] : 0));
  });
  expect(grpo.metrics.entropy).toBeCloseTo(entropy / N, 5);

  // REINFORCE by linearity: sum over samples of A_i * (CE gradient of that sample's tokens / N).
  const reinforce = new Map<string, Float64Array>();
  for (let r = 0; r < rows.length; r++) {
    let offset = 0;
    for (const [k, A] of rows[r].sampleAdvantages.entries()) {
      const len = lengths[r][k];
      const only = rows.map((row, j) => ({
        ...row,
        lossMask: Array.from(row.lossMask as number[], (m, t) => (j === r && t >= offset && t < offset + len ? m : 0)),
      }));
      offset += len;
      const ce = await trainer.gradients(only, { kind: 'ce', normalizer: N });
      for (const g of ce.gradients) {
        const acc = reinforce.get(g.name) ?? new Float64Array(decode(g).length);
        decode(g).forEach((v, i) => (acc[i] += A * v));
        reinforce.set(g.name, acc);
      }
    }
  }
  let maxDiff = 0,
    maxAbs = 0;
  for (const g of grpo.gradients) {
    const want = reinforce.get(g.name)!;
    decode(g).forEach((v, i) => {
      maxDiff = Math.max(maxDiff, Math.abs(v - want[i]));
      maxAbs = Math.max(maxAbs, Math.abs(want[i]));
    });
  }
  expect(maxAbs).toBeGreaterThan(1e-3);
  expect(maxDiff).toBeLessThan(1e-6 * maxAbs);
});

describe('RL training steps', () => {
  const cfg = tinyConfig('qwen2');
  const stepRows = (i: number) => [
    rlRow(new Rng(200 + i), [14, 10], cfg.vocabSize),
    rlRow(new Rng(300 + i), [20], cfg.vocabSize),
  ];
  const loss: LossConfig = {
    kind: 'grpo',
    params: { eps_low: 0.2, eps_high: 0.28 },
    mismatch: { mode: 'tis', tisCap: 2 },
    klBeta: 0.01,
    normalization: 'sequence',
  };

  test('metrics; KL to the reference is 0 before the first update', async () => {
    const model = await loadModel(cfg, randomWeights(cfg, 3));
    await expect(model.createTrainer().step(stepRows(0), { lr: 1e-3, loss })).rejects.toThrow(
      /klBeta > 0 needs a reference/,
    );
    const trainer = model.createTrainer({ reference: true });
    const first = await trainer.step(stepRows(0), { lr: 1e-3, maxGradNorm: 1, loss });
    expect(first.metrics.kl_divergence).toBe(0);
    expect(first.lr).toBe(1e-3);
    expect(first.metrics).toMatchObject({ tokens: 44, loss_samples: 3, loss_tokens: 7 + 5 + 10 });
    expect(first.metrics.entropy).toBeGreaterThan(0);
    expect(first.metrics.mismatch_kl).toBeGreaterThan(0);
    expect(first.forwardBackwardSeconds + first.optimizerSeconds).toBeLessThanOrEqual(first.seconds + 1e-9);
    const second = await trainer.step(stepRows(1), { lr: 1e-3, maxGradNorm: 1, loss });
    expect(second.metrics.kl_divergence).toBeGreaterThan(0);
  });

  test('resume is bitwise: 4 steps == 2 + checkpoint + fresh engine + load + 2', async () => {
    const lrs = [1e-3, 2e-3, 3e-3, 4e-3];
    const run = async (m: NativeModel, from: number, to: number, before?: (t: Trainer) => Promise<void>) => {
      const t = m.createTrainer({ reference: true });
      await before?.(t);
      for (let i = from; i < to; i++) await t.step(stepRows(i), { lr: lrs[i], maxGradNorm: 1, loss });
      return t;
    };
    const straight = await loadModel(cfg, randomWeights(cfg, 3));
    await run(straight, 0, 4);
    const dir = tmp();
    const first = await loadModel(cfg, randomWeights(cfg, 3));
    await (await run(first, 0, 2)).save(dir);
    // A resumed process builds the trainer on the base weights (its KL reference), then loads.
    const resumed = await loadModel(cfg, randomWeights(cfg, 3));
    await run(resumed, 2, 4, (t) => t.load(dir));
    expect(equalBytes(await straight.readWeights(), await resumed.readWeights())).toBe(true);
    fs.rmSync(dir, { recursive: true });
  });
});

describe('LoRA', () => {
  const cfg = tinyConfig('llama');
  const lora = {
    rank: 4,
    alpha: 8,
    dropout: 0.1,
    targetModules: ['q_proj', 'v_proj', 'down_proj'] as ('q_proj' | 'v_proj' | 'down_proj')[],
  };
  const rows = (i: number) => [rlRow(new Rng(400 + i), [16, 12], cfg.vocabSize)];
  const loss: LossConfig = { kind: 'cispo', params: { eps_high: 0.28 }, klBeta: 0.02 };

  test('PEFT names and shapes; A like kaiming-uniform, B zero', async () => {
    const model = await loadModel(cfg, randomWeights(cfg, 5));
    const adapters = await model.createTrainer({ lora }).readAdapters();
    const names = [0, 1].flatMap((l) =>
      ['self_attn.q_proj', 'self_attn.v_proj', 'mlp.down_proj'].flatMap((m) =>
        ['lora_A', 'lora_B'].map((ab) => `base_model.model.model.layers.${l}.${m}.${ab}.weight`),
      ),
    );
    expect(adapters.map((a) => a.name)).toEqual(names);
    const kv = cfg.numKvHeads * cfg.headDim;
    expect(adapters.slice(0, 6).map((a) => a.shape)).toEqual([
      [4, 64],
      [64, 4],
      [4, 64],
      [kv, 4],
      [4, 128],
      [64, 4],
    ]);
    for (const a of adapters) {
      const v = decode(a);
      if (a.name.includes('lora_B')) expect(v.every((x) => x === 0)).toBe(true);
      else expect(Math.max(...v.map(Math.abs))).toBeLessThanOrEqual(1 / Math.sqrt(a.shape[1]));
    }
    await expect(model.createTrainer().readAdapters()).resolves.toEqual([]);
    expect(() => model.createTrainer({ lora: { ...lora, targetModules: ['qkv' as 'q_proj'] } })).toThrow(
      /unknown LoRA target module 'qkv'/,
    );
  });

  test('only adapters train; merged weights reproduce the adapted forward', async () => {
    const model = await loadModel(cfg, randomWeights(cfg, 5));
    const base = await model.readWeights();
    const trainer = model.createTrainer({ lora, weightDecay: 0 });
    const first = await trainer.step(rows(0), { lr: 1e-2, loss });
    expect(first.metrics.kl_divergence).toBe(0); // B = 0: the adapted model is the base model
    for (let i = 1; i < 4; i++) await trainer.step(rows(i), { lr: 1e-2, loss });
    expect(equalBytes(await model.readWeights(), base)).toBe(true);
    const { gradients } = await trainer.gradients(rows(9), loss);
    expect(gradients.every((g) => g.name.includes('.lora_'))).toBe(true);
    // Dropout is live in training: the next call draws other masks.
    const again = await trainer.gradients(rows(9), loss);
    expect(equalBytes(gradients, again.gradients)).toBe(false);

    const merged = await trainer.readWeights();
    expect(merged.map((t) => t.name)).toEqual(base.map((t) => t.name));
    merged.forEach((t, i) => {
      const targeted = /(q_proj|v_proj|down_proj)\.weight$/.test(t.name);
      expect(t.data.equals(base[i].data)).toBe(!targeted);
    });
    const mergedModel = await loadModel(cfg, merged);
    const probe = [packRow([randomTokens(new Rng(7), 24, cfg.vocabSize), randomTokens(new Rng(8), 9, cfg.vocabSize)])];
    const [adapted] = await trainer.score(probe, { temperature: 0.7 });
    const [viaMerged] = await mergedModel.score(probe, { temperature: 0.7 });
    const [viaBase] = await model.score(probe, { temperature: 0.7 });
    let diff = 0,
      moved = 0;
    adapted.logprobs.forEach((v, t) => {
      diff = Math.max(diff, Math.abs(v - viaMerged.logprobs[t]));
      moved = Math.max(moved, Math.abs(v - viaBase.logprobs[t]));
    });
    expect(diff).toBeLessThanOrEqual(1e-5);
    expect(moved).toBeGreaterThan(1e-3); // the adapters did change the policy
  });

  test('checkpoint resume is bitwise (adapters, AdamW, dropout RNG)', async () => {
    const lrs = [1e-2, 2e-2, 1e-2, 5e-3];
    const straight = (await loadModel(cfg, randomWeights(cfg, 5))).createTrainer({ lora, seed: 3 });
    for (let i = 0; i < 4; i++) await straight.step(rows(i), { lr: lrs[i], maxGradNorm: 1, loss });
    const dir = tmp();
    const first = (await loadModel(cfg, randomWeights(cfg, 5))).createTrainer({ lora, seed: 3 });
    for (let i = 0; i < 2; i++) await first.step(rows(i), { lr: lrs[i], maxGradNorm: 1, loss });
    await first.save(dir);
    const resumed = (await loadModel(cfg, randomWeights(cfg, 5))).createTrainer({ lora, seed: 99 });
    await resumed.load(dir);
    expect(resumed.stepCount).toBe(2);
    for (let i = 2; i < 4; i++) await resumed.step(rows(i), { lr: lrs[i], maxGradNorm: 1, loss });
    expect(equalBytes(await straight.readAdapters(), await resumed.readAdapters())).toBe(true);
    expect(equalBytes(await straight.readWeights(), await resumed.readWeights())).toBe(true);
    // A full fine-tuning trainer (or another rank) refuses a LoRA checkpoint.
    const full = (await loadModel(cfg, randomWeights(cfg, 5))).createTrainer();
    await expect(full.load(dir)).rejects.toThrow(/written with LoRA rank 4, this trainer has rank 0/);
    fs.rmSync(dir, { recursive: true });
  });
});

/**
 * The verifiers wire without Python: deltas assembled into an episode as verifiers' own
 * `EpisodeAssembly` does, and traces (message graphs) turned into training samples.
 */
import { EpisodeAssembly, type WireTrace } from '../../lib/envs/verifiers/server';
import { episodeRollout, nodeVersions, traceSamples } from '../../lib/orchestrator/verifiers-rollout';

const node = (parent: number | null, ids: number[], mask: boolean[], logprobs: number[] = [], sampled = false) => ({
  parent,
  sampled,
  message: { role: sampled ? 'assistant' : 'user', content: sampled ? 'ok' : 'q' },
  token_ids: ids,
  mask,
  logprobs,
});
const F = false;
const T = true;

/** system -> user -> assistant -> user -> assistant, plus a second branch from the first user (a rewrite). */
const trace = (): WireTrace => ({
  id: 't1',
  ok: true,
  rewards: { lcs: { score: 0.5, weight: 2 } },
  metrics: { chars: 4 },
  nodes: [
    node(null, [1, 2], [F, F]),
    node(0, [3], [F]),
    node(1, [9, 10, 11], [F, T, T], [-0.1, -0.2], true),
    node(2, [4, 5], [F, F]),
    node(3, [9, 12], [F, T], [-0.3], true),
    node(1, [9, 13], [F, T], [-0.4], true),
  ],
});

test('every root-to-leaf path is one sample: its exact tokens, sampled spans with their logprobs, the roles of the rest', () => {
  // The tokens not sampled, by the message (role) they came from: echo trains chosen roles' tokens.
  const user = (tokens: number) => ({ role: 'user', tokens });
  const assistant = (tokens: number) => ({ role: 'assistant', tokens });
  const prompt = { tokens: [1, 2, 3, 9], generated: false, roles: [user(2), user(1), assistant(1)] };
  expect(traceSamples(trace())).toEqual([
    [
      prompt,
      { tokens: [10, 11], generated: true, logprobs: [-0.1, -0.2] },
      { tokens: [4, 5, 9], generated: false, roles: [user(2), assistant(1)] },
      { tokens: [12], generated: true, logprobs: [-0.3] },
    ],
    [prompt, { tokens: [13], generated: true, logprobs: [-0.4] }],
  ]);
});

test.each([
  [
    'a mask of another length',
    (t: WireTrace) => ((t.nodes[2] as { mask: boolean[] }).mask = [F, T]),
    /2 mask entries for 3 tokens/,
  ],
  [
    'logprobs not one per sampled token',
    (t: WireTrace) => ((t.nodes[4] as { logprobs: number[] }).logprobs = []),
    /0 logprobs for 1 sampled tokens/,
  ],
  [
    'a non-finite logprob',
    (t: WireTrace) => ((t.nodes[5] as { logprobs: unknown[] }).logprobs = [null]),
    /not a finite number/,
  ],
])('%s errors the rollout', (_what, spoil, message) => {
  const t = trace();
  spoil(t);
  const r = episodeRollout({ traces: [t] }, 3);
  expect(r.error).toMatch(message);
  expect(r.samples).toEqual([]);
});

test('reward is the weighted sum of the rewards; metrics hold each score and metric; failures error the rollout', () => {
  const r = episodeRollout({ traces: [trace()] }, 3);
  expect(r.error).toBeUndefined();
  expect(r.reward).toBe(1);
  expect(r.metrics).toEqual({ lcs: 0.5, chars: 4 });
  expect(r.completionTokens).toBe(4);
  expect(r.turns).toBe(3);
  expect(r.policyVersion).toBe(3);
  const failed = { ...trace(), ok: false, errors: [{ type: 'HarnessError', message: 'exited 1' }] };
  expect(episodeRollout({ traces: [failed] }, 3).error).toBe('verifiers: HarnessError: exited 1');
  expect(episodeRollout({ traces: [], errors: [{ type: 'X', message: 'boom' }] }, 3).error).toBe('verifiers: X: boom');
});

test('deltas assemble into the episode; a discarded trace is dropped; a lost delta is an error', () => {
  const a = new EpisodeAssembly();
  a.apply({ trace: 'old', open: { id: 'old', task: {} }, nodes: [node(null, [1], [F])] });
  a.apply({ trace: 'old', discard: true });
  a.apply({ trace: 't', open: { id: 't', task: {} }, nodes: [node(null, [1], [F])] });
  a.apply({
    trace: 't',
    nodes: [node(0, [2], [T], [-1], true)],
    calls: [{}],
    set: { ok: true, rewards: { r: { score: 1 } } },
  });
  a.apply({ trace: 't', links: { 0: [{ type: 'x' }] } });
  const ep = a.finish({ ok: true }, [{ id: 't', nodes: 2, calls: 1 }]);
  expect(ep.ok).toBe(true);
  expect(ep.traces.map((t) => t.id)).toEqual(['t']);
  expect(ep.traces[0].nodes).toHaveLength(2);
  expect(ep.traces[0].ok).toBe(true);
  expect(() => a.finish({}, [{ id: 't', nodes: 3, calls: 1 }])).toThrow(/assembled 2 nodes/);
  expect(() => a.finish({}, [{ id: 'old', nodes: 1, calls: 0 }])).toThrow(/missing trace old/);
});

test('in-flight: each sampled token gets the version the server recorded for its answer; a missing record errors the rollout', () => {
  // The trace's answers in the order the server gave them; one (a retried turn) no node kept.
  const records = [
    { token_ids: [10, 11, 99], policy_versions: [3, 4, 4] },
    { token_ids: [7, 7], policy_versions: [4, 4] },
    { token_ids: [12], policy_versions: [5] },
    { token_ids: [13], policy_versions: [6] },
  ];
  const t = trace();
  const samples = traceSamples(t, nodeVersions(t, records));
  expect(samples.map((s) => s.filter((g) => g.generated).map((g) => Array.from(g.versions ?? [])))).toEqual([
    [[3, 4], [5]],
    [[6]],
  ]);
  const r = episodeRollout({ traces: [t] }, 9, new Map([['t1', records]]));
  expect(r.error).toBeUndefined();
  expect([r.policyVersion, r.newestPolicyVersion]).toEqual([3, 6]);
  const lost = episodeRollout({ traces: [trace()] }, 9, new Map([['t1', records.slice(0, 2)]]));
  expect(lost.error).toMatch(/node 4: the inference server kept no record of its 1 sampled tokens/);
  expect(lost.samples).toEqual([]);
});

/**
 * Which policy version sampled each token of a verifiers rollout, kept by the server that sampled
 * it. The renderers client of a verifiers env server drops the `policy_version` fields of our
 * `/inference/v1/generate` answers, but it names the rollout on every request (`X-Session-ID`, the
 * trace id): when asked to (`X-Prime-Record-Versions`, a header of the env server's client config),
 * the route keeps each answer's tokens and versions under that id, and the orchestrator takes them
 * once the episode is over (`POST /inference/v1/session_versions`). In-flight mode needs them: the
 * weights change while a rollout runs, and the off-policy bound is by the oldest sampled token.
 */
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { parseBody } from '../protocol';

export const RECORD_VERSIONS_HEADER = 'x-prime-record-versions';
export const SESSION_HEADER = 'x-session-id';

/** One answer's sampled tokens and the version that sampled each. */
export interface VersionRecord {
  token_ids: number[];
  policy_versions: number[];
}

/** Sessions kept at most: the oldest is forgotten first (a rollout whose orchestrator died never asks). */
const MAX_SESSIONS = 16_384;

export class SessionVersions {
  private readonly sessions = new Map<string, VersionRecord[]>();

  record(session: string, records: VersionRecord[]): void {
    const list = this.sessions.get(session) ?? [];
    // Re-inserted: the map's order is the order sessions were last written.
    this.sessions.delete(session);
    this.sessions.set(session, [...list, ...records]);
    while (this.sessions.size > MAX_SESSIONS) this.sessions.delete(this.sessions.keys().next().value!);
  }

  /** The session's records, in the order they were answered; forgotten once taken. */
  take(session: string): VersionRecord[] {
    const list = this.sessions.get(session) ?? [];
    this.sessions.delete(session);
    return list;
  }
}

const takeRequest = z.strictObject({ session_id: z.string().min(1) });

export function registerSessionVersionsRoute(app: FastifyInstance, versions: SessionVersions): void {
  app.post('/inference/v1/session_versions', async (req) => {
    const { session_id } = parseBody(takeRequest, req.body);
    return { session_id, records: versions.take(session_id) };
  });
}

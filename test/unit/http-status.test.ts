/**
 * What an HTTP error status means for the caller (lib/orchestrator/client.ts `classifyStatus`): which
 * statuses fail one rollout, stop the run, wait for a busy server, or leave the activity to retries.
 */
import { classifyStatus } from '../../lib/orchestrator/client';

const STATUSES = [400, 401, 403, 404, 408, 413, 422, 429, 500, 502, 503, 504];
const table = (route: Parameters<typeof classifyStatus>[1]) =>
  Object.fromEntries(STATUSES.map((s) => [s, classifyStatus(s, route)]));

test("our server's generation route: a bad request errors its rollout; auth, address, a full queue and outages do not", () => {
  expect(table('generate')).toEqual({
    400: 'request',
    401: 'config',
    403: 'config',
    404: 'config',
    408: 'unavailable',
    413: 'request',
    422: 'request',
    429: 'busy',
    500: 'unavailable',
    502: 'unavailable',
    503: 'busy',
    504: 'unavailable',
  });
});

test("our server's control routes: every 4xx but a timeout or a full queue is a setting to fix", () => {
  expect(table('control')).toMatchObject({ 400: 'config', 413: 'config', 422: 'config', 408: 'unavailable' });
  expect(table('control')).toMatchObject({ 401: 'config', 429: 'busy', 503: 'busy', 500: 'unavailable' });
});

test("an external API (the eval's chat rollouts): any 4xx but 429 errors the rollout, the rest is retried", () => {
  expect(table('external')).toEqual({
    400: 'request',
    401: 'request',
    403: 'request',
    404: 'request',
    408: 'request',
    413: 'request',
    422: 'request',
    429: 'unavailable',
    500: 'unavailable',
    502: 'unavailable',
    503: 'unavailable',
    504: 'unavailable',
  });
});

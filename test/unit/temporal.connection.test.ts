/**
 * Where a command's Temporal connection comes from (lib/temporal/connection.ts): Temporal's own
 * environment configuration (TEMPORAL_* variables, temporal.toml profiles) with our temporal.*
 * keys over it; what a failed connection says; each run's own task queues. The connections
 * themselves, through real TLS and API-key frontends: test/temporal.secured.test.ts.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { ConfigError } from '../../lib/failures';
import { devMetricsPort, rlSchema, temporalSchema } from '../../lib/config/schemas';
import { connectFailure, describeTarget, temporalTarget } from '../../lib/temporal/connection';
import { rlConfig } from '../support/setup';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-envconfig-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
const file = (name: string, text: string) => {
  fs.writeFileSync(path.join(dir, name), text);
  return path.join(dir, name);
};
const ca = file('ca.pem', '-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n');
const toml = file(
  'temporal.toml',
  `[profile.default]\naddress = "default.example:7233"\nnamespace = "dflt"\n\n` +
    `[profile.cloud]\naddress = "ns.acct.tmprl.cloud:7233"\nnamespace = "ns.acct"\napi_key = "key-from-file"\n\n` +
    `[profile.mtls]\naddress = "mtls.example:7233"\n[profile.mtls.tls]\nserver_ca_cert_path = "${ca}"\nclient_cert_path = "${ca}"\nclient_key_path = "${ca}"\n`,
);
/** An environment of only these variables (never the user's own temporal.toml). */
const env = (vars: Record<string, string> = {}) => ({ HOME: dir, ...vars });
const keys = (over: Record<string, unknown> = {}) => temporalSchema.parse(over);

test('no address anywhere: the local dev server, plain gRPC', () => {
  const t = temporalTarget(keys({ port: 7301 }), env());
  expect(t).toMatchObject({ address: '127.0.0.1:7301', configured: false, namespace: 'default', tls: false });
  expect(t.secrets).toEqual({});
});

test('TEMPORAL_* variables configure the server; our keys win over them', () => {
  const vars = env({ TEMPORAL_ADDRESS: 'env.example:7233', TEMPORAL_NAMESPACE: 'from-env' });
  expect(temporalTarget(keys(), vars)).toMatchObject({
    address: 'env.example:7233',
    namespace: 'from-env',
    configured: true,
    origin: 'TEMPORAL_ADDRESS',
  });
  expect(temporalTarget(keys({ address: 'key.example:7233', namespace: 'ours' }), vars)).toMatchObject({
    address: 'key.example:7233',
    namespace: 'ours',
    origin: 'temporal.address',
  });
});

test('an API key turns TLS on, and is never in a description', () => {
  const t = temporalTarget(keys(), env({ TEMPORAL_ADDRESS: 'x:7233', TEMPORAL_API_KEY: 'sekrit-123' }));
  expect(t).toMatchObject({ tls: true, apiKey: true, clientCert: false });
  expect(t.secrets).toMatchObject({ apiKey: 'sekrit-123', tls: true });
  expect(describeTarget(t)).toBe('x:7233 (namespace default, TLS, API key; from TEMPORAL_ADDRESS)');
  expect(JSON.stringify(describeTarget(t))).not.toContain('sekrit');
});

test('profiles of the config file: TEMPORAL_PROFILE, temporal.profile over it, variables over the profile', () => {
  const base = { TEMPORAL_CONFIG_FILE: toml };
  expect(temporalTarget(keys(), env(base))).toMatchObject({
    address: 'default.example:7233',
    namespace: 'dflt',
    origin: `profile 'default' of ${toml}`,
  });
  const cloud = temporalTarget(keys(), env({ ...base, TEMPORAL_PROFILE: 'cloud' }));
  expect(cloud).toMatchObject({ address: 'ns.acct.tmprl.cloud:7233', namespace: 'ns.acct', apiKey: true, tls: true });
  const mtls = temporalTarget(keys({ profile: 'mtls' }), env({ ...base, TEMPORAL_PROFILE: 'cloud' }));
  expect(mtls).toMatchObject({ address: 'mtls.example:7233', tls: true, clientCert: true, apiKey: false });
  expect(temporalTarget(keys({ profile: 'mtls' }), env({ ...base, TEMPORAL_ADDRESS: 'env:1' })).address).toBe('env:1');
});

test('a profile that is not there, or a certificate that cannot be read, is a config error naming it', () => {
  const call = (over: Record<string, unknown>, vars: Record<string, string>) => () =>
    temporalTarget(keys(over), env({ TEMPORAL_CONFIG_FILE: toml, ...vars }));
  expect(call({ profile: 'nope' }, {})).toThrow(ConfigError);
  expect(call({ profile: 'nope' }, {})).toThrow(/^temporal\.profile: .*profile 'nope'.*not found/);
  expect(call({}, { TEMPORAL_PROFILE: 'gone' })).toThrow(/^TEMPORAL_PROFILE: /);
  expect(call({}, { TEMPORAL_TLS_CLIENT_CERT_PATH: path.join(dir, 'missing.pem') })).toThrow(/missing\.pem/);
});

test('TLS or an API key without an address is refused: the local dev server speaks plain gRPC', () => {
  expect(() => temporalTarget(keys(), env({ TEMPORAL_API_KEY: 'k' }))).toThrow(/^temporal\.address: TLS or an API key/);
  expect(() => temporalTarget(keys(), env({ TEMPORAL_TLS: 'true' }))).toThrow(ConfigError);
});

test('a failed connection says TLS or authentication, and what to set', () => {
  const vars = { TEMPORAL_ADDRESS: '127.0.0.1:7443', TEMPORAL_TLS_SERVER_CA_CERT_PATH: ca };
  const tls = temporalTarget(keys(), env(vars));
  // An mTLS frontend (nginx, ssl_verify_client on) answers a client without a certificate with HTTP 400.
  const noCert = connectFailure(
    new Error('Failed to connect to Temporal server', {
      cause: new Error('13 INTERNAL: Received HTTP status code 400'),
    }),
    tls,
  );
  expect(noCert).toBeInstanceOf(ConfigError);
  expect(noCert.message).toMatch(
    /TLS: the server refused a client without a certificate .*TEMPORAL_TLS_CLIENT_CERT_PATH/,
  );
  // The worker's connection (Rust core) says the same thing differently.
  expect(
    connectFailure(
      new Error('Failed to call GetSystemInfo: code: \'Internal error\', message: "... status: 400 Bad Request"'),
      tls,
    ).message,
  ).toMatch(/TLS: the server refused a client without a certificate/);
  const keyed = temporalTarget(keys(), env({ ...vars, TEMPORAL_API_KEY: 'wrong' }));
  const refused = connectFailure(new Error('16 UNAUTHENTICATED: Received HTTP status code 401'), keyed);
  expect(refused.message).toMatch(/authentication failed \(the API key was refused\): set TEMPORAL_API_KEY/);
  expect(refused.message).not.toContain('wrong');
  expect(connectFailure(new Error('... status: 401 Unauthorized'), tls).message).toMatch(
    /authentication failed \(no API key is configured\)/,
  );
  expect(connectFailure(new Error('InvalidCertificate(UnknownIssuer)'), tls).message).toMatch(
    /TLS failed: check TEMPORAL_TLS_SERVER_CA_CERT_PATH/,
  );
  const plain = temporalTarget(keys(), env({ TEMPORAL_ADDRESS: '127.0.0.1:7443' }));
  expect(connectFailure(new Error('Failed to connect before the deadline'), plain).message).toMatch(
    /set TEMPORAL_TLS=true/,
  );
  const down = connectFailure(new Error('connect ECONNREFUSED'), temporalTarget(keys(), env()));
  expect(down).not.toBeInstanceOf(ConfigError);
  expect(down.message).toMatch(/cannot connect: .*prime-rl temporal start/);
});

test('each run polls its own task queues unless temporal.task_queue names them; --dry-run shows them', () => {
  const rl = (...argv: string[]) => rlConfig(['--model.name', 'm', ...argv]);
  expect(rl('--run-name', 'a').temporal.task_queue).toBe('prime-rl.a');
  expect(rl('--run-name', 'b').temporal.task_queue).toBe('prime-rl.b');
  expect(rl('--run-name', 'a', '--temporal.task-queue', 'shared').temporal.task_queue).toBe('shared');
  // A stored config read again (readRunConfig) keeps its queues.
  expect(rlSchema.parse(rl('--run-name', 'a')).temporal.task_queue).toBe('prime-rl.a');
});

test("the dev server's metrics port is fixed: temporal.metrics_port, else the gRPC port + 2000", () => {
  expect(devMetricsPort(keys())).toBe(9233);
  expect(devMetricsPort(keys({ port: 7400 }))).toBe(9400);
  expect(devMetricsPort(keys({ port: 7400, metrics_port: 9999 }))).toBe(9999);
  expect(() => keys({ port: 65000 })).toThrow(/gRPC port \+ 2000 \(67000\).*temporal\.metrics_port/);
});

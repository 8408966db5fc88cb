/**
 * How every command reaches Temporal (the CLI, the workers, `runs`, the launcher): Temporal's own
 * environment configuration, which the Temporal CLI and SDKs share (TEMPORAL_ADDRESS,
 * TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS, TEMPORAL_TLS_CLIENT_CERT_PATH / _KEY_PATH /
 * _SERVER_CA_CERT_PATH / _SERVER_NAME and their _DATA forms, TEMPORAL_GRPC_META_*, TEMPORAL_PROFILE,
 * and the profiles of TEMPORAL_CONFIG_FILE or ~/.config/temporalio/temporal.toml), read by
 * @temporalio/envconfig, with our `temporal.address`, `temporal.namespace` and `temporal.profile`
 * over it. An API key turns TLS on, as in the SDKs.
 *
 * With no address anywhere the server is the local dev server (`temporal.ip:port`): `rl`, `sft`
 * and `eval` start one there if none listens (lib/launch/devserver-policy.ts); everything else
 * only connects. Secrets (the API key, TLS keys) live in the target's connection options only:
 * never in a config, a workflow input, a file or a message.
 */
import { Connection, type Client, type TLSConfig } from '@temporalio/client';
import { loadClientConfigProfile, toClientOptions } from '@temporalio/envconfig';
import { CommandError, ConfigError } from '../failures';
import type { TemporalConfig } from '../config/schemas';
import { isListening } from './devserver';

/** What a connection needs besides the address: TLS, API key, gRPC metadata (secrets inside). */
export interface ConnectionSecrets {
  tls?: TLSConfig | boolean;
  apiKey?: string;
  metadata?: Record<string, string>;
}

/** The Temporal server a command talks to, and how. */
export interface TemporalTarget {
  /** host:port: the configured server's, or the local dev server's. */
  address: string;
  namespace: string;
  /** Where the address came from: `temporal.address`, `TEMPORAL_ADDRESS`, a profile, or the local dev server. */
  origin: string;
  /** False: no address is configured anywhere, and the target is the local dev server. */
  configured: boolean;
  /** TLS on (by TEMPORAL_TLS, a profile's tls table, or an API key). */
  tls: boolean;
  /** A client certificate is configured (mTLS). */
  clientCert: boolean;
  apiKey: boolean;
  /** Passed to the SDK's connections; never printed. */
  secrets: ConnectionSecrets;
}

/** The variables envconfig reads, for messages. */
const TLS_VARS =
  "TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH (or a profile's tls.client_cert_path / tls.client_key_path)";

/** `address`, `namespace` and `profile` of a temporal section; `ip` and `port` name the local dev server. */
export type TemporalKeys = Pick<TemporalConfig, 'address' | 'namespace' | 'profile' | 'ip' | 'port'>;

/**
 * The target of a command's temporal section under `env` (Temporal's environment configuration,
 * our keys over it). A profile or a file that cannot be read is a ConfigError naming it.
 */
export function temporalTarget(t: TemporalKeys, env: NodeJS.ProcessEnv = process.env): TemporalTarget {
  const vars = Object.fromEntries(Object.entries(env).filter((e): e is [string, string] => e[1] !== undefined));
  const profileName = t.profile ?? vars.TEMPORAL_PROFILE;
  const file = vars.TEMPORAL_CONFIG_FILE ?? '~/.config/temporalio/temporal.toml';
  let options: ReturnType<typeof toClientOptions>;
  let profileAddress: string | undefined;
  try {
    const profile = loadClientConfigProfile({ profile: t.profile, overrideEnvVars: vars });
    profileAddress = profile.address;
    options = toClientOptions(profile);
  } catch (e) {
    const key =
      t.profile !== undefined
        ? 'temporal.profile'
        : profileName !== undefined
          ? 'TEMPORAL_PROFILE'
          : 'TEMPORAL_CONFIG_FILE';
    throw new ConfigError(
      `${key}: Temporal's client configuration (${file}${profileName ? `, profile '${profileName}'` : ''}) cannot be read: ${(e as Error).message}`,
    );
  }
  const c = options.connectionOptions;
  const address = t.address ?? c.address;
  const tls = c.tls !== undefined && c.tls !== null && c.tls !== false;
  const target: TemporalTarget = {
    address: address ?? `${t.ip}:${t.port}`,
    namespace: t.namespace ?? options.namespace ?? 'default',
    origin:
      t.address !== undefined
        ? 'temporal.address'
        : vars.TEMPORAL_ADDRESS !== undefined
          ? 'TEMPORAL_ADDRESS'
          : profileAddress !== undefined
            ? `profile '${profileName ?? 'default'}' of ${file}`
            : 'the local dev server (no temporal.address, TEMPORAL_ADDRESS or temporal.toml profile)',
    configured: address !== undefined,
    tls,
    clientCert: typeof c.tls === 'object' && c.tls?.clientCertPair !== undefined,
    apiKey: c.apiKey !== undefined,
    secrets: {
      ...(c.tls !== undefined && c.tls !== null && { tls: c.tls }),
      ...(typeof c.apiKey === 'string' && { apiKey: c.apiKey }),
      ...(c.metadata !== undefined && { metadata: c.metadata as Record<string, string> }),
    },
  };
  if (!target.configured && (target.tls || target.apiKey))
    throw new ConfigError(
      `temporal.address: TLS or an API key is configured (TEMPORAL_TLS*, TEMPORAL_API_KEY or a temporal.toml profile) but no server address; the local dev server speaks plain gRPC. Set TEMPORAL_ADDRESS (or --temporal.address) to the server they are for`,
    );
  return target;
}

/** A short description of a target for log lines: address, namespace, origin, how secured (no secrets). */
export function describeTarget(t: TemporalTarget): string {
  const how = [t.tls ? (t.clientCert ? 'mTLS' : 'TLS') : 'plain gRPC', ...(t.apiKey ? ['API key'] : [])].join(', ');
  return `${t.address} (namespace ${t.namespace}, ${how}; from ${t.origin})`;
}

/** How long a command waits to reach the server before it says why it cannot. */
export const CONNECT_TIMEOUT_MS = 10_000;

/** The HTTP status a frontend (a proxy before Temporal) answered a gRPC call with, if the error says one. */
function httpStatus(message: string): number | undefined {
  const m = /HTTP status code (\d{3})|status: (\d{3})\b/.exec(message);
  return m ? Number(m[1] ?? m[2]) : undefined;
}

/** The whole message of an error and its causes (the SDKs wrap the gRPC error). */
function messages(e: unknown): string {
  const parts: string[] = [];
  for (let x = e as { message?: string; cause?: unknown } | undefined, i = 0; x && i < 5; x = x.cause as typeof x, i++)
    if (x.message) parts.push(x.message);
  return parts.join(': ');
}

/**
 * Why connecting to `target` failed, as an error that says what to set: TLS (a certificate the
 * server wants, or a server that speaks TLS to a plain client) and authentication (an API key
 * missing or refused) are ConfigErrors naming the variables; an unreachable server is a CommandError.
 */
export function connectFailure(e: unknown, target: TemporalTarget): Error {
  const text = messages(e);
  const at = `Temporal at ${target.address} (from ${target.origin})`;
  const status = httpStatus(text);
  if (
    status === 401 ||
    /UNAUTHENTICATED|Unauthenticated|PERMISSION_DENIED|PermissionDenied|Request unauthorized/.test(text)
  )
    return new ConfigError(
      `${at}: authentication failed (${target.apiKey ? 'the API key was refused' : 'no API key is configured'}): set TEMPORAL_API_KEY (or the profile's api_key) to a key the server accepts [${text}]`,
    );
  if (status === 400 && target.tls && !target.clientCert)
    return new ConfigError(
      `${at}: TLS: the server refused a client without a certificate (mTLS): set ${TLS_VARS} [${text}]`,
    );
  if (/certificate|handshake|tls|TLS|SSL|InvalidCertificate|UnknownIssuer/.test(text))
    return new ConfigError(
      `${at}: TLS failed: check TEMPORAL_TLS_SERVER_CA_CERT_PATH (the CA that signed the server's certificate), TEMPORAL_TLS_SERVER_NAME${target.clientCert ? '' : ` and, for mTLS, ${TLS_VARS}`} [${text}]`,
    );
  if (!target.tls && /GoAway|FRAME_SIZE_ERROR|http2 error|deadline/.test(text))
    return new ConfigError(
      `${at}: no gRPC answer over plain TCP within ${CONNECT_TIMEOUT_MS / 1000} s; if the server speaks TLS, set TEMPORAL_TLS=true (with TEMPORAL_TLS_SERVER_CA_CERT_PATH for a private CA) [${text}]`,
    );
  return new CommandError(
    `${at}: cannot connect: ${text}${target.configured ? '' : "; start one with 'prime-rl temporal start', or point TEMPORAL_ADDRESS (or --temporal.address) at yours"}`,
  );
}

/** host and port of `host:port` (`[v6]:port` too). */
export function splitAddress(address: string): [string, number] {
  const i = address.lastIndexOf(':');
  return [address.slice(0, i).replace(/^\[(.*)\]$/, '$1'), Number(address.slice(i + 1))];
}

/**
 * A client connection to `target`, checked with a call (so that TLS and authentication fail here,
 * within seconds, with a message that says what to set), or the error `connectFailure` makes.
 */
export async function connectClient(target: TemporalTarget): Promise<Connection> {
  let connection: Connection | undefined;
  try {
    connection = await Connection.connect({
      address: target.address,
      ...target.secrets,
      connectTimeout: CONNECT_TIMEOUT_MS,
    });
    await connection.withDeadline(Date.now() + CONNECT_TIMEOUT_MS, () => connection!.workflowService.getSystemInfo({}));
    return connection;
  } catch (e) {
    await connection?.close().catch(() => undefined);
    throw connectFailure(e, target);
  }
}

/**
 * For commands that never start a server (workers, `runs`): with no address configured, the local
 * dev server must be listening already; else a CommandError says how to start or name one.
 */
export async function requireServer(target: TemporalTarget): Promise<void> {
  if (target.configured) return;
  const [host, port] = splitAddress(target.address);
  if (!(await isListening(host, port)))
    throw new CommandError(
      `no Temporal server: none is configured (temporal.address, TEMPORAL_ADDRESS or a temporal.toml profile) and no local dev server listens at ${target.address}; start one with 'prime-rl temporal start', or point TEMPORAL_ADDRESS (or --temporal.address) at yours`,
    );
}

/**
 * Ids of the workflows running on the client's server (and matching `query`, a visibility
 * filter), except `own` and its child workflows.
 */
export async function otherRunningWorkflows(client: Client, own: string, query?: string): Promise<string[]> {
  const ids: string[] = [];
  for await (const w of client.workflow.list({
    query: `ExecutionStatus = "Running"${query ? ` AND ${query}` : ''}`,
  })) {
    if (![w.workflowId, w.parentExecution?.workflowId, w.rootExecution?.workflowId].includes(own))
      ids.push(w.workflowId);
  }
  return ids;
}

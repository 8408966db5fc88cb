/**
 * A secured Temporal frontend for tests, as a cluster runs one: Debian's nginx (scripts/setup.sh
 * --tests installs it) terminating TLS before a local dev server, in two servers: one demanding a
 * client certificate signed by the test CA (mTLS, `ssl_verify_client on`), one demanding an API
 * key (`authorization: Bearer <key>`, as Temporal Cloud's API keys travel). gRPC passes through
 * (`grpc_pass`). Certificates come from openssl into the folder; nginx runs as one process
 * (`master_process off`) with every file in that folder. What the client must set is given as
 * TEMPORAL_* variables only, as a user would set them.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { freePort } from '../../lib/net';
import { isListening, startDevServer, type TemporalEndpoint } from '../../lib/temporal/devserver';
import { until } from './processes';

/** Why the secured tier cannot run here (no nginx or openssl), or undefined when it can. */
export function securedTierUnusable(): string | undefined {
  for (const tool of ['nginx', 'openssl'])
    if (spawnSync('sh', ['-c', `command -v ${tool}`]).status !== 0)
      return `${tool} is not installed (bash scripts/setup.sh --tests installs Debian's nginx)`;
  return undefined;
}

export interface SecuredTemporal {
  /** The dev server behind the frontends (plain gRPC, loopback). */
  devServer: TemporalEndpoint;
  /** TEMPORAL_* variables of a client that may pass the mTLS frontend. */
  mtlsEnv: Record<string, string>;
  /** TEMPORAL_* variables of a client that may pass the API-key frontend. */
  apiKeyEnv: Record<string, string>;
  close(): Promise<void>;
}

/** openssl with its arguments; throws with its output if it fails. */
function openssl(dir: string, ...args: string[]): void {
  const r = spawnSync('openssl', args, { cwd: dir, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`openssl ${args.join(' ')} failed: ${r.stderr}`);
}

/**
 * A CA, a server certificate for localhost / 127.0.0.1 and a client certificate, all v3 (rustls,
 * in the workers' connection, refuses v1 certificates).
 */
function makeCertificates(dir: string): void {
  fs.writeFileSync(path.join(dir, 'server.ext'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\n');
  fs.writeFileSync(path.join(dir, 'client.ext'), 'extendedKeyUsage=clientAuth\n');
  openssl(
    dir,
    ...['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'ca.key', '-out', 'ca.pem'],
    ...['-days', '2', '-subj', '/CN=prime-rl test CA'],
  );
  for (const [name, subject] of [
    ['server', '/CN=localhost'],
    ['client', '/CN=prime-rl worker'],
  ]) {
    openssl(
      dir,
      'req',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-keyout',
      `${name}.key`,
      '-out',
      `${name}.csr`,
      '-subj',
      subject,
    );
    openssl(
      dir,
      ...['x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial'],
      ...['-out', `${name}.pem`, '-days', '2', '-extfile', `${name}.ext`],
    );
  }
}

function nginxConfig(dir: string, upstream: string, mtlsPort: number, keyPort: number, apiKey: string): string {
  const f = (name: string) => path.join(dir, name);
  const tls = `ssl_certificate ${f('server.pem')};\n    ssl_certificate_key ${f('server.key')};`;
  return `daemon off;
master_process off;
pid ${f('nginx.pid')};
error_log ${f('nginx-error.log')} warn;
events { worker_connections 1024; }
http {
  access_log off;
  ${['client_body', 'proxy', 'fastcgi', 'uwsgi', 'scgi'].map((t) => `${t}_temp_path ${f(`tmp-${t}`)};`).join('\n  ')}
  client_max_body_size 0;
  keepalive_timeout 1h;
  keepalive_requests 1000000;
  grpc_read_timeout 1h;
  grpc_send_timeout 1h;
  server {
    listen 127.0.0.1:${mtlsPort} ssl http2;
    ${tls}
    ssl_client_certificate ${f('ca.pem')};
    ssl_verify_client on;
    location / { grpc_pass grpc://${upstream}; }
  }
  server {
    listen 127.0.0.1:${keyPort} ssl http2;
    ${tls}
    location / {
      if ($http_authorization != "Bearer ${apiKey}") { return 401; }
      grpc_pass grpc://${upstream};
    }
  }
}
`;
}

/** A dev server in `dir` behind nginx's mTLS and API-key frontends. */
export async function startSecuredTemporal(dir: string, apiKey: string): Promise<SecuredTemporal> {
  fs.mkdirSync(dir, { recursive: true });
  makeCertificates(dir);
  const { endpoint: devServer } = await startDevServer({
    ip: '127.0.0.1',
    port: await freePort(),
    uiPort: await freePort(),
    namespace: 'default',
    dbFile: path.join(dir, 'temporal.db'),
    logFile: path.join(dir, 'temporal.log'),
  });
  const [mtlsPort, keyPort] = [await freePort(), await freePort()];
  fs.writeFileSync(path.join(dir, 'nginx.conf'), nginxConfig(dir, devServer.address, mtlsPort, keyPort, apiKey));
  const log = fs.openSync(path.join(dir, 'nginx.out'), 'a');
  const nginx: ChildProcess = spawn('nginx', ['-p', dir, '-c', path.join(dir, 'nginx.conf')], {
    stdio: ['ignore', log, log],
  });
  fs.closeSync(log);
  const close = async () => {
    if (nginx.exitCode === null && nginx.signalCode === null) {
      const exited = new Promise((r) => nginx.once('exit', r));
      nginx.kill('SIGTERM');
      await exited;
    }
    await devServer.stop();
  };
  try {
    await until(
      'nginx listens',
      async () => {
        if (nginx.exitCode !== null)
          throw new Error(`nginx exited: ${fs.readFileSync(path.join(dir, 'nginx-error.log'), 'utf8')}`);
        return (await isListening('127.0.0.1', mtlsPort)) && isListening('127.0.0.1', keyPort);
      },
      30_000,
    );
  } catch (e) {
    await close();
    throw e;
  }
  const f = (name: string) => path.join(dir, name);
  const trustServer = { TEMPORAL_TLS_SERVER_CA_CERT_PATH: f('ca.pem'), TEMPORAL_TLS_SERVER_NAME: 'localhost' };
  return {
    devServer,
    mtlsEnv: {
      TEMPORAL_ADDRESS: `127.0.0.1:${mtlsPort}`,
      ...trustServer,
      TEMPORAL_TLS_CLIENT_CERT_PATH: f('client.pem'),
      TEMPORAL_TLS_CLIENT_KEY_PATH: f('client.key'),
    },
    apiKeyEnv: { TEMPORAL_ADDRESS: `127.0.0.1:${keyPort}`, ...trustServer, TEMPORAL_API_KEY: apiKey },
    close,
  };
}

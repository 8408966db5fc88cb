/**
 * The address of a server configured with `server`, for a client on the same machine: the
 * wildcard interfaces stand for loopback. Pure (no Node built-ins): workflow code uses it too.
 */
export function serverUrl(server: { host: string; port: number }): string {
  const host = server.host === '0.0.0.0' ? '127.0.0.1' : server.host === '::' ? '::1' : server.host;
  return `http://${host.includes(':') ? `[${host}]` : host}:${server.port}`;
}

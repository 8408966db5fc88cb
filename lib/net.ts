/** Small networking helpers. */
import * as fs from 'node:fs';
import * as net from 'node:net';

/** Lowest port `freePort` hands out: above the registered services people run on a dev machine. */
const LOWEST = 20_000;

/**
 * The range the kernel draws ephemeral ports from (the local ports of outgoing connections), or
 * undefined where it cannot be read (not Linux).
 */
function ephemeralRange(): [number, number] | undefined {
  try {
    const [lo, hi] = fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
    return Number.isInteger(lo) && Number.isInteger(hi) ? [lo!, hi!] : undefined;
  } catch {
    return undefined;
  }
}

/** Binds host:port and closes it again: the port, if that worked. */
function tryBind(port: number, host = '127.0.0.1'): Promise<number | undefined> {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.once('error', () => resolve(undefined));
    srv.listen(port, host, () => {
      const bound = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(bound));
    });
  });
}

/** Ports this process handed out already, never handed out twice. */
const handedOut = new Set<number>();

/**
 * A TCP port on 127.0.0.1 that is free now and stays usable later, for servers that must not
 * collide and may be restarted on the same port (a Temporal dev server, an inference server).
 *
 * On Linux it lies below the ephemeral range: a port the OS picks (listen on port 0) is an
 * ephemeral one, which the kernel also gives to outgoing connections, so any client connecting
 * anywhere can hold it by the time a server restarts on it ("address already in use"). Below that
 * range only a process binding the port explicitly can take it.
 */
export async function freePort(): Promise<number> {
  const range = ephemeralRange();
  if (range !== undefined && range[0] > LOWEST + 1000) {
    const span = range[0] - LOWEST;
    for (let tries = 0; tries < 200; tries++) {
      const candidate = LOWEST + Math.floor(Math.random() * span);
      if (handedOut.has(candidate)) continue;
      if ((await tryBind(candidate)) !== undefined) {
        handedOut.add(candidate);
        return candidate;
      }
    }
  }
  // No known ephemeral range (or no free port below it): let the OS pick.
  const port = await tryBind(0);
  if (port === undefined) throw new Error('no free TCP port on 127.0.0.1');
  return port;
}

/** Small networking helpers. */
import * as net from 'node:net';

/** A TCP port on 127.0.0.1 that is free right now (the OS picks it), for servers that must not collide. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

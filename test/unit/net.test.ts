/** freePort: ports that a restarted server can bind again, not ones the kernel lends to clients. */
import * as fs from 'node:fs';
import * as net from 'node:net';
import { freePort } from '../../lib/net';

const range = fs.existsSync('/proc/sys/net/ipv4/ip_local_port_range')
  ? fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number)
  : undefined;

test('ports are bindable, distinct, and below the ephemeral range', async () => {
  const ports: number[] = [];
  for (let i = 0; i < 20; i++) ports.push(await freePort());
  expect(new Set(ports).size).toBe(ports.length);
  if (range !== undefined) for (const p of ports) expect(p).toBeLessThan(range[0]!);
  // Each can be listened on now.
  for (const p of ports.slice(0, 3)) {
    const srv = net.createServer();
    await new Promise<void>((resolve, reject) => {
      srv.once('error', reject);
      srv.listen(p, '127.0.0.1', resolve);
    });
    await new Promise((resolve) => srv.close(resolve));
  }
});

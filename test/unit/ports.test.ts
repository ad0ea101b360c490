import fs from 'node:fs';
import net from 'node:net';
import { freePort } from '../../scripts/ports';

describe('freePort (the test stacks’ ports)', () => {
  it('hands out distinct ports below the kernel’s ephemeral range, each free to listen on', async () => {
    const [lo] = fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
    const ports: number[] = [];
    for (let i = 0; i < 20; i++) ports.push(await freePort());
    expect(new Set(ports).size).toBe(ports.length);
    for (const port of ports) {
      // Outgoing connections and bind(0) take ports from the ephemeral range only: none of these.
      if (lo! > 21000) expect(port).toBeLessThan(lo!);
      expect(port).toBeGreaterThanOrEqual(1024);
      const srv = net.createServer();
      await new Promise<void>((resolve, reject) => {
        srv.once('error', reject);
        srv.listen(port, '127.0.0.1', () => resolve());
      });
      await new Promise((r) => srv.close(r));
    }
  });
});

import fs from 'node:fs';
import net from 'node:net';

/** Ports this process has handed out: the kernel may give a port it just freed to the next bind(0). */
const handedOut = new Set<number>();

/** The kernel's range of ephemeral ports (what bind(0) and outgoing connections get). */
function ephemeralRange(): [number, number] {
  try {
    const [lo, hi] = fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
    if (lo && hi) return [lo, hi];
  } catch {
    // Not Linux's procfs: the kernel's usual default.
  }
  return [32768, 60999];
}

/** Whether 127.0.0.1:port can be listened on right now. */
function canListen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.once('error', () => resolve(false));
    srv.listen(port, '127.0.0.1', () => srv.close(() => resolve(true)));
  });
}

/** Below the ephemeral range; MongoDB's usual ports left alone. */
const PICK_FROM = 20000;
const AVOID = new Set([27017, 27018, 27019]);

/**
 * A port free right now on 127.0.0.1, never one this process handed out before, drawn at random
 * BELOW the kernel's ephemeral range: the ports of a stack are chosen before its processes start,
 * and a port from the ephemeral range can be taken meanwhile as the local end of any outgoing
 * connection (seen: the API's port was a driver's connection by the time the API bound it), or by
 * the next bind(0) (seen: Temporal and FerretDB drew the same one). Falls back to bind(0) when the
 * range leaves no room below it.
 */
export async function freePort(): Promise<number> {
  const top = ephemeralRange()[0] - 1;
  for (let i = 0; top - PICK_FROM > 1000 && i < 200; i++) {
    const port = PICK_FROM + Math.floor(Math.random() * (top - PICK_FROM + 1));
    if (handedOut.has(port) || AVOID.has(port)) continue;
    if (await canListen(port)) {
      handedOut.add(port);
      return port;
    }
  }
  for (;;) {
    const port = await new Promise<number>((resolve, reject) => {
      const srv = net.createServer();
      srv.once('error', reject);
      srv.listen(0, '127.0.0.1', () => {
        const { port } = srv.address() as net.AddressInfo;
        srv.close(() => resolve(port));
      });
    });
    if (!handedOut.has(port)) {
      handedOut.add(port);
      return port;
    }
  }
}

import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import type { BenchCall } from './bench-spawn';

/**
 * `npm run bench -- egress [--mb 1024] [--runs 3]` (as root, on the stack's machine): throughput from
 * a sandbox to a test host. The test host is a network namespace this bench creates (a veth to the
 * host, addresses from 198.18.0.0/15, a TCP sink that counts bytes); a sandbox with the default
 * policy sends --mb MB to it with node, through its veth, the host's forwarding and NAT. Reports
 * Gbit/s per run (measured by the sink, from the first to the last byte). Removes the namespace.
 */
export async function benchEgress(opts: { mb: number; runs: number; call: BenchCall }): Promise<Record<string, unknown>> {
  const tag = randomBytes(3).toString('hex');
  const ns = `sapb-${tag}`;
  const hostIf = `sapb${tag}`;
  const [hostAddr, addr, port] = ['198.18.254.1', '198.18.254.2', 9000];
  const ip = (...args: string[]) => execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let sandboxId: string | null = null;
  const sink = `const net=require('net');net.createServer(s=>{let n=0,t0=0n;s.on('error',()=>{});s.on('data',d=>{if(!t0)t0=process.hrtime.bigint();n+=d.length});s.on('end',()=>{const ms=Number(process.hrtime.bigint()-t0)/1e6;s.end(JSON.stringify({bytes:n,ms}))})}).listen(${port},'${addr}')`;
  let server: ReturnType<typeof spawn> | null = null;
  try {
    ip('netns', 'add', ns);
    ip('link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns);
    ip('addr', 'add', `${hostAddr}/30`, 'dev', hostIf);
    ip('link', 'set', hostIf, 'up');
    ip('-n', ns, 'addr', 'add', `${addr}/30`, 'dev', 'eth0');
    ip('-n', ns, 'link', 'set', 'eth0', 'up');
    ip('-n', ns, 'route', 'add', 'default', 'via', hostAddr);
    server = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', sink], { stdio: 'ignore' });
    for (let i = 0; ; i++) {
      const up = await new Promise<boolean>((resolve) => {
        const s = net.connect(port, addr, () => (s.destroy(), resolve(true)));
        s.once('error', () => resolve(false));
      });
      if (up) break;
      if (i > 100) throw new Error("the test host's sink did not start");
      await new Promise((r) => setTimeout(r, 100));
    }
    const r = await opts.call('POST', '/api/sandboxes', {});
    if (r.status !== 201) throw new Error(`create: ${r.status} ${JSON.stringify(r.body)}`);
    sandboxId = r.body.sandboxID as string;
    const blast = `const s=require('net').connect(${port},'${addr}',()=>{const b=Buffer.alloc(1<<20);let left=${opts.mb};const go=()=>{while(left>0){left--;if(!s.write(b))return s.once('drain',go)}s.end()};go()});let out='';s.on('data',d=>out+=d);s.on('end',()=>console.log(out))`;
    const gbits: number[] = [];
    for (let i = 0; i < opts.runs; i++) {
      const x = await opts.call('POST', `/api/sandboxes/${sandboxId}/exec/run`, { cmd: 'node', args: ['-e', blast], timeout: 120 });
      if (x.status !== 200 || x.body.exitCode !== 0) throw new Error(`blast: ${x.status} ${JSON.stringify(x.body)}`);
      const got = JSON.parse(x.body.stdout) as { bytes: number; ms: number };
      if (got.bytes !== opts.mb * 2 ** 20) throw new Error(`the sink got ${got.bytes} bytes of ${opts.mb * 2 ** 20}`);
      gbits.push(Math.round(((got.bytes * 8) / (got.ms / 1000) / 1e9) * 100) / 100);
    }
    return { mb: opts.mb, gbit_per_s: gbits };
  } finally {
    if (sandboxId) await opts.call('DELETE', `/api/sandboxes/${sandboxId}`).catch(() => undefined);
    server?.kill('SIGKILL');
    try {
      ip('netns', 'del', ns);
    } catch {
      /* gone */
    }
    try {
      ip('link', 'del', hostIf);
    } catch {
      /* went with the namespace */
    }
  }
}

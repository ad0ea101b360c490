import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import os from 'node:os';
import { api, control, eventually, T } from '../helpers/env';
import { createAgent, runSession } from '../helpers/sessions';
import { CONNECT_PROBE } from '../helpers/connect-probe';

/*
 * Egress per sandbox (sandbox/network.ts). Every destination is a test host this file creates: a
 * network namespace of its own on this machine with a veth to the host, an address from 198.18.0.0/15
 * (or, for the link-local case, 169.254.0.0/16) and a small HTTP server. Nothing is ever sent to a
 * real outside or private address, and nothing needs the internet.
 */

jest.setTimeout(120_000);

const sandboxes: string[] = [];
const agents: string[] = [];
const hosts: TestHost[] = [];
afterAll(async () => {
  await Promise.all(sandboxes.map((id) => api('DELETE', `/api/sandboxes/${id}`).catch(() => undefined)));
  await Promise.all(agents.map((id) => api('DELETE', `/v1/agents/${id}`).catch(() => undefined)));
  for (const h of hosts) h.remove();
});

/** A network namespace with one address (`addr`) reached through a veth from the host, serving HTTP on `port`. */
class TestHost {
  readonly ns: string;
  readonly addr: string;
  readonly port = 8080;
  readonly mark = randomBytes(6).toString('hex');
  private readonly hostIf: string;
  private server: ChildProcess | null = null;

  constructor(prefix: '198.18' | '169.254') {
    const tag = randomBytes(3).toString('hex');
    this.ns = `sapt-${tag}`;
    this.hostIf = `sapt${tag}`;
    const third = 1 + Math.floor(Math.random() * 250);
    const quad = 4 * Math.floor(Math.random() * 60);
    const hostAddr = `${prefix}.${third}.${quad + 1}`;
    this.addr = `${prefix}.${third}.${quad + 2}`;
    hosts.push(this);
    const ip = (...args: string[]) => execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
    ip('netns', 'add', this.ns);
    ip('link', 'add', this.hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', this.ns);
    ip('addr', 'add', `${hostAddr}/30`, 'dev', this.hostIf);
    ip('link', 'set', this.hostIf, 'up');
    ip('-n', this.ns, 'addr', 'add', `${this.addr}/30`, 'dev', 'eth0');
    ip('-n', this.ns, 'link', 'set', 'eth0', 'up');
    ip('-n', this.ns, 'link', 'set', 'lo', 'up');
    ip('-n', this.ns, 'route', 'add', 'default', 'via', hostAddr);
  }

  /** Starts the HTTP server (answers every GET with the mark) and waits until it answers from the host. */
  async serve(): Promise<this> {
    const script = `import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"${this.mark}")
    def log_message(self, *a): pass
http.server.HTTPServer(("${this.addr}", ${this.port}), H).serve_forever()`;
    this.server = spawn('ip', ['netns', 'exec', this.ns, 'python3', '-c', script], { stdio: 'ignore' });
    await eventually(
      () =>
        new Promise<boolean>((resolve) => {
          const s = net.connect(this.port, this.addr, () => {
            s.destroy();
            resolve(true);
          });
          s.once('error', () => resolve(false));
        }),
      20_000,
      100,
    );
    return this;
  }

  remove(): void {
    this.server?.kill('SIGKILL');
    try {
      execFileSync('ip', ['netns', 'del', this.ns], { stdio: 'ignore' });
    } catch {
      /* already gone */
    }
    try {
      execFileSync('ip', ['link', 'del', this.hostIf], { stdio: 'ignore' });
    } catch {
      /* went with the namespace */
    }
  }
}

async function newSandbox(body: Record<string, unknown> = {}): Promise<string> {
  const r = await api('POST', '/api/sandboxes', { body });
  if (r.status !== 201) throw new Error(`create sandbox ${JSON.stringify(body)}: ${r.status} ${JSON.stringify(r.body)}`);
  sandboxes.push(r.body.sandboxID as string);
  return r.body.sandboxID as string;
}

async function run(sandboxId: string, cmd: string, args: string[]): Promise<string> {
  const r = await api('POST', `/api/sandboxes/${sandboxId}/exec/run`, { body: { cmd, args, timeout: 60 } });
  if (r.status !== 200 || r.body.exitCode !== 0) throw new Error(`${cmd} in ${sandboxId}: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body.stdout as string;
}

async function probe(sandboxId: string, targets: string[]): Promise<Record<string, string>> {
  return JSON.parse(await run(sandboxId, 'python3', ['-c', CONNECT_PROBE, '--http', ...targets])) as Record<string, string>;
}

const REFUSED = ['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'ECONNRESET'];
function expectRefused(outcomes: Record<string, string>): void {
  for (const [target, outcome] of Object.entries(outcomes)) {
    if (!REFUSED.includes(outcome)) throw new Error(`from a sandbox, ${target} answered "${outcome}" (expected a quick refusal)`);
  }
}

async function sandboxAddress(sandboxId: string): Promise<{ address: string; gateway: string }> {
  const out = await run(sandboxId, 'bash', ['-c', "ip -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1; ip -4 route show default | awk '{print $3}'"]);
  const [address, gateway] = out.trim().split('\n');
  return { address: address!, gateway: gateway! };
}

describe('egress per sandbox', () => {
  it('reaches a test host over HTTP by default, with an address of its own and the host\'s name servers', async () => {
    const target = await new TestHost('198.18').serve();
    const sb = await newSandbox();
    const got = await probe(sb, [`${target.addr}:${target.port}`]);
    expect(got[`${target.addr}:${target.port}`]).toBe(`body:${target.mark}`);
    const { address, gateway } = await sandboxAddress(sb);
    expect(address).toMatch(/^\d+\.\d+\.\d+\.\d+$/);
    expect(gateway).toMatch(/^\d+\.\d+\.\d+\.\d+$/);
    // resolv.conf names a resolver (the host's, when it has one that is not on its loopback); nothing is queried here.
    const resolv = await run(sb, 'cat', ['/etc/resolv.conf']);
    expect(resolv).not.toMatch(/nameserver 127\./);
  });

  it("egress 'none' refuses everything, quickly", async () => {
    const target = await new TestHost('198.18').serve();
    const sb = await newSandbox({ network: { egress: 'none' } });
    expectRefused(await probe(sb, [`${target.addr}:${target.port}`]));
    // The same target answers another sandbox with the default policy: the refusal is the policy's.
    const open = await newSandbox();
    expect((await probe(open, [`${target.addr}:${target.port}`]))[`${target.addr}:${target.port}`]).toBe(`body:${target.mark}`);
  });

  it('an allow list admits only its hosts', async () => {
    const [a, b] = [await new TestHost('198.18').serve(), await new TestHost('198.18').serve()];
    const sb = await newSandbox({ network: { egress: { allow: [`${a.addr}/32`] } } });
    const got = await probe(sb, [`${a.addr}:${a.port}`, `${b.addr}:${b.port}`]);
    expect(got[`${a.addr}:${a.port}`]).toBe(`body:${a.mark}`);
    expectRefused({ [`${b.addr}:${b.port}`]: got[`${b.addr}:${b.port}`]! });
  });

  it("under 'internet': the host's services, another sandbox and a link-local host stay refused", async () => {
    const linkLocal = await new TestHost('169.254').serve();
    const [sb, other] = await Promise.all([newSandbox(), newSandbox()]);
    // A listener in the other sandbox, on every address; it answers inside that sandbox (a positive control).
    await run(other, 'bash', ['-c', `setsid nohup python3 -m http.server 8123 --bind 0.0.0.0 > /dev/null 2>&1 < /dev/null &`]);
    await eventually(async () => (await probe(other, ['127.0.0.1:8123']))['127.0.0.1:8123']!.startsWith('body:'), 20_000, 200);
    const { gateway } = await sandboxAddress(sb);
    const { address: otherAddress } = await sandboxAddress(other);
    const ports = [new URL(T.api()).port, new URL(T.mongo()).port, T.temporal().split(':')[1]!, new URL(T.hostUrl()).port];
    const hostAddrs = Object.values(os.networkInterfaces())
      .flat()
      .filter((a): a is os.NetworkInterfaceInfo => !!a && a.family === 'IPv4' && !a.internal && !a.address.startsWith('198.18.') && !a.address.startsWith('169.254.'))
      .map((a) => a.address);
    const targets = [
      ...ports.flatMap((p) => [gateway, ...hostAddrs].map((h) => `${h}:${p}`)),
      `${otherAddress}:8123`,
      `${linkLocal.addr}:${linkLocal.port}`,
    ];
    expectRefused(await probe(sb, [...new Set(targets)]));
  });

  it("an agent's policy applies to its sessions' sandboxes, and the agent shows it", async () => {
    const [a, b] = [await new TestHost('198.18').serve(), await new TestHost('198.18').serve()];
    const network = { egress: { allow: [`${a.addr}/32`] } };
    const script = `python3 -c '${CONNECT_PROBE.replace(/'/g, "'\\''")}' --http ${a.addr}:${a.port} ${b.addr}:${b.port} > "$AGENT_RESULT_PATH"`;
    const agentId = await createAgent(['bash', '-c', script], { network });
    agents.push(agentId);
    expect((await api('GET', `/v1/agents/${agentId}`)).body.network).toEqual(network);
    const { session, result } = await runSession(agentId);
    if (session.status !== 'completed' || !result.data) throw new Error(`session ${JSON.stringify(session)} ${JSON.stringify(result)}`);
    const got = result.data as Record<string, string>;
    expect(got[`${a.addr}:${a.port}`]).toBe(`body:${a.mark}`);
    expectRefused({ [`${b.addr}:${b.port}`]: got[`${b.addr}:${b.port}`]! });
    // null: back to the default.
    const cleared = await api('PATCH', `/v1/agents/${agentId}`, { body: { network: null } });
    expect(cleared.status).toBe(200);
    expect(cleared.body.network).toBeNull();
  });

  it('keeps the links and policies of sandboxes that survive a restart of the sandbox host', async () => {
    const target = await new TestHost('198.18').serve();
    const [open, closed] = [await newSandbox(), await newSandbox({ network: { egress: 'none' } })];
    const t = `${target.addr}:${target.port}`;
    expect((await probe(open, [t]))[t]).toBe(`body:${target.mark}`);
    expectRefused(await probe(closed, [t]));
    await control('kill', 'host', 'SIGKILL');
    await control('start', 'host');
    // The new host reloads the table from the sandboxes it adopts.
    await eventually(async () => (await api('POST', `/api/sandboxes/${open}/exec/run`, { body: { cmd: 'true' } })).status === 200, 60_000, 250);
    expect((await probe(open, [t]))[t]).toBe(`body:${target.mark}`);
    expectRefused(await probe(closed, [t]));
  });

  it('refuses a malformed policy with 400', async () => {
    for (const network of [{ egress: 'sometimes' }, { egress: { allow: ['not-a-cidr'] } }, { egress: { allow: ['10.0.0.0/40'] } }]) {
      const r = await api('POST', '/api/sandboxes', { body: { network } });
      if (r.status === 201) sandboxes.push(r.body.sandboxID as string);
      expect(r.status).toBe(400);
      expect(r.body.error.type).toBe('invalid_request');
      const agent = await api('POST', '/v1/agents', { body: { core: 'bash', entrypoint: ['true'], network } });
      if (agent.status === 201) agents.push(agent.body.id as string);
      expect(agent.status).toBe(400);
    }
  });
});

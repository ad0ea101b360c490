import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { api, control, eventually, stackPid, T } from '../../helpers/env';
import { createAgent, runSession } from '../../helpers/sessions';
import { CONNECT_PROBE } from '../../helpers/connect-probe';
import { TestHost } from '../../helpers/test-host';
import { FakeDns } from '../../helpers/fake-dns';
import { otherOrgKey } from '../../helpers/checkpoints';
import { newSandbox as createSandbox } from '../../helpers/sandboxes';

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
const testHost = (prefix: '198.18' | '169.254'): TestHost => {
  const h = new TestHost(prefix);
  hosts.push(h);
  return h;
};
/** A sandbox deleted after the file's tests. */
// Root inside (raw sockets, its own routes): the strongest attacker a sandbox can hold.
const newSandbox = (body: Record<string, unknown> = {}) => createSandbox({ user: 'root', ...body }, { created: sandboxes });
afterAll(async () => {
  await Promise.all(sandboxes.map((id) => api('DELETE', `/api/sandboxes/${id}`).catch(() => undefined)));
  await Promise.all(agents.map((id) => api('DELETE', `/v1/agents/${id}`).catch(() => undefined)));
  for (const h of hosts) h.remove();
});

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
  it("reaches a test host over HTTP by default, with an address of its own and the host's name servers", async () => {
    const target = await testHost('198.18').serve();
    const sb = await newSandbox();
    const got = await probe(sb, [`${target.addr}:${target.port}`]);
    expect(got[`${target.addr}:${target.port}`]).toBe(`body:${target.mark}`);
    const { address, gateway } = await sandboxAddress(sb);
    expect(address).toMatch(/^\d+\.\d+\.\d+\.\d+$/);
    expect(gateway).toMatch(/^\d+\.\d+\.\d+\.\d+$/);
    // Its resolver is the one address every sandbox names (the host's resolver answers it).
    expect(await run(sb, 'cat', ['/etc/resolv.conf'])).toBe('nameserver 169.254.53.53\n');
  });

  it("egress 'none' refuses everything, quickly", async () => {
    const target = await testHost('198.18').serve();
    const sb = await newSandbox({ network: { egress: 'none' } });
    expectRefused(await probe(sb, [`${target.addr}:${target.port}`]));
    // The same target answers another sandbox with the default policy: the refusal is the policy's.
    const open = await newSandbox();
    expect((await probe(open, [`${target.addr}:${target.port}`]))[`${target.addr}:${target.port}`]).toBe(`body:${target.mark}`);
  });

  it('an allow list admits only its hosts', async () => {
    const [a, b] = [await testHost('198.18').serve(), await testHost('198.18').serve()];
    const sb = await newSandbox({ network: { egress: { allow: [`${a.addr}/32`] } } });
    const got = await probe(sb, [`${a.addr}:${a.port}`, `${b.addr}:${b.port}`]);
    expect(got[`${a.addr}:${a.port}`]).toBe(`body:${a.mark}`);
    expectRefused({ [`${b.addr}:${b.port}`]: got[`${b.addr}:${b.port}`]! });
  });

  it("under 'internet': the host's services, another sandbox and a link-local host stay refused", async () => {
    const linkLocal = await testHost('169.254').serve();
    const [sb, other] = await Promise.all([newSandbox(), newSandbox()]);
    // A listener in the other sandbox, on every address; it answers inside that sandbox (a positive control).
    // (Not `python3 -m http.server`: it looks up the name of 0.0.0.0 first, and no upstream answers here.)
    const listener = 'import http.server, socketserver; socketserver.TCPServer(("0.0.0.0", 8123), http.server.SimpleHTTPRequestHandler).serve_forever()';
    await run(other, 'bash', ['-c', `setsid nohup python3 -c '${listener}' > /dev/null 2>&1 < /dev/null &`]);
    await eventually(async () => (await probe(other, ['127.0.0.1:8123']))['127.0.0.1:8123']!.startsWith('body:'), 20_000, 200);
    const { gateway } = await sandboxAddress(sb);
    const { address: otherAddress } = await sandboxAddress(other);
    const ports = [new URL(T.api()).port, new URL(T.mongo()).port, T.temporal().split(':')[1]!, new URL(T.hostUrl()).port];
    const hostAddrs = Object.values(os.networkInterfaces())
      .flat()
      .filter(
        (a): a is os.NetworkInterfaceInfo => !!a && a.family === 'IPv4' && !a.internal && !a.address.startsWith('198.18.') && !a.address.startsWith('169.254.'),
      )
      .map((a) => a.address);
    const targets = [...ports.flatMap((p) => [gateway, ...hostAddrs].map((h) => `${h}:${p}`)), `${otherAddress}:8123`, `${linkLocal.addr}:${linkLocal.port}`];
    expectRefused(await probe(sb, [...new Set(targets)]));
  });

  it("an agent's policy applies to its sessions' sandboxes, and the agent shows it", async () => {
    const [a, b] = [await testHost('198.18').serve(), await testHost('198.18').serve()];
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
    const target = await testHost('198.18').serve();
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
    for (const network of [{ egress: 'sometimes' }, { egress: { allow: ['not a name or cidr'] } }, { egress: { allow: ['10.0.0.0/40'] } }]) {
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

/** The resolver attacks (test/helpers/dns-attack.py), run with `python3 -c` or from /tmp/dns-attack.py. */
const DNS_ATTACK = fs.readFileSync(path.join(__dirname, '../../helpers/dns-attack.py'), 'utf8');
async function attack(sandboxId: string, args: string[]): Promise<any> {
  return JSON.parse(await run(sandboxId, 'python3', ['-c', DNS_ATTACK, ...args]));
}
async function installAttack(sandboxId: string): Promise<void> {
  await run(sandboxId, 'python3', ['-c', 'import sys; open("/tmp/dns-attack.py", "w").write(sys.argv[1])', DNS_ATTACK]);
}
/** Starts `cmd` in the sandbox, detached; it outlives the exec. */
async function background(sandboxId: string, cmd: string): Promise<void> {
  await run(sandboxId, 'bash', ['-c', `setsid nohup ${cmd} > /dev/null 2>&1 < /dev/null &`]);
}
async function exists(sandboxId: string, file: string): Promise<boolean> {
  const r = await api('POST', `/api/sandboxes/${sandboxId}/exec/run`, { body: { cmd: 'test', args: ['-e', file] } });
  return r.status === 200 && r.body.exitCode === 0;
}
/** Open descriptors of the sandbox host process (the resolver runs in it). */
function hostFds(): () => number {
  const pid = stackPid('host');
  return () => fs.readdirSync(`/proc/${pid}/fd`).length;
}

describe("names: the sandboxes' resolver, allow lists of names, live changes", () => {
  const dns = new FakeDns();
  beforeAll(async () => {
    await dns.listen();
  });
  afterAll(async () => {
    await dns.close();
  });
  const isRefusedName = (outcome: string | undefined) => !!outcome && outcome.startsWith('dns:');

  it('resolves names through the host under the default policy, and reaches a test host by name', async () => {
    const target = await testHost('198.18').serve();
    dns.set('web.sap-net.test', target.addr);
    const sb = await newSandbox();
    const t = `web.sap-net.test:${target.port}`;
    expect((await probe(sb, [t]))[t]).toBe(`body:${target.mark}`);
    // An unknown name is NXDOMAIN from the upstream, passed on.
    const missing = (await probe(sb, ['missing.sap-net.test:80']))['missing.sap-net.test:80'];
    expect(isRefusedName(missing)).toBe(true);
  });

  it('an allow list of names and wildcards admits the addresses of its names only; a name resolving into a refused range stays refused', async () => {
    const [a, b, c, linkLocal] = [
      await testHost('198.18').serve(),
      await testHost('198.18').serve(),
      await testHost('198.18').serve(),
      await testHost('169.254').serve(),
    ];
    dns
      .set('a.allowed.sap-net.test', a.addr)
      .set('exact.sap-net.test', c.addr)
      .set('b.other.sap-net.test', b.addr)
      .set('meta.allowed.sap-net.test', linkLocal.addr);
    const sb = await newSandbox({ network: { egress: { allow: ['*.Allowed.sap-net.test', 'exact.sap-net.test'] } } });
    const asked = dns.asked.length;
    const got = await probe(sb, [
      `a.allowed.sap-net.test:${a.port}`,
      `exact.sap-net.test:${c.port}`,
      `b.other.sap-net.test:${b.port}`,
      `${b.addr}:${b.port}`,
      `meta.allowed.sap-net.test:${linkLocal.port}`,
    ]);
    expect(got[`a.allowed.sap-net.test:${a.port}`]).toBe(`body:${a.mark}`);
    expect(got[`exact.sap-net.test:${c.port}`]).toBe(`body:${c.mark}`);
    // A name off the list is refused by the resolver itself: it never reaches the upstream.
    expect(isRefusedName(got[`b.other.sap-net.test:${b.port}`])).toBe(true);
    expect(dns.asked.slice(asked)).not.toContain('b.other.sap-net.test');
    // An address no allowed name resolved to is refused, and so is link-local even through an allowed name.
    expectRefused({ b: got[`${b.addr}:${b.port}`]!, linkLocal: got[`meta.allowed.sap-net.test:${linkLocal.port}`]! });
    // The policy as the API shows it (normalised), and OpenComputer's allowed-hosts view.
    const view = await api('GET', `/api/sandboxes/${sb}`);
    expect(view.body.network).toEqual({ egress: { allow: ['*.allowed.sap-net.test', 'exact.sap-net.test'] } });
    const allowed = await api('GET', `/api/sandboxes/${sb}/allowed-hosts`);
    expect(allowed.status).toBe(200);
    expect(allowed.body).toMatchObject({ sandboxID: sb, egressAllowlist: ['*.allowed.sap-net.test', 'exact.sap-net.test'], perSecretAllowedHosts: {} });
  });

  it("'none' gets no name service at all", async () => {
    const target = await testHost('198.18').serve();
    dns.set('none.sap-net.test', target.addr);
    const sb = await newSandbox({ network: { egress: 'none' } });
    const asked = dns.asked.length;
    const out = (await probe(sb, [`none.sap-net.test:${target.port}`]))[`none.sap-net.test:${target.port}`];
    expect(isRefusedName(out)).toBe(true);
    expect(dns.asked.slice(asked)).not.toContain('none.sap-net.test');
  });

  it('a policy changed on a running sandbox takes effect at once', async () => {
    const [a, b] = [await testHost('198.18').serve(), await testHost('198.18').serve()];
    dns.set('live-a.sap-net.test', a.addr).set('live-b.sap-net.test', b.addr);
    const sb = await newSandbox({ network: { egress: 'none' } });
    const ta = `live-a.sap-net.test:${a.port}`;
    const tb = `live-b.sap-net.test:${b.port}`;
    expect(isRefusedName((await probe(sb, [ta]))[ta])).toBe(true);

    const open = await api('PUT', `/api/sandboxes/${sb}/network`, { body: { egress: 'internet' } });
    expect(open.status).toBe(200);
    expect(open.body.network).toEqual({ egress: 'internet' });
    const opened = await probe(sb, [ta, tb]);
    expect(opened[ta]).toBe(`body:${a.mark}`);
    expect(opened[tb]).toBe(`body:${b.mark}`);

    const narrow = await api('PUT', `/api/sandboxes/${sb}/network`, { body: { egress: { allow: ['live-a.sap-net.test'] } } });
    expect(narrow.status).toBe(200);
    const narrowed = await probe(sb, [ta, tb, `${b.addr}:${b.port}`]);
    expect(narrowed[ta]).toBe(`body:${a.mark}`);
    expect(isRefusedName(narrowed[tb])).toBe(true);
    expectRefused({ b: narrowed[`${b.addr}:${b.port}`]! });
    expect((await api('GET', `/api/sandboxes/${sb}`)).body.network).toEqual({ egress: { allow: ['live-a.sap-net.test'] } });

    // From a list of names to none: what the resolver admitted is closed too.
    expect((await api('PUT', `/api/sandboxes/${sb}/network`, { body: { egress: 'none' } })).status).toBe(200);
    expectRefused({ a: (await probe(sb, [`${a.addr}:${a.port}`]))[`${a.addr}:${a.port}`]! });
  });

  it('refuses a bad policy change with 400, a stopped sandbox with 409, and another organisation with 404', async () => {
    const sb = await newSandbox();
    for (const body of [{ egress: 'sometimes' }, { egress: { allow: ['bad name!'] } }, { egress: { allow: ['*'] } }, {}]) {
      const r = await api('PUT', `/api/sandboxes/${sb}/network`, { body });
      if (Object.keys(body).length === 0) {
        // An empty body is the default policy.
        expect(r.status).toBe(200);
        continue;
      }
      expect(r.status).toBe(400);
      expect(r.body.error.type).toBe('invalid_request');
    }
    expect((await api('PUT', `/api/sandboxes/sb-doesnotexist/network`, { body: { egress: 'none' } })).status).toBe(404);
    const keyB = await otherOrgKey();
    for (const [method, path, body] of [
      ['PUT', `/api/sandboxes/${sb}/network`, { egress: 'none' }],
      ['GET', `/api/sandboxes/${sb}/allowed-hosts`, undefined],
    ] as const) {
      const r = await api(method, path, { key: keyB, body });
      expect([method, r.status, r.body?.error?.type]).toEqual([method, 404, 'not_found']);
    }
    expect((await api('GET', `/api/sandboxes/${sb}`)).body.network).toEqual({ egress: 'internet' });
    expect((await api('DELETE', `/api/sandboxes/${sb}`)).status).toBe(200);
    const stopped = await api('PUT', `/api/sandboxes/${sb}/network`, { body: { egress: 'none' } });
    expect(stopped.status).toBe(409);
    expect(stopped.body.error.type).toBe('conflict');
  });

  it("a sandbox cannot query the resolver under another sandbox's address (egress none or internet): the host drops the packet", async () => {
    const [closed, open, victim] = await Promise.all([newSandbox({ network: { egress: 'none' } }), newSandbox(), newSandbox()]);
    const { address: victimAddress } = await sandboxAddress(victim);
    await installAttack(victim);
    const tag = `spoof-${Date.now().toString(36)}`;
    const fromClosed = `${tag}.closed.sap-net.test`;
    const fromOpen = `${tag}.open.sap-net.test`;
    const control = `${tag}.control.sap-net.test`;
    // The victim listens on the port the spoofed queries name as their source.
    await background(victim, `python3 /tmp/dns-attack.py listen 40053 ${control} /tmp/heard.json`);
    await eventually(() => exists(victim, '/tmp/heard.json.ready'), 30_000, 100);
    expect(await attack(closed, ['raw', victimAddress, '40053', fromClosed])).toEqual({ sent: true });
    expect(await attack(open, ['raw', victimAddress, '40053', fromOpen])).toEqual({ sent: true });
    // The same hand-built packet from the victim itself, with its own address, is answered: the
    // answer to it ends the listener, and shows that the raw packets are well formed.
    expect(await attack(victim, ['raw', victimAddress, '40053', control])).toEqual({ sent: true });
    await eventually(() => exists(victim, '/tmp/heard.json'), 70_000, 100);
    // Together, so that a failure shows whether the control query reached the upstream at all.
    expect({ heard: JSON.parse(await run(victim, 'cat', ['/tmp/heard.json'])), upstreamAsked: dns.asked.includes(control) }).toEqual({
      heard: { names: [control] },
      upstreamAsked: true,
    });
    expect(dns.asked).not.toContain(fromClosed);
    expect(dns.asked).not.toContain(fromOpen);
  });

  it("a 'none' sandbox's plain queries, UDP and TCP, reach no resolver and never leave the host", async () => {
    const tag = `plain-${Date.now().toString(36)}.sap-net.test`;
    const closed = await newSandbox({ network: { egress: 'none' } });
    for (const proto of ['udp', 'tcp']) {
      const got = (await attack(closed, ['ask', proto, `${proto}.closed.${tag}`])) as { outcome: string };
      expect([proto, got.outcome.startsWith('answer:')]).toEqual([proto, false]);
    }
    expect(dns.asked.filter((n) => n.endsWith(`closed.${tag}`))).toEqual([]);
    // The same queries from an open sandbox are answered (NXDOMAIN from the upstream, over UDP for both).
    const open = await newSandbox();
    for (const proto of ['udp', 'tcp']) expect([proto, (await attack(open, ['ask', proto, `${proto}.open.${tag}`])).outcome]).toEqual([proto, 'answer:3']);
  });

  it('a flood of queries from one sandbox, UDP and pipelined TCP, holds a bounded number of host descriptors; another sandbox is answered meanwhile', async () => {
    const tag = `flood${Date.now().toString(36)}`;
    // The upstream never answers the flood's names: each one asked would keep the resolver waiting.
    dns.silence('.hole.sap-net.test').set('meanwhile.sap-net.test', '198.18.9.9');
    const [flooder, other] = await Promise.all([newSandbox(), newSandbox()]);
    await installAttack(flooder);
    const fds = hostFds();
    const before = fds();
    let most = before;
    const sampler = setInterval(() => {
      try {
        most = Math.max(most, fds());
      } catch {
        // the host restarted: the assertion below reads it again
      }
    }, 20);
    try {
      await background(flooder, `python3 /tmp/dns-attack.py flood ${tag} 4000 32 500 /tmp`);
      await eventually(() => exists(flooder, '/tmp/flooding'), 90_000, 100);
      const got = await run(other, 'python3', ['-c', 'import socket, sys; print(socket.gethostbyname(sys.argv[1]))', 'meanwhile.sap-net.test']);
      expect(got.trim()).toBe('198.18.9.9');
      await run(flooder, 'touch', ['/tmp/stop']);
      await eventually(() => exists(flooder, '/tmp/done'), 90_000, 100);
      const sent = JSON.parse(await run(flooder, 'cat', ['/tmp/done'])) as { udp: number; tcp: number; connections: number };
      expect(sent.udp).toBeGreaterThanOrEqual(4000);
      expect(sent.connections).toBeGreaterThan(0);
    } finally {
      clearInterval(sampler);
    }
    most = Math.max(most, fds());
    // The flood reached the resolver and the upstream (a positive control)…
    expect(dns.asked.some((n) => n.endsWith(`.${tag}.hole.sap-net.test`))).toBe(true);
    // …and cost the host a bounded number of descriptors (before: one upstream socket per query).
    expect(most - before).toBeLessThan(100);
  });
});

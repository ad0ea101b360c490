import os from 'node:os';
import { api, control, eventually, T } from '../helpers/env';
import { createAgent, runSession } from '../helpers/sessions';
import { CONNECT_PROBE } from '../helpers/connect-probe';
import { TestHost } from '../helpers/test-host';

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
afterAll(async () => {
  await Promise.all(sandboxes.map((id) => api('DELETE', `/api/sandboxes/${id}`).catch(() => undefined)));
  await Promise.all(agents.map((id) => api('DELETE', `/v1/agents/${id}`).catch(() => undefined)));
  for (const h of hosts) h.remove();
});

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
    const target = await testHost('198.18').serve();
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

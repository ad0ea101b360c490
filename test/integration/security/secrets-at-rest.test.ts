/**
 * Secret values at rest, tried as an attacker who can read Temporal (its API or Web UI) and the
 * stack's files but holds no API key: an agent's env values must appear in no workflow history
 * and in no file under the data directory (Temporal's SQLite files, FerretDB's, the logs), and a
 * signed file URL's token (or the API key) in no log line. The sandbox still sees its env.
 */
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import { api, control, eventually, T, unique, withMongo } from '../../helpers/env';
import { bashAgent, runSession, sandboxOf, startSession, waitForStatus } from '../../helpers/sessions';
import { hostSh, newSandbox } from '../../helpers/sandboxes';

jest.setTimeout(240_000);

const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');
const canaryOf = (what: string) => `canary-${what}-${randomBytes(16).toString('hex')}`;

/** The agent writes the hash of its env value (never the value) as its result. */
const HASH_AGENT = 'printf \'{"h":"%s"}\' "$(printf %s "$CANARY_VAL" | sha256sum | cut -d" " -f1)" > /tmp/agent_result.json';

/** Every regular file under `dir` (recursively); files that vanish while walking are skipped. */
function filesUnder(dir: string): string[] {
  const out: string[] = [];
  let entries: fs.Dirent[];
  try {
    entries = fs.readdirSync(dir, { withFileTypes: true });
  } catch {
    return out;
  }
  for (const e of entries) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...filesUnder(p));
    else if (e.isFile()) out.push(p);
  }
  return out;
}

/** The files under `dir` whose raw bytes contain `needle`. */
function filesContaining(dir: string, needle: string): string[] {
  const bytes = Buffer.from(needle, 'utf8');
  return filesUnder(dir).filter((f) => {
    try {
      return fs.readFileSync(f).includes(bytes);
    } catch {
      return false;
    }
  });
}

/** A workflow's whole history as text, each payload's bytes decoded (as the Web UI shows them). */
async function historyText(client: Client, workflowId: string): Promise<string> {
  const history = await client.workflow.getHandle(workflowId).fetchHistory();
  const parts: string[] = [];
  const walk = (v: unknown): void => {
    if (v instanceof Uint8Array) parts.push(Buffer.from(v).toString('utf8'));
    else if (typeof v === 'string') parts.push(v);
    else if (Array.isArray(v)) v.forEach(walk);
    else if (v && typeof v === 'object') for (const x of Object.values(v)) walk(x);
  };
  walk(history);
  return parts.join('\n');
}

/**
 * What any user of the host can read of its processes: every command line (world-readable), and
 * the environment of every process of the host's own pid namespace (a sandbox's processes, in
 * namespaces of their own, rightly hold their values). `helpers`: the entry helpers' command lines.
 */
function hostProcesses(needles: string[]): { leaks: string[]; helpers: string[]; sandboxed: string[] } {
  const hostNs = fs.readlinkSync('/proc/self/ns/pid');
  const leaks: string[] = [];
  const helpers: string[] = [];
  /** Command lines of processes in a pid namespace other than the host's (the sandboxes'). */
  const sandboxed: string[] = [];
  for (const pid of fs.readdirSync('/proc').filter((n) => /^\d+$/.test(n))) {
    const read = (f: string) => {
      try {
        return fs.readFileSync(`/proc/${pid}/${f}`);
      } catch {
        return null; // gone meanwhile
      }
    };
    const cmdline = read('cmdline');
    if (!cmdline) continue;
    const shown = cmdline.toString('utf8').split('\0').join(' ');
    if (shown.includes('sap-sandbox-enter')) helpers.push(shown);
    let inHostNs = false;
    try {
      inHostNs = fs.readlinkSync(`/proc/${pid}/ns/pid`) === hostNs;
    } catch {
      // gone meanwhile
    }
    if (!inHostNs) sandboxed.push(shown);
    const environ = inHostNs ? read('environ') : null;
    for (const n of needles) {
      if (cmdline.includes(n)) leaks.push(`pid ${pid} cmdline holds ${n.slice(0, 14)}…: ${shown.split(n).join('<canary>').slice(0, 300)}`);
      if (environ?.includes(n)) leaks.push(`pid ${pid} environ holds ${n.slice(0, 14)}… (${shown.slice(0, 120)})`);
    }
  }
  return { leaks, helpers, sandboxed };
}

describe('secret values at rest', () => {
  it("keeps an agent's env values out of Temporal's history and every data file, while its sandboxes still get them", async () => {
    const created = canaryOf('create');
    const patched = canaryOf('patch');
    const agentId = await bashAgent(HASH_AGENT, { env: { CANARY_VAL: created, OTHER_VAR: 'x' } });
    const instances: string[] = [];
    const connection = await Connection.connect({ address: T.temporal() });
    try {
      // The value set at creation reaches an instance; the one set by PATCH reaches sessions and batch items.
      const inst = await api('POST', `/v1/agents/${agentId}/instances`, { body: {} });
      expect(inst.status).toBe(201);
      instances.push(inst.body.id);
      const running = await eventually(
        async () => {
          const r = await api('GET', `/v1/agents/${agentId}/instances/${inst.body.id}`);
          if (r.body.status === 'failed') throw new Error(`instance failed: ${JSON.stringify(r.body)}`);
          return r.body.status === 'running' ? r.body : undefined;
        },
        90_000,
        200,
      );
      expect(await hostSh(running.sandbox_id, 'printf %s "$CANARY_VAL" | sha256sum | cut -d" " -f1')).toBe(`${sha256(created)}\n`);

      expect((await api('PATCH', `/v1/agents/${agentId}`, { body: { env: { CANARY_VAL: patched } } })).status).toBe(200);
      const agent = await api('GET', `/v1/agents/${agentId}`);
      expect(agent.body.env).toEqual({ CANARY_VAL: '[set]' });
      const { session, result } = await runSession(agentId);
      expect(session.status).toBe('completed');
      expect(result.data).toEqual({ h: sha256(patched) });

      const batch = await api('POST', `/v1/agents/${agentId}/batches`, { body: { items: [{ input: {} }] } });
      expect(batch.status).toBe(201);
      await eventually(async () => (await api('GET', `/v1/agents/${agentId}/batches/${batch.body.id}`)).body.status === 'completed', 120_000, 250);
      const lines = (await (await fetch(`${T.api()}/v1/agents/${agentId}/batches/${batch.body.id}/results`, { headers: { 'x-api-key': T.key() } })).text())
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as { session_id: string; status: string; data: unknown });
      expect(lines).toEqual([expect.objectContaining({ status: 'completed', data: { h: sha256(patched) } })]);
      await waitForStatus(agentId, lines[0]!.session_id, ['completed']);

      // (a) Every history, read through Temporal's API with payloads decoded: the env's names are
      // there (the run spec was found and decoded), its values are not.
      const client = new Client({ connection });
      for (const id of [inst.body.id, session.id, batch.body.id, lines[0]!.session_id]) {
        const text = await historyText(client, id);
        expect(text).toContain('CANARY_VAL');
        expect(text).not.toContain(created);
        expect(text).not.toContain(patched);
      }

      // (b) Every file of the stack: Temporal's SQLite files (which hold these workflows: the
      // session's id is found there), FerretDB's, the logs.
      const dataDir = T.dataDir();
      expect(filesContaining(dataDir, session.id).some((f) => path.basename(f).startsWith('temporal.db'))).toBe(true);
      expect(filesContaining(dataDir, created)).toEqual([]);
      expect(filesContaining(dataDir, patched)).toEqual([]);
    } finally {
      for (const id of instances) await api('DELETE', `/v1/agents/${agentId}/instances/${id}`);
      await connection.close();
    }
  });

  it('seals the env of an agent written before values were sealed: in its sessions at once, in MongoDB at the next API start', async () => {
    const canary = canaryOf('legacy');
    const agentId = await bashAgent(HASH_AGENT);
    const agents = (c: import('mongodb').MongoClient) => c.db().collection<{ id: string; env: Record<string, string>; envSealed?: boolean }>('agents');
    // What an older version wrote: the value in clear, no envSealed.
    await withMongo((c) => agents(c).updateOne({ id: agentId }, { $set: { env: { CANARY_VAL: canary } }, $unset: { envSealed: '' } }));
    const first = await runSession(agentId);
    expect(first.result.data).toEqual({ h: sha256(canary) });
    const connection = await Connection.connect({ address: T.temporal() });
    try {
      const text = await historyText(new Client({ connection }), first.session.id);
      expect(text).toContain('CANARY_VAL');
      expect(text).not.toContain(canary);
    } finally {
      await connection.close();
    }
    await control('kill', 'api');
    await control('start', 'api');
    await eventually(async () => (await api('GET', `/v1/agents/${agentId}`)).status === 200, 60_000, 200);
    const doc = await withMongo((c) => agents(c).findOne({ id: agentId }));
    expect(doc?.envSealed).toBe(true);
    expect(doc?.env.CANARY_VAL).toMatch(/^v1:/);
    expect(JSON.stringify(doc)).not.toContain(canary);
    expect((await runSession(agentId)).result.data).toEqual({ h: sha256(canary) });
  });

  it("keeps env and secret-store values out of the host's process list while a sandbox's processes run with them", async () => {
    const fromEnvs = canaryOf('envs');
    const fromStore = canaryOf('store');
    const fromExec = canaryOf('exec');
    const fromAgent = canaryOf('agent');
    const store = unique('ps-store');
    expect((await api('POST', '/api/secret-stores', { body: { name: store } })).status).toBe(201);
    expect((await api('PUT', `/api/secret-stores/${store}/secrets/STORE_VAL`, { body: { value: fromStore } })).status).toBe(200);
    // A session whose entrypoint says it has started (the hash of its value) and then waits.
    const agentId = await bashAgent(
      'printf %s "$CANARY_VAL" | sha256sum | cut -d" " -f1 > /tmp/ready; while [ ! -e /tmp/go ]; do sleep 0.1; done; ' +
        'printf \'{"h":"%s"}\' "$(cat /tmp/ready)" > /tmp/agent_result.json',
      { env: { CANARY_VAL: fromAgent } },
    );
    let sb: string | undefined;
    let sessionSb: string | undefined;
    try {
      sb = await newSandbox({ secretStore: store, envs: { ENV_VAL: fromEnvs } });
      // A long exec command (with a value of its own) and a terminal: entry helpers that stay.
      const exec = await api('POST', `/api/sandboxes/${sb}/exec`, { body: { cmd: 'sleep', args: ['317'], envs: { EXEC_VAL: fromExec } } });
      expect(exec.status).toBe(201);
      expect((await api('POST', `/api/sandboxes/${sb}/pty`, { body: {} })).status).toBe(201);
      const session = await startSession(agentId, { input: {} });
      sessionSb = sandboxOf(session.id);
      const ready = await eventually(async () => (await hostSh(sessionSb!, 'cat /tmp/ready 2>/dev/null || true')).trim() || undefined, 90_000, 200);
      expect(ready).toBe(sha256(fromAgent));
      // The sandbox sees every value: a new command, and the running exec command (its environ, read inside).
      expect(await hostSh(sb, 'printf %s "$ENV_VAL $STORE_VAL" | sha256sum | cut -d" " -f1')).toBe(`${sha256(`${fromEnvs} ${fromStore}`)}\n`);
      const execEnv = await hostSh(
        sb,
        'for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = sleep ] && tr "\\0" "\\n" < $p/environ | grep "^EXEC_VAL=" | cut -d= -f2-; done | sha256sum | cut -d" " -f1',
      );
      expect(execEnv).toBe(`${sha256(`${fromExec}\n`)}\n`);

      // The attack: read every process of the host while they run.
      const { leaks, helpers, sandboxed } = hostProcesses([fromEnvs, fromStore, fromExec, fromAgent]);
      expect(leaks).toEqual([]);
      // The scan did see the helpers that carry these values: the entrypoint's (-L), the terminal's (-T); and the exec's
      // command, which the sandbox's exec server (its pid 1, docs/exec-server.md) started from inside, with no helper on the host.
      expect(helpers.some((h) => h.includes(` -L `))).toBe(true);
      expect(helpers.some((h) => h.includes(` -T `))).toBe(true);
      expect(helpers.filter((h) => h.includes(' -- sleep 317'))).toEqual([]);
      expect(sandboxed.filter((c) => c.trim() === 'sleep 317').length).toBe(1);

      await hostSh(sessionSb, 'touch /tmp/go');
      expect((await waitForStatus(agentId, session.id, ['completed', 'failed'], 90_000)).status).toBe('completed');
      expect((await api('GET', `/v1/agents/${agentId}/sessions/${session.id}/result`)).body.data).toEqual({ h: sha256(fromAgent) });
    } finally {
      if (sessionSb) await hostSh(sessionSb, 'touch /tmp/go').catch(() => undefined);
      if (sb) await api('DELETE', `/api/sandboxes/${sb}`);
      await api('DELETE', `/api/secret-stores/${store}`);
    }
  });

  it("keeps signed file URLs' tokens and API keys out of every log", async () => {
    const sb = await newSandbox({});
    try {
      const mk = async (kind: 'download' | 'upload') => {
        const r = await api('POST', `/api/sandboxes/${sb}/files/${kind}-url`, { body: { path: '/workspace/t.txt' } });
        expect(r.status).toBe(200);
        return r.body.url as string;
      };
      const up = await mk('upload');
      const down = await mk('download');
      const marker = unique('reqid');
      // Used the right way, the wrong way (403), and with a trailing query: each is a log line.
      expect((await fetch(up, { method: 'PUT', body: 'x', headers: { 'content-type': 'text/plain', 'x-request-id': `${marker}-up` } })).status).toBe(204);
      expect((await fetch(down, { headers: { 'x-request-id': `${marker}-down` } })).status).toBe(200);
      expect((await fetch(down, { method: 'PUT', body: 'y', headers: { 'x-request-id': `${marker}-wrong` } })).status).toBe(403);
      expect((await fetch(`${down}?x=1`, { headers: { 'x-request-id': `${marker}-query` } })).status).toBe(200);
      const logDir = T.logDir();
      // The API's lines are written asynchronously: wait for the last one before reading.
      await eventually(async () => filesContaining(logDir, `${marker}-query`).length > 0, 30_000, 200);
      for (const url of [up, down]) {
        const token = url.split('/api/files/')[1]!;
        expect(filesContaining(logDir, token)).toEqual([]);
        // Nor its signature alone (what makes the URL usable).
        expect(filesContaining(logDir, token.split('.')[1]!)).toEqual([]);
      }
      expect(filesContaining(logDir, T.key())).toEqual([]);
      expect(filesContaining(logDir, T.hostToken())).toEqual([]);
    } finally {
      await api('DELETE', `/api/sandboxes/${sb}`);
    }
  });
});

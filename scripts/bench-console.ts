import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import type { Page } from 'playwright-core';
import { connectStore, type AgentDoc, type SessionDoc, type Store } from '../store';
import { agentKey, findAgent, insertAgent } from '../store/agents';
import { batchesOf, insertBatch, type BatchDoc } from '../store/batches';
import { listName, removeListed } from '../store/listing';
import { deleteUnstartedSessions, insertSessionsOnce, newSessionDoc } from '../store/sessions';
import { encodeCursor } from '../store/page';
import { orgOfKeyHash } from '../store/orgs';
import { hashSecret } from '../lib/ids';
import { launchChromium, median, signedInContext } from './console-browser';

type Call = (method: string, path: string, body?: unknown) => Promise<{ status: number; body: any }>;

/** Gzipped bytes of the files of a directory (recursively) whose names match. */
function gzipped(dir: string, match: RegExp): { files: number; bytes: number; gzipBytes: number } {
  let files = 0;
  let bytes = 0;
  let gzipBytes = 0;
  for (const e of fs.readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (!e.isFile() || !match.test(e.name)) continue;
    const data = fs.readFileSync(path.join(e.parentPath, e.name));
    files++;
    bytes += data.length;
    gzipBytes += zlib.gzipSync(data, { level: 9 }).length;
  }
  return { files, bytes, gzipBytes };
}

/** Milliseconds from the navigation's start until the page shows its content (no "Loading…" left), as the page's clock reads it. */
async function firstRender(page: Page, url: string, ready: string): Promise<number> {
  await page.goto('about:blank');
  await page.goto(url);
  await page.waitForSelector(ready);
  // A function, not a string: the console's CSP refuses eval.
  await page.waitForFunction(() => !(globalThis as any).document.querySelector('.loading'), undefined, { polling: 'raf' });
  return (await page.evaluate('performance.now()')) as number;
}

/** Seeds `n` agents (copies of `agent`) and `n` batches of it, created over the past n seconds; returns them for the cleanup. */
async function seedLists(store: Store, agent: AgentDoc, n: number, tag: string): Promise<{ agents: AgentDoc[]; batches: BatchDoc[] }> {
  const agents: AgentDoc[] = [];
  const batches: BatchDoc[] = [];
  const t0 = Date.now() - 1000;
  for (let i = 0; i < n; i++) {
    const at = new Date(t0 - (n - i) * 1000);
    const id = `${agent.id}-${i.toString(36)}`;
    agents.push({ ...agent, _id: agentKey(agent.orgId, id), id, display_name: id, created_at: at });
    batches.push({
      _id: `batch_bench${tag}${i.toString(36).padStart(4, '0')}`,
      orgId: agent.orgId,
      agent_id: agent.id,
      status: i % 2 ? 'completed' : 'cancelled',
      total: 1,
      concurrency: 1,
      max_attempts: 1,
      counts: { pending: 0, running: 0, completed: 1, failed: 0 },
      items_hash: 'bench',
      idempotency_key: null,
      created_at: at,
      updated_at: at,
      completed_at: at,
    });
  }
  for (let i = 0; i < n; i += 16) {
    await Promise.all([...agents.slice(i, i + 16).map((a) => insertAgent(store, a)), ...batches.slice(i, i + 16).map((b) => insertBatch(store, b))]);
  }
  return { agents, batches };
}

/** Deletes what seedLists seeded, with their listing keys, a thousand at a time. */
async function dropLists(store: Store, lists: { agents: AgentDoc[]; batches: BatchDoc[] }): Promise<void> {
  for (let i = 0; i < Math.max(lists.agents.length, lists.batches.length); i += 1000) {
    const agents = lists.agents.slice(i, i + 1000);
    const batches = lists.batches.slice(i, i + 1000);
    await store.agents.deleteMany({ _id: { $in: agents.map((a) => a._id) } });
    await batchesOf(store).batches.deleteMany({ _id: { $in: batches.map((b) => b._id) } });
    await removeListed(store, [
      ...agents.map((a) => ({ list: listName('agents', a.orgId), item: { id: a.id, created_at: a.created_at } })),
      ...batches.map((b) => ({ list: listName('batches', b.orgId, b.agent_id), item: { id: b._id, created_at: b.created_at } })),
    ]);
  }
}

/** Median milliseconds of `runs` calls of GET `path` that answer 200 with `field` holding `want` items. */
async function timeList(o: { call: Call; runs: number }, path: string, field: string, want: number): Promise<number> {
  const ms: number[] = [];
  for (let r = 0; r < o.runs; r++) {
    const t = process.hrtime.bigint();
    const page = await o.call('GET', path);
    ms.push(Number(process.hrtime.bigint() - t) / 1e6);
    if (page.status !== 200 || page.body[field]?.length !== want) throw new Error(`GET ${path}: ${page.status} ${JSON.stringify(page.body).slice(0, 200)}`);
  }
  return median(ms);
}

/**
 * `npm run bench -- console [--runs 5] [--n 10000]` against a running stack: the console's shipped
 * assets gzipped (and Swagger UI's apart), each page's first render (median of `runs`), the session
 * list of an agent with `n` sessions (seeded straight into MongoDB: MONGO_URL) to its first page, the
 * agents and batches lists with `n` of each (seeded too) to their first page, and a
 * terminal's keystroke echo (keydown → the echoed character in the DOM, p50 of 50 keys).
 */
export async function benchConsole(o: { url: string; key: string; runs: number; n: number; call: Call; only?: string }): Promise<Record<string, unknown>> {
  const dist = path.join(__dirname, '..', 'console');
  const swagger = path.dirname(require.resolve('swagger-ui-dist/package.json'));
  const out: Record<string, unknown> = {
    console_assets: gzipped(dist, /\.(js|css|html)$/),
    docs_renderer_assets: gzipped(swagger, /^(swagger-ui-bundle\.js|swagger-ui\.css)$/),
  };

  // Fixtures: an agent with n sessions (seeded), a sandbox.
  const agentId = `bench-console-${Date.now().toString(36)}`;
  const a = await o.call('POST', '/v1/agents', { id: agentId, core: 'bash', entrypoint: ['bash', '-c', 'exit 0'] });
  if (a.status !== 201) throw new Error(`create agent: ${JSON.stringify(a.body)}`);
  const store = await connectStore(process.env.MONGO_URL ?? 'mongodb://127.0.0.1:27017/sap');
  let sandboxId: string | undefined;
  const seeded: string[] = [];
  const seededAt: { _id: string; created_at: Date }[] = [];
  let lists: { agents: AgentDoc[]; batches: BatchDoc[] } = { agents: [], batches: [] };
  const browser = await launchChromium();
  try {
    const orgId = await orgOfKeyHash(store, hashSecret(o.key));
    if (!orgId) throw new Error('the key is unknown to this stack');
    const t0 = Date.now();
    for (let i = 0; i < o.n; i += 1000) {
      const docs: SessionDoc[] = [];
      for (let j = i; j < Math.min(o.n, i + 1000); j++) {
        const at = new Date(t0 - (o.n - j) * 1000);
        docs.push(
          newSessionDoc({
            _id: `sess_bench${t0.toString(36)}${j.toString(36).padStart(4, '0')}`,
            orgId,
            agent_id: agentId,
            input: JSON.stringify({ n: j }),
            metadata: JSON.stringify({ seeded: 'bench' }),
            created_at: at,
          }),
        );
      }
      await insertSessionsOnce(store, docs);
      seeded.push(...docs.map((d) => d._id));
      seededAt.push(...docs.map((d) => ({ _id: d._id, created_at: d.created_at })));
    }
    // The API's share of the session list: its first page of 50, alone.
    const apiMs: number[] = [];
    for (let r = 0; r < o.runs; r++) {
      const t = process.hrtime.bigint();
      const page = await o.call('GET', `/v1/agents/${agentId}/sessions?limit=50`);
      apiMs.push(Number(process.hrtime.bigint() - t) / 1e6);
      if (page.status !== 200 || page.body.sessions.length !== Math.min(50, o.n))
        throw new Error(`list: ${page.status} ${JSON.stringify(page.body).slice(0, 200)}`);
    }
    out[`api_sessions_first_page_of_${o.n}_ms_p50`] = median(apiMs);
    // A page from the middle of the list: after the cursor of the session at n/2 (newest first).
    const mid = seededAt[Math.floor(o.n / 2)];
    if (mid) {
      const cursor = encodeCursor({ t: mid.created_at.toISOString(), id: mid._id });
      const midMs: number[] = [];
      for (let r = 0; r < o.runs; r++) {
        const t = process.hrtime.bigint();
        const page = await o.call('GET', `/v1/agents/${agentId}/sessions?limit=50&cursor=${cursor}`);
        midMs.push(Number(process.hrtime.bigint() - t) / 1e6);
        if (page.status !== 200 || page.body.sessions.length !== Math.min(50, Math.floor(o.n / 2)))
          throw new Error(`list (middle): ${page.status} ${JSON.stringify(page.body).slice(0, 200)}`);
      }
      out[`api_sessions_middle_page_of_${o.n}_ms_p50`] = median(midMs);
    }
    // The agents and batches lists with n of each, first page of 50 and a filtered one.
    const agentDoc = await findAgent(store, orgId, agentId);
    if (!agentDoc) throw new Error('the bench agent is not stored');
    lists = await seedLists(store, agentDoc, o.n, t0.toString(36));
    out[`api_agents_first_page_of_${o.n}_ms_p50`] = await timeList(o, '/v1/agents?limit=50', 'agents', 50);
    out[`api_batches_first_page_of_${o.n}_ms_p50`] = await timeList(o, `/v1/agents/${agentId}/batches?limit=50`, 'batches', 50);
    out[`api_batches_completed_first_page_of_${o.n}_ms_p50`] = await timeList(o, `/v1/agents/${agentId}/batches?limit=50&status=completed`, 'batches', 50);
    if (o.only === 'list') return out;
    const sb = await o.call('POST', '/api/sandboxes', {});
    if (sb.status !== 201) throw new Error(`create sandbox: ${JSON.stringify(sb.body)}`);
    sandboxId = sb.body.sandboxID as string;

    const context = await signedInContext(browser, o.key);
    const page = await context.newPage();
    const pages: Record<string, [string, string]> = {
      [`agents_${o.n}`]: ['/agents', 'tbody tr'],
      [`sessions_${o.n}`]: [`/agents/${agentId}/sessions`, 'tbody tr'],
      [`batches_${o.n}`]: [`/agents/${agentId}/batches`, 'tbody tr'],
      sandboxes: ['/sandboxes', 'tbody tr'],
      sandbox: [`/sandboxes/${sandboxId}`, '.sandbox-status'],
      hosts: ['/hosts', 'tbody tr'],
    };
    const render: Record<string, number> = {};
    for (const [name, [route, ready]] of Object.entries(pages)) {
      const ms: number[] = [];
      for (let r = 0; r < o.runs; r++) ms.push(await firstRender(page, `${o.url}/console/#${route}`, ready));
      render[name] = median(ms);
    }
    // /docs: its first render is the outline written into the page (every operation, api/docs-outline.ts);
    // then Swagger UI's bundle compiles and renders the interactive reference over it.
    const docsMs: number[] = [];
    const docsInteractiveMs: number[] = [];
    for (let r = 0; r < o.runs; r++) {
      await page.goto('about:blank');
      await page.goto(`${o.url}/docs`);
      await page.waitForSelector('.swagger-ui .info .title');
      docsInteractiveMs.push((await page.evaluate('performance.now()')) as number);
      // The outline is the page's first content (Swagger UI's script waits for it to be painted), and
      // may be gone by now on a warm cache: its render is the first contentful paint.
      const fcp = (await page.evaluate("performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? -1")) as number;
      if (fcp < 0) throw new Error('/docs: no first contentful paint recorded');
      docsMs.push(fcp);
    }
    render.docs = median(docsMs);
    render.docs_interactive = median(docsInteractiveMs);
    // The first of them loaded Swagger UI's bundle (1.7 MB) into an empty cache.
    render.docs_first_visit = docsMs[0]!;
    render.docs_interactive_first_visit = docsInteractiveMs[0]!;
    out.first_render_ms_p50 = render;

    // Keystroke echo: keydown in the page → the echoed character in the terminal's DOM.
    await page.goto(`${o.url}/console/#/sandboxes/${sandboxId}`);
    await page.click('button:has-text("Open terminal")');
    await page.waitForSelector('.term-status:has-text("Connected")');
    await page.click('.terminal');
    await page.waitForTimeout(500);
    // Armed before each key (awaited, so the key cannot arrive first): keydown's time, then the first change of the rows' text.
    await page.evaluate(`window.__armEcho = () => {
      const rows = document.querySelector('.xterm-rows');
      const before = rows.textContent;
      let t0 = 0;
      window.__echo = new Promise((resolve) => {
        document.addEventListener('keydown', () => { t0 = performance.now(); }, { capture: true, once: true });
        const mo = new MutationObserver(() => {
          if (t0 && rows.textContent !== before) { mo.disconnect(); resolve(performance.now() - t0); }
        });
        mo.observe(rows, { childList: true, subtree: true, characterData: true });
      });
    }`);
    const echo: number[] = [];
    for (let i = 0; i < 50; i++) {
      await page.evaluate('window.__armEcho()');
      await page.keyboard.press('x');
      echo.push((await page.evaluate('Promise.race([window.__echo, new Promise((r) => setTimeout(() => r(-1), 5000))])')) as number);
      if (echo[echo.length - 1]! < 0) throw new Error('no echo within 5 s');
    }
    out.keystroke_echo_ms = { p50: median(echo), p95: [...echo].sort((x, y) => x - y)[Math.floor(echo.length * 0.95)] };
    await context.close();
  } finally {
    await browser.close();
    if (sandboxId) await o.call('DELETE', `/api/sandboxes/${sandboxId}`).catch(() => undefined);
    for (let i = 0; i < seeded.length; i += 1000) await deleteUnstartedSessions(store, seeded.slice(i, i + 1000)).catch(() => undefined);
    await dropLists(store, lists).catch(() => undefined);
    await o.call('DELETE', `/v1/agents/${agentId}`).catch(() => undefined);
    await store.close();
  }
  return out;
}

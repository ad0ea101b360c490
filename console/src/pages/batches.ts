import { api, enc, request } from '../api';
import { h, fill, link, table, when, badge } from '../dom';
import { action, errorBox, every, section, type Page } from '../page';

interface Batch {
  id: string;
  agent_id: string;
  status: string;
  total: number;
  concurrency: number;
  max_attempts: number;
  counts: { pending: number; running: number; completed: number; failed: number };
  created_at: string;
  updated_at: string;
  completed_at: string | null;
}
interface ResultLine {
  index: number;
  session_id: string | null;
  status: string;
  error?: { reason: string | null; exit_code: number | null; message: string | null };
}

const progress = (b: Batch): HTMLElement => h('progress', { max: b.total, value: b.counts.completed + b.counts.failed, 'aria-label': 'Progress' });

/** An agent's batches (newest first, a page at a time) and a form to start one. */
export const batchesPage: Page = async (el, { params, query, signal }) => {
  const agentId = params.agentId;
  const cursor = query.get('cursor');
  const list = h('div');
  fill(
    el,
    h('h1', null, 'Batches of ', h('code', null, agentId)),
    h('p', null, link('/agents', '← Agents'), ' · ', link(`/agents/${enc(agentId)}/sessions`, 'Sessions')),
    newBatchForm(agentId),
    list,
  );
  await section(
    list,
    () =>
      api<{ batches: Batch[]; next_cursor: string | null }>(`/v1/agents/${enc(agentId)}/batches?limit=50${cursor ? `&cursor=${enc(cursor)}` : ''}`, { signal }),
    ({ batches, next_cursor }) => [
      table(
        ['Batch', 'Status', 'Progress', 'Completed', 'Failed', 'Created'],
        batches.map((b) => [
          link(`/agents/${enc(agentId)}/batches/${enc(b.id)}`, b.id),
          badge(b.status),
          progress(b),
          b.counts.completed,
          b.counts.failed,
          when(b.created_at),
        ]),
        'No batches yet.',
      ),
      h('p', { class: 'pager' }, next_cursor ? link(`/agents/${enc(agentId)}/batches?cursor=${enc(next_cursor)}`, 'Next page →') : null),
    ],
    signal,
  );
};

function newBatchForm(agentId: string): HTMLElement {
  const items = h('textarea', { name: 'items', rows: 4, 'aria-label': 'Items (NDJSON: one {"input": …} per line)' }, '{"input":{"n":1}}\n{"input":{"n":2}}');
  const concurrency = h('input', { name: 'concurrency', type: 'number', min: 1, max: 100, value: '10', 'aria-label': 'Concurrency' });
  const out = h('div');
  return h(
    'details',
    { class: 'new' },
    h('summary', null, 'New batch'),
    h(
      'form',
      {
        onsubmit: async (e: Event) => {
          e.preventDefault();
          try {
            const parsed = items.value
              .split('\n')
              .filter((l) => l.trim())
              .map((l, i) => {
                try {
                  return JSON.parse(l) as unknown;
                } catch {
                  throw new Error(`line ${i + 1} is not JSON`);
                }
              });
            const b = await api<Batch>(`/v1/agents/${enc(agentId)}/batches`, {
              method: 'POST',
              body: { items: parsed, concurrency: Number(concurrency.value) },
            });
            location.hash = `#/agents/${enc(agentId)}/batches/${enc(b.id)}`;
          } catch (err) {
            fill(out, errorBox(err));
          }
        },
      },
      h('label', null, 'Items (one {"input": …} per line)', items),
      h('label', null, 'Concurrency', concurrency),
      h('button', { type: 'submit' }, 'Start batch'),
    ),
    out,
  );
}

/**
 * A batch: a progress bar, counts by status, items/s, and its failures grouped by reason with the
 * first line of each message (read from the results a page at a time, as items end), and cancel.
 */
export const batchPage: Page = async (el, { params, signal }) => {
  const { agentId, id } = params;
  const path = `/v1/agents/${enc(agentId)}/batches/${enc(id)}`;
  const head = h('div', null, h('p', { class: 'loading' }, 'Loading…'));
  const failuresEl = h('div');
  fill(
    el,
    h('h1', null, 'Batch ', h('code', null, id)),
    h('p', null, link(`/agents/${enc(agentId)}/batches`, `← Batches of ${agentId}`)),
    head,
    h('h2', null, 'Failures'),
    failuresEl,
  );
  const groups = new Map<string, { reason: string; first: string; count: number; sessions: string[] }>();
  let after = -1;
  let done = false;
  every(1000, signal, async () => {
    if (done) return;
    let b: Batch;
    try {
      b = await api<Batch>(path, { signal });
    } catch (err) {
      if (!signal.aborted) fill(head, errorBox(err));
      return;
    }
    // Results up to the first item still running, at most 5 pages per refresh.
    let progressed = false;
    for (let i = 0; i < 5; i++) {
      const res = await request(`${path}/results?after=${after}&limit=1000`, { signal, accept: 'application/x-ndjson' });
      const text = await res.text();
      const next = Number(res.headers.get('X-Next-After') ?? after);
      for (const l of text.split('\n').filter(Boolean)) {
        const r = JSON.parse(l) as ResultLine;
        if (r.status === 'completed') continue;
        const reason = r.error?.reason ?? r.status;
        const first = (r.error?.message ?? '').split('\n')[0].slice(0, 300);
        const key = `${reason}\u0000${first}`;
        const g = groups.get(key) ?? { reason, first, count: 0, sessions: [] };
        g.count++;
        if (g.sessions.length < 5 && r.session_id) g.sessions.push(r.session_id);
        groups.set(key, g);
      }
      if (next === after || !text) break;
      after = next;
      progressed = true;
    }
    if (signal.aborted) return;
    renderBatch(head, b, path);
    renderFailures(failuresEl, agentId, groups);
    done = b.status !== 'running' && (!progressed || after >= b.total - 1);
  });
};

function renderBatch(el: HTMLElement, b: Batch, path: string): void {
  const ended = b.counts.completed + b.counts.failed;
  const end = b.completed_at ? new Date(b.completed_at).getTime() : Date.now();
  const secs = Math.max(0.001, (end - new Date(b.created_at).getTime()) / 1000);
  fill(
    el,
    h('p', null, badge(b.status), ' ', progress(b), ` ${ended} of ${b.total} ended`),
    h(
      'dl',
      { class: 'facts counts' },
      ...(['pending', 'running', 'completed', 'failed'] as const).flatMap((k) => [h('dt', null, k), h('dd', { class: `count-${k}` }, String(b.counts[k]))]),
      h('dt', null, 'items/s'),
      h('dd', { class: 'rate' }, (ended / secs).toFixed(2)),
      h('dt', null, 'Concurrency'),
      h('dd', null, String(b.concurrency)),
      h('dt', null, 'Created'),
      h('dd', null, when(b.created_at)),
      h('dt', null, 'Completed'),
      h('dd', null, when(b.completed_at)),
    ),
    b.status === 'running' ? action('Cancel batch', () => api(path, { method: 'DELETE' }), { confirm: 'Cancel this batch?', cls: 'danger' }) : null,
  );
}

function renderFailures(el: HTMLElement, agentId: string, groups: Map<string, { reason: string; first: string; count: number; sessions: string[] }>): void {
  const rows = [...groups.values()].sort((a, b) => b.count - a.count);
  fill(
    el,
    table(
      ['Reason', 'Count', 'First line of the message', 'Sessions'],
      rows.map((g) => [
        h('strong', null, g.reason),
        String(g.count),
        h('code', null, g.first),
        h(
          'span',
          null,
          g.sessions.map((s) => [link(`/agents/${enc(agentId)}/sessions/${enc(s)}`, s), ' ']),
        ),
      ]),
      'No failures so far.',
    ),
  );
}

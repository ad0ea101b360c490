import { api, enc } from '../api';
import { h, fill, link, table, when, badge } from '../dom';
import { errorBox, section, type Page } from '../page';

export interface Session {
  id: string;
  agent_id: string;
  status: string;
  input: Record<string, unknown>;
  result: Record<string, unknown> | null;
  metadata: Record<string, unknown>;
  outcome: { reason: string | null; exit_code: number | null; message: string | null } | null;
  created_at: string;
  updated_at: string;
}

const STATUSES = ['', 'creating', 'running', 'completed', 'failed'];
const PAGE = 50;

/**
 * An agent's sessions, newest first, one page (50) at a time with the API's cursor: 10,000 sessions
 * cost what 50 do. Status filters on the server; an id opens the session; `key=value` filters the
 * metadata of the page shown (the API has no metadata search).
 */
export const sessionsPage: Page = async (el, { params, query, signal }) => {
  const agentId = params.agentId;
  const status = query.get('status') ?? '';
  const cursor = query.get('cursor');
  const q = query.get('q') ?? '';
  const base = `/agents/${enc(agentId)}/sessions`;
  const go = (p: Record<string, string>): void => {
    const qs = new URLSearchParams(Object.entries(p).filter(([, v]) => v));
    location.hash = `#${base}${qs.size ? `?${qs}` : ''}`;
  };
  const statusSel = h(
    'select',
    { name: 'status', 'aria-label': 'Status', onchange: () => go({ status: statusSel.value, q }) },
    ...STATUSES.map((s) => h('option', { value: s }, s || 'any status')),
  );
  statusSel.value = status;
  const search = h('input', { name: 'q', value: q, placeholder: 'sess_… or metadata key=value', 'aria-label': 'Search' });
  const searchOut = h('div');
  const form = h(
    'form',
    {
      class: 'filters',
      onsubmit: async (e: Event) => {
        e.preventDefault();
        const v = search.value.trim();
        if (/^sess_[A-Za-z0-9_-]+$/.test(v)) {
          try {
            await api(`/v1/agents/${enc(agentId)}/sessions/${enc(v)}`, { signal });
            location.hash = `#${base}/${enc(v)}`;
          } catch (err) {
            fill(searchOut, errorBox(err));
          }
          return;
        }
        go({ status, q: v });
      },
    },
    statusSel,
    search,
    h('button', { type: 'submit' }, 'Search'),
  );
  const list = h('div');
  fill(
    el,
    h('h1', null, 'Sessions of ', h('code', null, agentId)),
    h('p', null, link('/agents', '← Agents'), ' · ', link(`/agents/${enc(agentId)}/batches`, 'Batches')),
    newSessionForm(agentId),
    form,
    searchOut,
    list,
  );
  const [mk, mv] = q.includes('=') ? [q.slice(0, q.indexOf('=')), q.slice(q.indexOf('=') + 1)] : ['', ''];
  await section(
    list,
    () =>
      api<{ sessions: Session[]; next_cursor: string | null }>(
        `/v1/agents/${enc(agentId)}/sessions?limit=${PAGE}${status ? `&status=${enc(status)}` : ''}${cursor ? `&cursor=${enc(cursor)}` : ''}`,
        { signal },
      ),
    ({ sessions, next_cursor }) => {
      const shown = mk ? sessions.filter((s) => String(s.metadata?.[mk] ?? '') === mv) : sessions;
      return [
        mk ? h('p', { class: 'muted' }, `Metadata ${mk}=${mv}: ${shown.length} of the ${sessions.length} sessions of this page.`) : null,
        table(
          ['Session', 'Status', 'Reason', 'Metadata', 'Created'],
          shown.map((s) => [
            link(`${base}/${enc(s.id)}`, s.id),
            badge(s.status),
            s.outcome?.reason ?? '',
            h('code', null, Object.keys(s.metadata ?? {}).length ? JSON.stringify(s.metadata).slice(0, 80) : ''),
            when(s.created_at),
          ]),
          'No sessions match.',
        ),
        h(
          'p',
          { class: 'pager' },
          cursor ? h('a', { href: `#${base}${status ? `?status=${enc(status)}` : ''}` }, 'First page') : null,
          ' ',
          next_cursor ? h('button', { class: 'link', onclick: () => go({ status, q, cursor: next_cursor }) }, 'Next page →') : null,
        ),
      ];
    },
    signal,
  );
};

/** Starts a session with the JSON input typed in. */
function newSessionForm(agentId: string): HTMLElement {
  const input = h('textarea', { name: 'input', rows: 3, 'aria-label': 'Input (JSON object)' }, '{}');
  const out = h('div');
  return h(
    'details',
    { class: 'new' },
    h('summary', null, 'New session'),
    h(
      'form',
      {
        onsubmit: async (e: Event) => {
          e.preventDefault();
          let body: unknown;
          try {
            body = { input: JSON.parse(input.value || '{}') };
          } catch (err) {
            fill(out, errorBox(new Error(`the input is not JSON: ${(err as Error).message}`)));
            return;
          }
          try {
            const s = await api<Session>(`/v1/agents/${enc(agentId)}/sessions`, { method: 'POST', body });
            location.hash = `#/agents/${enc(agentId)}/sessions/${enc(s.id)}`;
          } catch (err) {
            fill(out, errorBox(err));
          }
        },
      },
      h('label', null, 'Input (JSON object)', input),
      h('button', { type: 'submit' }, 'Start session'),
    ),
    out,
  );
}

import { api, consoleConfig, enc, request } from '../api';
import { h, fill, link, json, when, badge } from '../dom';
import { action, errorBox, errorText, type Page } from '../page';
import type { Session } from './sessions';

const MAX_LINES = 5_000;

/** A session: status, input, result or failure, its logs following live, and its workflow in the Temporal UI. */
export const sessionPage: Page = async (el, { params, signal }) => {
  const { agentId, id } = params;
  const path = `/v1/agents/${enc(agentId)}/sessions/${enc(id)}`;
  const head = h('div');
  const logs = h('pre', { class: 'logs', 'aria-label': 'Logs' });
  const logState = h('p', { class: 'muted log-state' });
  fill(
    el,
    h('h1', null, 'Session ', h('code', null, id)),
    h('p', null, link(`/agents/${enc(agentId)}/sessions`, `← Sessions of ${agentId}`)),
    head,
    h('h2', null, 'Logs'),
    logState,
    logs,
  );

  const show = (s: Session): void => renderHead(head, s, path);
  fill(head, h('p', { class: 'loading' }, 'Loading…'));
  let s: Session;
  try {
    s = await api<Session>(path, { signal });
  } catch (err) {
    if (!signal.aborted)
      fill(
        head,
        errorBox(err, () => void sessionPage(el, { params, query: new URLSearchParams(), signal })),
      );
    return;
  }
  show(s);
  await followLogs(`${path}/logs?follow=true`, logs, logState, signal);
  // The log ends when the session has ended: show its ending (waiting a little for the record if needed).
  for (let i = 0; i < 12 && !signal.aborted && (s.status === 'creating' || s.status === 'running'); i++) {
    try {
      s = await api<Session>(`${path}?wait=5`, { signal, timeoutMs: 10_000 });
      show(s);
    } catch (err) {
      if (!signal.aborted) fill(logState, errorBox(err));
      return;
    }
  }
};

function renderHead(el: HTMLElement, s: Session, path: string): void {
  const o = s.outcome;
  const failed = s.status === 'failed';
  fill(
    el,
    h(
      'dl',
      { class: 'facts' },
      h('dt', null, 'Status'),
      h('dd', { class: 'session-status' }, badge(s.status)),
      h('dt', null, 'Created'),
      h('dd', null, when(s.created_at)),
      h('dt', null, 'Updated'),
      h('dd', null, when(s.updated_at)),
      h('dt', null, 'Workflow'),
      h('dd', { class: 'temporal' }, h('code', null, s.id)),
    ),
    failed && o
      ? h(
          'div',
          { class: 'failure', role: 'alert' },
          h('h2', null, 'Failure'),
          h('p', null, 'Reason: ', h('strong', { class: 'reason' }, o.reason ?? 'unknown'), o.exit_code !== null ? ` · exit code ${o.exit_code}` : ''),
          o.message ? h('pre', { class: 'stderr' }, o.message) : null,
        )
      : o?.message
        ? h('p', { class: 'muted' }, o.message)
        : null,
    h('h2', null, 'Input'),
    json(s.input),
    s.result ? [h('h2', null, 'Result'), json(s.result)] : null,
    Object.keys(s.metadata ?? {}).length ? [h('h2', null, 'Metadata'), json(s.metadata)] : null,
    s.status === 'creating' || s.status === 'running'
      ? action('Cancel session', () => api(path, { method: 'DELETE' }), { confirm: 'Cancel this session?', cls: 'danger' })
      : null,
  );
  void consoleConfig().then(
    (c) => {
      const dd = el.querySelector('.temporal');
      if (dd && c.temporalUiUrl)
        dd.appendChild(
          h(
            'a',
            {
              href: `${c.temporalUiUrl}/namespaces/${enc(c.temporalNamespace)}/workflows/${enc(s.id)}`,
              target: '_blank',
              rel: 'noopener noreferrer',
              class: 'temporal-link',
            },
            ' Open in the Temporal UI ↗',
          ),
        );
    },
    () => undefined,
  );
}

/** Streams the logs route's NDJSON (`follow=true`) into `out` until it ends (the session ended) or the page is left. */
async function followLogs(url: string, out: HTMLElement, state: HTMLElement, signal: AbortSignal): Promise<void> {
  fill(state, 'Following the logs…');
  out.replaceChildren();
  let lines = 0;
  try {
    // The follow lasts as long as the session: no overall timeout, only one on the answer's start.
    const res = await request(url, { signal, accept: 'application/x-ndjson', timeoutMs: 2 ** 31 - 1 });
    const truncated = res.headers.get('X-SAP-Log-Truncated');
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let nl: number;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const text = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (!text.trim()) continue;
        let line: { stream: string; line: string };
        try {
          line = JSON.parse(text) as { stream: string; line: string };
        } catch {
          line = { stream: 'stdout', line: text };
        }
        out.appendChild(h('span', { class: `line ${line.stream === 'stderr' ? 'stderr' : 'stdout'}` }, `${line.line}\n`));
        if (++lines > MAX_LINES) out.firstChild?.remove();
      }
      out.scrollTop = out.scrollHeight;
    }
    fill(state, `The log is complete (${lines} lines${truncated && truncated !== 'none' ? `; the beginning of ${truncated} was not kept` : ''}).`);
  } catch (err) {
    if (signal.aborted) return;
    fill(state, h('span', { class: 'error' }, `The log stream stopped: ${errorText(err)}`));
  }
}

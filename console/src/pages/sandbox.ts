import { api, enc } from '../api';
import { h, fill, link, table, when, badge, bytes, json } from '../dom';
import { action, errorBox, errorText, every, section, type Page } from '../page';
import { openTerminal } from '../terminal';
import { fileBrowser } from '../files';
import { limitsText, metricsText, type Metrics, type Sandbox } from './sandboxes';

interface Preview {
  id: string;
  hostname: string;
  port: number;
  sslStatus: string;
}
interface Checkpoint {
  id: string;
  name: string;
  status: string;
  error: string | null;
  sizeBytes: number;
  createdAt: string;
}

/** A sandbox: details and live metrics, hibernate/wake/kill, a terminal, a file browser, its previews and checkpoints. */
export const sandboxPage: Page = async (el, { params, signal }) => {
  const id = params.id;
  const path = `/api/sandboxes/${enc(id)}`;
  const head = h('div', null, h('p', { class: 'loading' }, 'Loading…'));
  const termBox = h('div');
  const filesBox = h('div');
  const previewsBox = h('div');
  const checkpointsBox = h('div');
  // The form stands apart from the list: a list that fails to load does not take the form with it.
  const checkpointFormBox = h('div');
  fill(
    el,
    h('h1', null, 'Sandbox ', h('code', null, id)),
    h('p', null, link('/sandboxes', '← Sandboxes')),
    head,
    h('h2', null, 'Terminal'),
    termBox,
    h('h2', null, 'Files'),
    filesBox,
    h('h2', null, 'Previews'),
    previewsBox,
    h('h2', null, 'Checkpoints'),
    checkpointFormBox,
    checkpointsBox,
  );
  const refresh = async (): Promise<Sandbox | undefined> => {
    const s = await section(
      head,
      () => api<Sandbox>(path, { signal }),
      (s) => renderHead(s, refresh, path),
      signal,
    );
    if (s?.status === 'running') void loadMetrics();
    return s;
  };
  const loadMetrics = async (): Promise<void> => {
    const cell = head.querySelector<HTMLElement>('.metrics');
    if (!cell) return;
    try {
      fill(cell, metricsText(await api<Metrics>(`${path}/metrics`, { signal, timeoutMs: 5000 })));
    } catch (err) {
      fill(cell, h('span', { class: 'muted' }, errorText(err)));
    }
  };
  const s = await refresh();
  if (!s) return;
  every(5000, signal, loadMetrics);
  if (s.status === 'running') {
    fill(termBox, h('button', { onclick: () => openTerminal(termBox, id, signal) }, 'Open terminal'));
    fileBrowser(filesBox, id, signal);
  } else {
    fill(termBox, h('p', { class: 'muted' }, `The sandbox is ${s.status}: wake it for a terminal.`));
    fill(filesBox, h('p', { class: 'muted' }, `The sandbox is ${s.status}.`));
  }
  void section(
    previewsBox,
    () => api<Preview[]>(`${path}/preview`, { signal }),
    (ps) =>
      table(
        ['Port', 'URL'],
        ps.map((p) => {
          const url = `${p.sslStatus === 'active' ? 'https' : location.protocol.replace(':', '')}://${p.hostname}${p.sslStatus === 'active' || !location.port ? '' : `:${location.port}`}/`;
          return [String(p.port), h('a', { href: url, target: '_blank', rel: 'noopener noreferrer' }, url)];
        }),
        'No preview URLs.',
      ),
    signal,
  );
  const loadCheckpoints = (): void =>
    void section(
      checkpointsBox,
      () => api<Checkpoint[]>(`${path}/checkpoints`, { signal }),
      (cps) => [
        // A checkpoint being copied is read again until it is ready or failed.
        cps.some((c) => c.status === 'processing') ? void setTimeout(() => signal.aborted || loadCheckpoints(), 2000) : null,
        table(
          ['Checkpoint', 'Name', 'Status', 'Size', 'Created', ''],
          cps.map((c) => [
            h('code', null, c.id),
            c.name,
            c.error ? h('span', null, badge(c.status), ` ${c.error}`) : badge(c.status),
            bytes(c.sizeBytes),
            when(c.createdAt),
            h(
              'span',
              null,
              c.status === 'ready'
                ? action('Restore', () => api(`${path}/checkpoints/${enc(c.id)}/restore`, { method: 'POST', timeoutMs: 120_000 }).then(() => refresh()), {
                    confirm: 'Restore this checkpoint?',
                  })
                : null,
              action('Delete', () => api(`${path}/checkpoints/${enc(c.id)}`, { method: 'DELETE' }).then(loadCheckpoints), {
                confirm: 'Delete this checkpoint?',
                cls: 'danger',
              }),
            ),
          ]),
          'No checkpoints.',
        ),
      ],
      signal,
    );
  fill(checkpointFormBox, checkpointForm(path, loadCheckpoints));
  loadCheckpoints();
};

function renderHead(s: Sandbox, refresh: () => Promise<unknown>, path: string): HTMLElement {
  const reload = (): void => {
    // The page's terminal and files depend on the status: render it again.
    window.dispatchEvent(new HashChangeEvent('hashchange'));
  };
  return h(
    'div',
    null,
    h(
      'dl',
      { class: 'facts' },
      h('dt', null, 'Status'),
      h('dd', { class: 'sandbox-status' }, badge(s.status), s.hibernatedAt ? ` since ${when(s.hibernatedAt)}` : ''),
      h('dt', null, 'Template'),
      h('dd', null, s.templateID),
      h('dt', null, 'Limits'),
      h('dd', null, limitsText(s)),
      h('dt', null, 'Metrics'),
      h('dd', { class: 'metrics' }, s.status === 'running' ? '…' : '—'),
      h('dt', null, 'User'),
      h('dd', null, s.user),
      h('dt', null, 'Idle timeout'),
      h('dd', null, s.timeout ? `${s.timeout} s` : 'none'),
      h('dt', null, 'Created'),
      h('dd', null, when(s.createdAt)),
    ),
    Object.keys(s.metadata ?? {}).length ? json(s.metadata) : null,
    h(
      'p',
      { class: 'actions' },
      s.status === 'running' ? action('Hibernate', () => api(`${path}/hibernate`, { method: 'POST', timeoutMs: 120_000 }).then(reload)) : null,
      s.status === 'hibernated' ? action('Wake', () => api(`${path}/wake`, { method: 'POST', body: {}, timeoutMs: 120_000 }).then(reload)) : null,
      action('Refresh', refresh),
      s.status !== 'stopped'
        ? action('Kill', () => api(path, { method: 'DELETE', timeoutMs: 60_000 }).then(reload), {
            confirm: 'Kill this sandbox? Its files are removed.',
            cls: 'danger',
          })
        : null,
    ),
  );
}

function checkpointForm(path: string, done: () => void): HTMLElement {
  const name = h('input', { name: 'checkpointName', placeholder: 'name', 'aria-label': 'Checkpoint name', required: true });
  const out = h('span');
  return h(
    'form',
    {
      class: 'filters',
      onsubmit: async (e: Event) => {
        e.preventDefault();
        try {
          await api(`${path}/checkpoints`, { method: 'POST', body: { name: name.value.trim() }, timeoutMs: 120_000 });
          done();
        } catch (err) {
          fill(out, errorBox(err));
        }
      },
    },
    name,
    h('button', { type: 'submit' }, 'Create checkpoint'),
    out,
  );
}

import { api, enc } from '../api';
import { h, fill, link, table, when, badge, bytes } from '../dom';
import { action, errorBox, every, errorText, type Page } from '../page';

export interface Sandbox {
  sandboxID: string;
  status: string;
  templateID: string;
  metadata: Record<string, string>;
  timeout: number;
  memoryMB: number | null;
  cpuCount: number | null;
  diskMB: number | null;
  user: string;
  hibernatedAt: string | null;
  fromCheckpoint: string | null;
  createdAt: string;
}
export interface Metrics {
  cpu: { percent: number | null; count: number };
  memory: { usedBytes: number; limitBytes: number | null };
  disk: { usedBytes: number | null; limitBytes: number | null };
  processes: { current: number; limit: number | null };
}

/** Metrics are read for at most this many running sandboxes of the list at a time (each is a call to its host). */
const METRICS_MAX = 20;

export const metricsText = (m: Metrics): string =>
  `CPU ${m.cpu.percent === null ? '—' : `${m.cpu.percent.toFixed(1)}%`} · memory ${bytes(m.memory.usedBytes)}${m.memory.limitBytes ? ` of ${bytes(m.memory.limitBytes)}` : ''} · ${m.processes.current} processes`;

export const limitsText = (s: Sandbox): string =>
  `${s.memoryMB ?? '—'} MB · ${s.cpuCount === 0 ? 'no CPU quota' : `${s.cpuCount ?? '—'} CPU`} · disk ${s.diskMB ?? '—'} MB`;

/** The organisation's sandboxes: status, limits, and live metrics of the running ones (refreshed every 5 s). */
export const sandboxesPage: Page = (el, { signal }) => {
  const list = h('div', null, h('p', { class: 'loading' }, 'Loading…'));
  const created = h('div');
  fill(
    el,
    h('h1', null, 'Sandboxes'),
    h(
      'p',
      null,
      action('New sandbox', async () => {
        const s = await api<Sandbox>('/api/sandboxes', { method: 'POST', body: {}, timeoutMs: 120_000 });
        location.hash = `#/sandboxes/${enc(s.sandboxID)}`;
      }),
    ),
    created,
    list,
  );
  const metricCells = new Map<string, HTMLElement>();
  every(5000, signal, async () => {
    let all: Sandbox[];
    try {
      all = await api<Sandbox[]>('/api/sandboxes', { signal });
    } catch (err) {
      if (!signal.aborted) fill(list, errorBox(err));
      return;
    }
    if (signal.aborted) return;
    metricCells.clear();
    fill(
      list,
      table(
        ['Sandbox', 'Status', 'Template', 'Limits', 'Metrics', 'Created'],
        all.map((s) => {
          const cell = h('span', { class: 'metrics' }, s.status === 'running' ? '…' : '—');
          if (s.status === 'running' && metricCells.size < METRICS_MAX) metricCells.set(s.sandboxID, cell);
          return [link(`/sandboxes/${enc(s.sandboxID)}`, s.sandboxID), badge(s.status), s.templateID, limitsText(s), cell, when(s.createdAt)];
        }),
        'No sandboxes.',
      ),
    );
    await Promise.all(
      [...metricCells].map(async ([id, cell]) => {
        try {
          fill(cell, metricsText(await api<Metrics>(`/api/sandboxes/${enc(id)}/metrics`, { signal, timeoutMs: 5000 })));
        } catch (err) {
          fill(cell, h('span', { class: 'muted' }, errorText(err)));
        }
      }),
    );
  });
};

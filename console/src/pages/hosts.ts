import type { HostView } from '../../../contract/views';
import { api } from '../api';
import { h, fill, table, when, badge } from '../dom';
import { errorBox, every, type Page } from '../page';

type Host = HostView;

const meter = (value: number | null, max: number | null, unit: string): HTMLElement =>
  value === null || !max
    ? h('span', { class: 'muted' }, '—')
    : h('span', null, h('meter', { min: 0, max, value, high: max * 0.8, optimum: 0 }), ` ${value} / ${max}${unit}`);

/** The sandbox hosts: each one's load (sandboxes, reserved memory) against its capacity; lost hosts marked. */
export const hostsPage: Page = (el, { signal }) => {
  const body = h('div', null, h('p', { class: 'loading' }, 'Loading…'));
  fill(el, h('h1', null, 'Hosts'), h('p', { class: 'muted' }, 'Load as of each host’s last heartbeat; refreshed every 5 s.'), body);
  every(5000, signal, async () => {
    try {
      const { hosts } = await api<{ hosts: Host[] }>('/api/hosts', { signal });
      if (signal.aborted) return;
      fill(
        body,
        table(
          ['Host', 'Status', 'Sandboxes', 'Reserved memory', 'Last heartbeat'],
          hosts.map((x) => [
            h('code', null, x.hostId),
            x.status === 'lost' ? h('span', { class: 'lost' }, badge('lost'), x.lostAt ? ` since ${when(x.lostAt)}` : ' (no heartbeat)') : badge('live'),
            meter(x.sandboxes, x.maxSandboxes, ''),
            meter(x.reservedMB, x.memoryMB, ' MB'),
            when(x.heartbeatAt),
          ]),
          'No sandbox host has registered.',
        ),
      );
    } catch (err) {
      if (!signal.aborted) fill(body, errorBox(err));
    }
  });
};

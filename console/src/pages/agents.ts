import { api, enc } from '../api';
import { h, fill, link, table, when } from '../dom';
import { section, type Page } from '../page';

interface Agent {
  id: string;
  display_name?: string | null;
  core: string;
  timeoutSeconds: number;
  created_at: string;
}

/** The organisation's agents, a page at a time as the API pages them. */
export const agentsPage: Page = async (el, { query, signal }) => {
  const cursor = query.get('cursor');
  const body = h('div');
  fill(el, h('h1', null, 'Agents'), body);
  await section(
    body,
    () => api<{ agents: Agent[]; next_cursor: string | null }>(`/v1/agents?limit=50${cursor ? `&cursor=${enc(cursor)}` : ''}`, { signal }),
    ({ agents, next_cursor }) => [
      table(
        ['Agent', 'Name', 'Core', 'Timeout', 'Created', ''],
        agents.map((a) => [
          link(`/agents/${enc(a.id)}/sessions`, a.id),
          a.display_name ?? '',
          a.core,
          `${a.timeoutSeconds} s`,
          when(a.created_at),
          h(
            'span',
            null,
            link(`/agents/${enc(a.id)}/sessions`, 'Sessions'),
            ' · ',
            link(`/agents/${enc(a.id)}/batches`, 'Batches'),
            ' · ',
            link(`/agents/${enc(a.id)}/conversations`, 'Conversations'),
          ),
        ]),
        'No agents yet: create one with POST /v1/agents (see the API reference).',
      ),
      h(
        'p',
        { class: 'pager' },
        cursor ? link('/agents', 'First page') : null,
        ' ',
        next_cursor ? link(`/agents?cursor=${enc(next_cursor)}`, 'Next page →') : null,
      ),
    ],
    signal,
  );
};

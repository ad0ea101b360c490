import { api, consoleConfig, enc } from '../api';
import { h, fill, link, table, when, badge } from '../dom';
import { action, errorBox, every, section, type Page } from '../page';

interface Conversation {
  id: string;
  agentId: string;
  status: string;
  sleeping: boolean;
  sandboxId: string | null;
  turns: number;
  headTurn: number;
  tokensUsed: number;
  forkedFrom: { conversationId: string; turn: number } | null;
  forks: { conversationId: string; turn: number }[];
  createdAt: string;
  updatedAt: string;
}

interface Turn {
  turn: number;
  status: string;
  message: string;
  yieldReason: string | null;
  left: boolean;
  after: number;
  attempt: number;
  checkpointId: string | null;
  evaluation: { exitCode: number; outputTail: string } | null;
  startedAt: string;
}

interface Ev {
  seq: number;
  turn: number;
  level: string;
  type: string;
  data: unknown;
  superseded: boolean;
}

const MAX_EVENTS = 2_000;

/** An agent's conversations, newest first. */
export const conversationsPage: Page = async (el, { params, signal }) => {
  const { agentId } = params;
  const body = h('div');
  fill(el, h('h1', null, 'Conversations of ', h('code', null, agentId)), h('p', null, link('/agents', '← Agents')), body);
  await section(
    body,
    () => api<{ conversations: Conversation[] }>(`/v1/agents/${enc(agentId)}/conversations?limit=100`, { signal }),
    ({ conversations }) =>
      table(
        ['Conversation', 'Status', 'Turns', 'Forked from', 'Created'],
        conversations.map((c) => [
          link(`/conversations/${enc(c.id)}`, c.id),
          badge(c.status),
          String(c.headTurn),
          c.forkedFrom
            ? h('span', null, link(`/conversations/${enc(c.forkedFrom.conversationId)}`, c.forkedFrom.conversationId), ` @ ${c.forkedFrom.turn}`)
            : '',
          when(c.createdAt),
        ]),
        'No conversations yet: start one with POST /v1/agents/{id}/conversations.',
      ),
    signal,
  );
};

/** A conversation: its state, a message box, its turns with fork and rewind buttons, and its events following live. */
export const conversationPage: Page = async (el, { params, signal }) => {
  const { id } = params;
  const path = `/v1/conversations/${enc(id)}`;
  const cfg = await consoleConfig().catch(() => null);
  const head = h('div');
  const turns = h('div');
  const events = h('pre', { class: 'logs conversation-events', 'aria-label': 'Events' });
  const text: HTMLTextAreaElement = h('textarea', { rows: 3, cols: 80, 'aria-label': 'Message', placeholder: 'Message' });
  fill(
    el,
    h('h1', null, 'Conversation ', h('code', null, id)),
    head,
    h('h2', null, 'Send a message'),
    h(
      'div',
      { class: 'message-box' },
      text,
      action('Send', async () => {
        if (!text.value) return;
        await api(`${path}/messages`, { method: 'POST', body: { text: text.value } });
        text.value = '';
      }),
      action('Interrupt', () => api(`${path}/interrupt`, { method: 'POST' })),
    ),
    h('h2', null, 'Turns'),
    turns,
    h('h2', null, 'Events'),
    events,
  );

  const renderHead = (c: Conversation) =>
    fill(
      head,
      h('p', null, link(`/agents/${enc(c.agentId)}/conversations`, `← Conversations of ${c.agentId}`)),
      h(
        'dl',
        { class: 'facts' },
        h('dt', null, 'Status'),
        h('dd', { class: 'conversation-status' }, badge(c.status), c.sleeping ? ' (sleeping)' : ''),
        h('dt', null, 'Head turn'),
        h('dd', null, String(c.headTurn)),
        h('dt', null, 'Tokens'),
        h('dd', null, String(c.tokensUsed)),
        h('dt', null, 'Sandbox'),
        h('dd', null, c.sandboxId ? link(`/sandboxes/${enc(c.sandboxId)}`, c.sandboxId) : '—'),
        h('dt', null, 'Forked from'),
        h(
          'dd',
          null,
          c.forkedFrom ? [link(`/conversations/${enc(c.forkedFrom.conversationId)}`, c.forkedFrom.conversationId), ` at turn ${c.forkedFrom.turn}`] : '—',
        ),
        h('dt', null, 'Forks'),
        h(
          'dd',
          { class: 'forks' },
          c.forks.length ? c.forks.map((f) => h('span', null, link(`/conversations/${enc(f.conversationId)}`, f.conversationId), ` (turn ${f.turn}) `)) : '—',
        ),
        h('dt', null, 'Workflow'),
        h(
          'dd',
          { class: 'temporal' },
          h('code', null, c.id),
          cfg?.temporalUiUrl
            ? h(
                'a',
                { href: `${cfg.temporalUiUrl}/namespaces/${enc(cfg.temporalNamespace)}/workflows/${enc(c.id)}`, target: '_blank', rel: 'noopener noreferrer' },
                ' Open in the Temporal UI ↗',
              )
            : null,
        ),
      ),
      c.status !== 'archived'
        ? action('Archive', () => api(`${path}/archive`, { method: 'POST' }), {
            confirm: 'Archive this conversation (its sandbox is destroyed)?',
            cls: 'danger',
          })
        : null,
    );

  const renderTurns = (list: Turn[], c: Conversation) =>
    fill(
      turns,
      table(
        ['Turn', 'Message', 'Status', 'Yield', 'After', '', ''],
        list.map((t) => [
          h('span', { class: t.left ? 'muted' : '' }, String(t.turn), t.left ? ' (left)' : ''),
          t.message.split('\n', 1)[0] ?? '',
          badge(t.status),
          t.yieldReason ?? '',
          String(t.after),
          t.checkpointId
            ? action('Fork here', async () => {
                const r = await api<{ forks: Conversation[] }>(`${path}/fork`, { method: 'POST', body: { turn: t.turn } });
                location.hash = `#/conversations/${enc(r.forks[0]!.id)}`;
              })
            : '',
          t.checkpointId && c.status !== 'archived' && t.turn !== c.headTurn
            ? action('Rewind here', () => api(`${path}/rewind`, { method: 'POST', body: { turn: t.turn } }), {
                confirm: `Rewind to the end of turn ${t.turn}?`,
              })
            : '',
        ]),
        'No turns yet.',
      ),
    );

  let last = 0;
  let shown = 0;
  every(1000, signal, async () => {
    try {
      const [c, t] = await Promise.all([api<Conversation>(path, { signal }), api<{ turns: Turn[] }>(`${path}/turns`, { signal })]);
      renderHead(c);
      renderTurns(t.turns, c);
      for (;;) {
        const page = await api<{ events: Ev[]; next: number }>(`${path}/events?after=${last}&level=progress&limit=500`, { signal });
        for (const e of page.events) {
          events.appendChild(
            h('span', { class: `line ${e.superseded ? 'muted' : ''}` }, `#${e.seq} t${e.turn} ${e.type} ${JSON.stringify(e.data).slice(0, 400)}\n`),
          );
          if (++shown > MAX_EVENTS) events.firstChild?.remove();
        }
        last = page.next;
        if (page.events.length) events.scrollTop = events.scrollHeight;
        if (page.events.length < 500) break;
      }
    } catch (err) {
      if (!signal.aborted) fill(head, errorBox(err));
    }
  });
};

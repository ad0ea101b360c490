import './style.css';
import { clearKey, consoleConfig, getKey } from './api';
import { h, fill } from './dom';
import type { Page } from './page';
import { signInPage } from './pages/signin';
import { agentsPage } from './pages/agents';
import { sessionsPage } from './pages/sessions';
import { sessionPage } from './pages/session';
import { batchesPage, batchPage } from './pages/batches';
import { sandboxesPage } from './pages/sandboxes';
import { sandboxPage } from './pages/sandbox';
import { hostsPage } from './pages/hosts';
import { conversationPage, conversationsPage } from './pages/conversations';

/** Hash routes (`#/agents/echo/sessions`): the server serves one page, and no key or id goes to it in a path. */
const routes: [RegExp, string[], Page][] = [
  [/^\/signin$/, [], signInPage],
  [/^\/agents$/, [], agentsPage],
  [/^\/agents\/([^/]+)\/sessions$/, ['agentId'], sessionsPage],
  [/^\/agents\/([^/]+)\/sessions\/([^/]+)$/, ['agentId', 'id'], sessionPage],
  [/^\/agents\/([^/]+)\/batches$/, ['agentId'], batchesPage],
  [/^\/agents\/([^/]+)\/batches\/([^/]+)$/, ['agentId', 'id'], batchPage],
  [/^\/agents\/([^/]+)\/conversations$/, ['agentId'], conversationsPage],
  [/^\/conversations\/([^/]+)$/, ['id'], conversationPage],
  [/^\/sandboxes$/, [], sandboxesPage],
  [/^\/sandboxes\/([^/]+)$/, ['id'], sandboxPage],
  [/^\/hosts$/, [], hostsPage],
];

let current: AbortController | null = null;

function header(): void {
  const top = document.getElementById('top')!;
  const signedIn = getKey() !== null;
  // The hosts are the operator's view (every organisation's load): the link shows for operator keys only.
  const hosts = h('a', { href: '#/hosts', class: 'operator-only', hidden: true }, 'Hosts');
  if (signedIn)
    void consoleConfig().then(
      (c) => {
        if (c.role === 'operator') hosts.hidden = false;
        top.querySelector('nav')?.setAttribute('data-role', c.role);
      },
      () => undefined,
    );
  fill(
    top,
    h(
      'nav',
      null,
      h('a', { class: 'brand', href: '#/agents' }, 'Sandbox Agent Platform'),
      signedIn ? [h('a', { href: '#/agents' }, 'Agents'), h('a', { href: '#/sandboxes' }, 'Sandboxes'), hosts] : null,
      h('a', { href: '/docs' }, 'API reference'),
      signedIn
        ? h(
            'button',
            {
              class: 'link',
              onclick: () => {
                clearKey();
                location.hash = '#/signin';
              },
            },
            'Sign out',
          )
        : null,
    ),
  );
}

function route(): void {
  current?.abort();
  const ctl = new AbortController();
  current = ctl;
  const raw = location.hash.replace(/^#/, '') || '/agents';
  const [path, qs] = raw.split('?', 2);
  const main = document.getElementById('main')!;
  header();
  if (!getKey() && path !== '/signin') {
    location.replace('#/signin');
    return;
  }
  for (const [re, names, page] of routes) {
    const m = re.exec(path);
    if (!m) continue;
    const params: Record<string, string> = {};
    names.forEach((n, i) => (params[n] = decodeURIComponent(m[i + 1])));
    const el = h('div', { class: 'page' });
    fill(main, el);
    void Promise.resolve(page(el, { params, query: new URLSearchParams(qs ?? ''), signal: ctl.signal })).catch((err: unknown) => {
      if (!ctl.signal.aborted) fill(el, h('div', { class: 'error' }, String(err)));
    });
    return;
  }
  fill(main, h('div', { class: 'page' }, h('h1', null, 'Not found'), h('p', null, `No page ${path}.`)));
}

window.addEventListener('hashchange', route);
route();

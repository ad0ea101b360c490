import { api, setKey, takeSignOutReason } from '../api';
import { h, fill } from '../dom';
import { errorBox, type Page } from '../page';

/** Sign in with an API key: checked against the API (a wrong key shows the API's refusal), kept in this tab's session storage. */
export const signInPage: Page = (el) => {
  const input = h('input', { type: 'password', name: 'apiKey', autocomplete: 'off', placeholder: 'API key', required: true, 'aria-label': 'API key' });
  const reason = takeSignOutReason();
  // Signed out by a 401 of the API (the key was revoked while in use): its message, as the API said it.
  const out = h('div', null, reason ? errorBox(reason) : null);
  const form = h(
    'form',
    {
      class: 'signin',
      onsubmit: async (e: Event) => {
        e.preventDefault();
        const key = input.value.trim();
        if (!key) return;
        fill(out, h('p', { class: 'loading' }, 'Checking the key…'));
        try {
          await api('/v1/agents?limit=1', { key });
          setKey(key);
          input.value = '';
          location.hash = '#/agents';
        } catch (err) {
          fill(out, errorBox(err));
        }
      },
    },
    h('label', null, 'API key', input),
    h('button', { type: 'submit' }, 'Sign in'),
  );
  fill(
    el,
    h('h1', null, 'Sign in'),
    h('p', { class: 'muted' }, 'The key stays in this tab (session storage) and goes to the API in the X-API-Key header only.'),
    form,
    out,
  );
  input.focus();
};

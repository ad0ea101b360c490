import { ApiError } from './api';
import { h, fill, type Child } from './dom';

/** What a page gets: the route's parameters, the query of the hash, and a signal aborted when the page is left. */
export interface Ctx {
  params: Record<string, string>;
  query: URLSearchParams;
  signal: AbortSignal;
}
export type Page = (el: HTMLElement, ctx: Ctx) => void | Promise<void>;

/** The text of an error as the console shows it: the API's `type: message`. */
export const errorText = (err: unknown): string => (err instanceof ApiError ? err.toString() : String((err as Error)?.message ?? err));

export const errorBox = (err: unknown, retry?: () => void): HTMLElement =>
  h('div', { class: 'error', role: 'alert' }, h('span', null, errorText(err)), retry ? h('button', { onclick: retry }, 'Retry') : null);

/**
 * Shows a loading line in `el`, then what `render` builds from `load()`'s answer, or the error with a
 * Retry button: a failed or timed-out call never leaves a spinner.
 */
export async function section<T>(el: HTMLElement, load: () => Promise<T>, render: (v: T) => Child, signal: AbortSignal): Promise<T | undefined> {
  fill(el, h('p', { class: 'loading' }, 'Loading…'));
  try {
    const v = await load();
    if (signal.aborted) return undefined;
    fill(el, render(v));
    return v;
  } catch (err) {
    if (signal.aborted) return undefined;
    fill(
      el,
      errorBox(err, () => void section(el, load, render, signal)),
    );
    return undefined;
  }
}

/** Runs `fn` every `ms` until the page is left (the first run at once); a failing run shows its error in `status`. */
export function every(ms: number, signal: AbortSignal, fn: () => Promise<unknown>): void {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const run = async (): Promise<void> => {
    try {
      await fn();
    } catch {
      /* the run shows its own error */
    }
    if (!signal.aborted) timer = setTimeout(() => void run(), ms);
  };
  signal.addEventListener('abort', () => clearTimeout(timer));
  void run();
}

/** An action button: disabled while it runs; its error (the API's body) is shown beside it. */
export function action(label: string, fn: () => Promise<unknown>, opts: { confirm?: string; cls?: string } = {}): HTMLElement {
  const out = h('span', { class: 'action-result' });
  const btn: HTMLButtonElement = h(
    'button',
    {
      class: opts.cls,
      onclick: async () => {
        if (opts.confirm && !window.confirm(opts.confirm)) return;
        btn.disabled = true;
        fill(out);
        try {
          await fn();
        } catch (err) {
          fill(out, errorBox(err));
        } finally {
          btn.disabled = false;
        }
      },
    },
    label,
  );
  return h('span', { class: 'action' }, btn, out);
}

import fs from 'node:fs';
import path from 'node:path';
import type { Page } from 'playwright-core';
import { T } from './env';

export { launchChromium } from '../../scripts/console-browser';

/** What each page saw fail: requests that got no answer and console errors, newest last (bounded). */
const seen = new WeakMap<Page, string[]>();

/** Records a page's failed requests and console errors, so a failing step can say what the browser saw. */
export function watchPage(page: Page): void {
  const log: string[] = [];
  seen.set(page, log);
  const push = (line: string): void => {
    log.push(`${new Date().toISOString().slice(11, 23)} ${line}`);
    if (log.length > 30) log.shift();
  };
  page.on('requestfailed', (r) => push(`request failed: ${r.method()} ${r.url()}: ${r.failure()?.errorText ?? '?'}`));
  page.on('console', (m) => {
    if (m.type() === 'error') push(`console error: ${m.text()}`);
  });
  page.on('framenavigated', (f) => {
    if (f === page.mainFrame()) push(`navigated: ${f.url()}`);
  });
}

/**
 * Runs one step of a browser test; when it throws, a screenshot of the page is saved in the test
 * stack's log directory (test-logs/…, the CI artifact), and the page's error boxes, its failed
 * requests and console errors are added to the error's message, so a CI log alone says what the
 * page showed.
 */
export async function withScreenshot<T>(page: Page, name: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    const dir = path.join(T.logDir(), 'console-screenshots');
    fs.mkdirSync(dir, { recursive: true });
    const file = path.join(dir, `${name.replace(/[^a-z0-9-]+/gi, '-')}.png`);
    await page.screenshot({ path: file, fullPage: true }).catch(() => undefined);
    const shown = await page
      .$$eval('.error, .loading', (els) => els.map((e) => `${e.className}: ${(e.textContent ?? '').trim().slice(0, 300)}`))
      .catch((e: Error) => [`(the page could not be read: ${e.message})`]);
    const lines = [`(screenshot: ${file}; url ${page.url()})`, ...shown.map((s) => `page shows ${s}`), ...(seen.get(page) ?? []).map((s) => `browser: ${s}`)];
    throw Object.assign(err as Error, { message: `${(err as Error).message}\n${lines.join('\n')}` });
  }
}

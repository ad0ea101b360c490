import fs from 'node:fs';
import path from 'node:path';
import type { Page } from 'playwright-core';
import { T } from './env';

export { launchChromium } from '../../scripts/console-browser';

/**
 * Runs one step of a browser test; when it throws, a screenshot of the page is saved in the test
 * stack's log directory (test-logs/…, the CI artifact) before the error goes on.
 */
export async function withScreenshot<T>(page: Page, name: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    const dir = path.join(T.logDir(), 'console-screenshots');
    fs.mkdirSync(dir, { recursive: true });
    const file = path.join(dir, `${name.replace(/[^a-z0-9-]+/gi, '-')}.png`);
    await page.screenshot({ path: file, fullPage: true }).catch(() => undefined);
    throw Object.assign(err as Error, { message: `${(err as Error).message}\n(screenshot: ${file})` });
  }
}

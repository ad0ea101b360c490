import { chromium, type Browser, type BrowserContext } from 'playwright-core';

/** Debian's Chromium (scripts/toolchain.sh installs it), driven by playwright-core (its own browser downloads are not used). */
export const CHROMIUM = process.env.SAP_CHROMIUM ?? '/usr/bin/chromium';

export function launchChromium(): Promise<Browser> {
  return chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'], headless: true });
}

/** A browser context signed in to the console with `key` (set in each page's session storage before its scripts run). */
export async function signedInContext(browser: Browser, key: string, viewport = { width: 1280, height: 860 }): Promise<BrowserContext> {
  const context = await browser.newContext({ viewport, acceptDownloads: true });
  await context.addInitScript({ content: `sessionStorage.setItem('sap.console.apiKey', ${JSON.stringify(key)});` });
  return context;
}

/** The median of some numbers, rounded to 0.1. */
export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
  return Math.round(m * 10) / 10;
}

import fs from 'node:fs';
import path from 'node:path';
import { HostClient } from '../sandbox';

/**
 * `npm run bench -- host-create [--n N]` against a running stack (`npm start`): what one sandbox host
 * takes, called directly (its URL from DATA_DIR/stack.json, the token from HOST_TOKEN or
 * DATA_DIR/host.token), so the figures are the host's alone, without the API or a network. N rounds
 * (default 15; the first two are warm-up, not counted), one sandbox at a time, each timed:
 *  - `create_ms`: create a sandbox from the base image;
 *  - `create_entrypoint_ms`: create one with the entrypoint `true`, then wait for its exit (exit code 0);
 *  - `destroy_ms`: destroy that second sandbox.
 * (Formerly printed by test/integration/sandbox-host/sandbox-host-restart.test.ts, which asserted nothing of it.)
 */
export async function benchHostCreate(opts: { n: number }): Promise<Record<string, unknown>> {
  const dataDir = path.resolve(process.env.DATA_DIR ?? path.join(__dirname, '..', '..', '.data'));
  const stackFile = JSON.parse(fs.readFileSync(path.join(dataDir, 'stack.json'), 'utf8')) as { hostUrls?: string[]; hostUrl?: string };
  const url = stackFile.hostUrls?.[0] ?? stackFile.hostUrl;
  if (!url) throw new Error(`no sandbox host in ${path.join(dataDir, 'stack.json')}`);
  const token = process.env.HOST_TOKEN ?? fs.readFileSync(path.join(dataDir, 'host.token'), 'utf8').trim();
  const host = new HostClient({ url, token });
  const tag = Date.now().toString(36);
  const create: number[] = [];
  const withEntrypoint: number[] = [];
  const destroy: number[] = [];
  const warmUp = 2;
  for (let i = 0; i < opts.n + warmUp; i++) {
    const keep = i >= warmUp;
    const id = `sb-bench-hc-${tag}-${i}`;
    let t = performance.now();
    await host.createSandbox({ id, orgId: 'bench' });
    if (keep) create.push(performance.now() - t);
    await host.destroySandbox(id);
    const id2 = `${id}-e`;
    t = performance.now();
    await host.createSandbox({ id: id2, orgId: 'bench', entrypoint: { argv: ['true'] } });
    const st = await host.entrypointStatus(id2, { waitMs: 10_000 });
    if (keep) withEntrypoint.push(performance.now() - t);
    if (st.state !== 'exited' || st.exitCode !== 0) throw new Error(`entrypoint 'true': ${JSON.stringify(st)}`);
    t = performance.now();
    await host.destroySandbox(id2);
    if (keep) destroy.push(performance.now() - t);
  }
  const pct = (xs: number[], p: number) => {
    const s = [...xs].sort((a, b) => a - b);
    return Math.round(s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]! * 10) / 10;
  };
  const stats = (xs: number[]) => ({ p50: pct(xs, 50), p95: pct(xs, 95) });
  return { bench: 'host-create', n: opts.n, host: url, create_ms: stats(create), create_entrypoint_ms: stats(withEntrypoint), destroy_ms: stats(destroy) };
}

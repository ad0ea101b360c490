import fs from 'node:fs';
import path from 'node:path';
import { HostClient } from '../sandbox';

/**
 * `npm run bench -- layers [--n N] [--mb 1,100]` against a running stack with two or more hosts
 * (`SANDBOX_HOSTS=2 npm start`): what a checkpoint's spawn costs on the host that has its layer
 * against another host, which first copies the layer host to host (streamed tar, content hash
 * checked) and then keeps it. It talks to the hosts directly (their URLs from DATA_DIR/stack.json,
 * the token from HOST_TOKEN or DATA_DIR/host.token), so the figures are the hosts' alone.
 * For each size: a sandbox on host 1 writes that many random bytes and is checkpointed; then N
 * times each, timed to the created sandbox: a spawn on host 1 (local layer), a spawn on host 2
 * after its copy was deleted (copy + spawn: "cold"), and a spawn on host 2 with the copy kept ("cached").
 */
export async function benchLayers(opts: { n: number; sizesMB: number[] }): Promise<Record<string, unknown>> {
  const dataDir = path.resolve(process.env.DATA_DIR ?? path.join(__dirname, '..', '..', '.data'));
  const stackFile = JSON.parse(fs.readFileSync(path.join(dataDir, 'stack.json'), 'utf8')) as { hostUrls?: string[] };
  const urls = stackFile.hostUrls ?? [];
  if (urls.length < 2) throw new Error(`the stack in ${dataDir} runs ${urls.length} host(s): start it with SANDBOX_HOSTS=2`);
  const token = process.env.HOST_TOKEN ?? fs.readFileSync(path.join(dataDir, 'host.token'), 'utf8').trim();
  const [a, b] = [new HostClient({ url: urls[0]!, token }), new HostClient({ url: urls[1]!, token })];
  const tag = Date.now().toString(36);
  const out: Record<string, unknown> = { bench: 'layers', n: opts.n, hosts: urls.length };
  const p50 = (xs: number[]) => Math.round([...xs].sort((x, y) => x - y)[Math.floor((xs.length - 1) / 2)]! * 10) / 10;
  for (const mb of opts.sizesMB) {
    const origin = `sb-bench-${tag}-${mb}`;
    await a.createSandbox({ id: origin, orgId: 'bench' });
    const r = await a.execRun(origin, { cmd: 'bash', args: ['-c', `head -c ${mb * 1024 * 1024} /dev/urandom > /workspace/blob`] });
    if (r.exitCode !== 0) throw new Error(`writing ${mb} MB: ${r.stderr}`);
    const { layerId } = await a.createCheckpoint(origin, `cp-bench-${tag}-${mb}`);
    await a.destroySandbox(origin);
    const spawn = async (host: HostClient, i: number, kind: string): Promise<number> => {
      const id = `sb-bench-${tag}-${mb}-${kind}-${i}`;
      const t0 = performance.now();
      if (kind === 'cold') await host.fetchLayer(layerId, urls[0]!);
      await host.createSandbox({ id, orgId: 'bench', layers: [layerId] });
      const ms = performance.now() - t0;
      await host.destroySandbox(id);
      return ms;
    };
    const local: number[] = [];
    const cold: number[] = [];
    const cached: number[] = [];
    for (let i = 0; i < opts.n; i++) {
      local.push(await spawn(a, i, 'local'));
      await b.deleteLayer(layerId);
      cold.push(await spawn(b, i, 'cold'));
      cached.push(await spawn(b, i, 'cached'));
    }
    out[`spawn_${mb}mb_ms`] = { same_host: p50(local), other_host_copy: p50(cold), other_host_cached: p50(cached) };
    await Promise.all([a.deleteLayer(layerId), b.deleteLayer(layerId)]);
  }
  return out;
}

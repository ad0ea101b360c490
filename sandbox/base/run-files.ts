/**
 * The files of one entrypoint run: the host writes a pending ticket, the helper's claim renames it
 * (sap-sandbox-enter -R), and a host that died mid-start settles the run by one rename of its own.
 */
import { promises as fsp } from 'node:fs';
import * as path from 'node:path';

/** The files of one entrypoint run (`run`: its id): the caller writes `pending`, the helper's claim renames it to `claimed`. */
export function runFiles(dir: string, run: string): { claimed: string; pending: string; cancelled: string } {
  const claimed = path.join(dir, `entrypoint.run-${run}`);
  return { claimed, pending: `${claimed}.pending`, cancelled: `${claimed}.cancelled` };
}

/**
 * Decides the fate of a run whose start a host did not finish (it died in between): `cancelled`
 * when the run's pending file could be renamed away (its helper, started or not, can then never
 * claim it: the run never began and never will); `started` when the helper's claim is there (with
 * the pid it wrote); `never` when neither is (the host died before writing the pending file).
 * One rename decides against the helper's own rename, so exactly one of the two wins.
 */
export async function settleInterruptedRun(dir: string, run: string): Promise<{ outcome: 'cancelled' | 'never' } | { outcome: 'started'; pid: number | null }> {
  const f = runFiles(dir, run);
  try {
    await fsp.rename(f.pending, f.cancelled);
    await fsp.rm(f.cancelled, { force: true });
    return { outcome: 'cancelled' };
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  const text = await fsp.readFile(f.claimed, 'utf8').catch(() => null);
  if (text === null) return { outcome: 'never' };
  const pid = /^\d+\n/.test(text) ? Number(text.trim()) : null;
  return { outcome: 'started', pid };
}

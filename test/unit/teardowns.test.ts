/**
 * Teardowns behind destroy's answer (sandbox/namespaces/teardowns.ts): at most a few at once, each
 * record removed only once its teardown has finished, a failed one kept for the next start, and a
 * start that finishes every one written down (moving the names of one whose record was never written).
 */
import { promises as fsp } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import pino from 'pino';
import { PendingTeardowns, type TeardownRecord } from '../../sandbox/namespaces/teardowns';

const log = pino({ level: 'silent' });
let dir: string;

beforeEach(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-teardowns-'));
});
afterEach(async () => {
  await fsp.rm(dir, { recursive: true, force: true });
});

const recordOf = (q: PendingTeardowns, id: string, token = `${id}.abc`): TeardownRecord => ({
  id,
  token,
  groups: `gone-${token}`,
  dir: q.pathOf(token),
  disk: null,
  scratch: null,
});

describe('PendingTeardowns', () => {
  it('runs at most `inFlight` teardowns at once, and removes each record once its teardown has finished', async () => {
    let running = 0;
    let most = 0;
    const release: (() => void)[] = [];
    const q = new PendingTeardowns(
      path.join(dir, 'teardown'),
      async () => {
        most = Math.max(most, ++running);
        await new Promise<void>((r) => release.push(r));
        running--;
      },
      log,
      2,
    );
    await q.makeDir();
    for (let i = 0; i < 5; i++) {
      const rec = recordOf(q, `sb-${i}`);
      await q.record(rec);
      q.enqueue(rec);
    }
    expect(q.pending()).toBe(5);
    expect(running).toBe(2);
    const drained = q.drain();
    while (q.pending() > 0) {
      // Each release lets the next queued teardown start.
      await new Promise((r) => setImmediate(r));
      release.shift()?.();
    }
    await drained;
    expect(most).toBe(2);
    expect(await fsp.readdir(path.join(dir, 'teardown'))).toEqual([]);
  });

  it('keeps the record of a teardown that failed, and a start finishes it and one whose record was never written', async () => {
    const tdir = path.join(dir, 'teardown');
    const failing = new PendingTeardowns(tdir, () => Promise.reject(new Error('EBUSY')), log);
    await failing.makeDir();
    const rec = recordOf(failing, 'sb-a');
    await fsp.mkdir(rec.dir);
    await failing.record(rec);
    failing.enqueue(rec);
    await failing.drain();
    expect((await fsp.readdir(tdir)).sort()).toEqual(['sb-a.abc', 'sb-a.abc.json']);
    // A destroy cut between the move of its directory and its record.
    await fsp.mkdir(path.join(tdir, 'sb-b.def'));
    const finished: string[] = [];
    const redetached: string[] = [];
    const next = new PendingTeardowns(
      tdir,
      async (r) => {
        finished.push(r.token);
        await fsp.rm(r.dir, { recursive: true, force: true });
      },
      log,
    );
    const count = await next.replay(async (token) => {
      redetached.push(token);
      return recordOf(next, token.slice(0, token.lastIndexOf('.')), token);
    });
    expect(count).toBe(2);
    expect(redetached).toEqual(['sb-b.def']);
    expect(finished.sort()).toEqual(['sb-a.abc', 'sb-b.def']);
    expect(await fsp.readdir(tdir)).toEqual([]);
  });
});

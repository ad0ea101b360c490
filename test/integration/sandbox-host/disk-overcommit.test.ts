/**
 * SANDBOX_DISK_OVERCOMMIT against a real host: the disks of its running sandboxes may add up to at
 * most that many times the free space of DATA_DIR. Here the ratio is set so that one 4096 MB disk
 * fits and two do not: the second create is refused with 503 `unavailable` and a message that
 * names the setting, leaves nothing behind (no image, no state), and fits once the first is gone.
 */
import { promises as fsp } from 'node:fs';
import * as path from 'node:path';
import { HostError } from '../../../contract/errors';
import { freeMBOf } from '../../../sandbox/namespaces/disk';
import { startTestHost, stopTestHost, type TestHost } from '../../helpers/sandbox-host';

describe('sandbox host: disk overcommit check (SANDBOX_DISK_OVERCOMMIT)', () => {
  let t: TestHost | undefined;
  const saved = process.env.SANDBOX_DISK_OVERCOMMIT;
  const n = { i: 0 };
  const newId = () => `sb-do${process.pid}-${++n.i}`;

  beforeAll(async () => {
    // A budget of ~6000 MB whatever this machine's free space: 4096 fits, 4096 + 4096 does not.
    const free = await freeMBOf(require('node:os').tmpdir());
    process.env.SANDBOX_DISK_OVERCOMMIT = (6000 / free).toFixed(6);
    t = await startTestHost();
  });
  afterAll(async () => {
    if (saved === undefined) delete process.env.SANDBOX_DISK_OVERCOMMIT;
    else process.env.SANDBOX_DISK_OVERCOMMIT = saved;
    await stopTestHost(t);
  });

  it('refuses a disk past the budget with 503 unavailable, leaves nothing of it, and fits it once room is back', async () => {
    const { client, dataDir } = t!;
    const a = newId();
    const b = newId();
    await client.createSandbox({ id: a, orgId: 'o', diskMB: 4096 });
    const err = await client.createSandbox({ id: b, orgId: 'o', diskMB: 4096 }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(HostError);
    expect((err as HostError).status).toBe(503);
    expect((err as HostError).type).toBe('unavailable');
    expect((err as Error).message).toMatch(/SANDBOX_DISK_OVERCOMMIT/);
    expect((err as Error).message).toMatch(/4096 MB/);
    // Nothing of the refused one: no image, no sandbox directory, not listed.
    const disks = await fsp.readdir(path.join(dataDir, 'disks')).catch(() => [] as string[]);
    expect(disks.filter((f) => f.startsWith(b))).toEqual([]);
    await expect(fsp.stat(path.join(dataDir, 'sandboxes', b))).rejects.toThrow();
    expect((await client.listSandboxes()).map((s) => s.id)).toEqual([a]);
    // A small disk still fits beside the first.
    const c = newId();
    await client.createSandbox({ id: c, orgId: 'o', diskMB: 256 });
    await client.destroySandbox(c);
    await client.destroySandbox(a);
    await client.createSandbox({ id: b, orgId: 'o', diskMB: 4096 });
    await client.destroySandbox(b);
  });
});

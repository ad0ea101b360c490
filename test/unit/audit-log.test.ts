import { promises as fsp } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { AuditLog } from '../../sandbox/audit-log';

describe('entrypoint audit log', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-audit-'));
  });
  afterEach(async () => {
    await fsp.rm(dir, { recursive: true, force: true });
  });

  const entry = (i: number) => ({
    at: new Date().toISOString(),
    event: 'entrypoint_start' as const,
    sandboxId: `sb-${i}`,
    orgId: 'o',
    hostId: 'h',
    owner: { kind: 'session', id: `sess_${i}` },
  });

  it('writes one whole line per record, also for records made at once, and resolves each after it is written', async () => {
    const file = path.join(dir, 'audit', 'entrypoints.ndjson');
    const log = new AuditLog(file);
    try {
      await Promise.all(Array.from({ length: 200 }, (_, i) => log.record(entry(i))));
      const lines = (await fsp.readFile(file, 'utf8')).split('\n');
      expect(lines.pop()).toBe('');
      expect(lines.map((l) => JSON.parse(l).sandboxId).sort()).toEqual(Array.from({ length: 200 }, (_, i) => `sb-${i}`).sort());
      // Each record is on disk when its promise resolves.
      await log.record(entry(1000));
      expect(await fsp.readFile(file, 'utf8')).toContain('"sb-1000"');
    } finally {
      await log.close();
    }
  });

  it('fails the records it could not write, and writes again once it can', async () => {
    const blocker = path.join(dir, 'audit');
    await fsp.writeFile(blocker, 'a file where the directory should be');
    const log = new AuditLog(path.join(blocker, 'entrypoints.ndjson'));
    try {
      await expect(log.record(entry(1))).rejects.toThrow();
      await fsp.rm(blocker);
      await log.record(entry(2));
      expect(await fsp.readFile(path.join(blocker, 'entrypoints.ndjson'), 'utf8')).toMatch(/^\{.*"sb-2".*\}\n$/);
    } finally {
      await log.close();
    }
  });
});

/**
 * Disk images (sandbox/namespaces/disk.ts): a sparse ext4 image of diskMB, root's alone, made whole
 * or not at all; spares made ahead and handed out by size; leftovers swept at a host's start.
 */
import { promises as fsp } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import pino from 'pino';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import {
  DEFAULT_DISK_OVERCOMMIT,
  DiskImages,
  diskOvercommitFromEnv,
  diskRoomProblem,
  findMkfs,
  freeMBOf,
  makeDiskImage,
  makeDiskTemplate,
  writeFromTemplate,
} from '../../sandbox/namespaces/disk';

const execFileP = promisify(execFile);

const log = pino({ level: 'silent' });
let dir: string;
let mkfs: string | null;

beforeAll(async () => {
  mkfs = await findMkfs();
});
beforeEach(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-disk-'));
});
afterEach(async () => {
  await fsp.rm(dir, { recursive: true, force: true });
});

/** Waits until `check` holds (the spares are made in the background). */
async function until(check: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 200 && !(await check()); i++) await new Promise((r) => setTimeout(r, 25));
  expect(await check()).toBe(true);
}

describe('disk images', () => {
  it('makes a sparse ext4 image of diskMB, 0600, with the ext4 magic in its superblock', async () => {
    expect(mkfs).not.toBeNull();
    const file = path.join(dir, 'a.img');
    await makeDiskImage(file, 1024, mkfs!);
    const st = await fsp.stat(file);
    expect(st.size).toBe(1024 * 1024 * 1024);
    expect(st.mode & 0o777).toBe(0o600);
    expect(st.blocks * 512).toBeLessThan(8 * 1024 * 1024);
    const sb = Buffer.alloc(2);
    const h = await fsp.open(file, 'r');
    await h.read(sb, 0, 2, 1024 + 0x38);
    await h.close();
    expect(sb.readUInt16LE(0)).toBe(0xef53);
    expect(await fsp.readdir(dir)).toEqual(['a.img']);
  });

  it('leaves nothing behind when mkfs fails', async () => {
    await expect(makeDiskImage(path.join(dir, 'b.img'), 64, '/bin/false')).rejects.toThrow();
    expect(await fsp.readdir(dir)).toEqual([]);
  });

  it('hands out spares of the size asked for, adopts a spare helper’s image only of the right size, removes images, sweeps leftovers', async () => {
    const disks = new DiskImages(path.join(dir, 'disks'), mkfs!, 64, 2, log);
    await fsp.mkdir(disks.dir, { recursive: true });
    for (const name of ['kept.img', 'gone.img', 'spare-1-a.img', 'pool-1-0.img', 'x.img.tmp-1']) await fsp.writeFile(path.join(disks.dir, name), '');
    await disks.start((id) => id === 'kept');
    expect((await fsp.stat(disks.dir)).mode & 0o777).toBe(0o700);
    const pool = async () => (await fsp.readdir(disks.dir)).filter((n) => n.startsWith('pool-') && n.endsWith('.img'));
    await until(async () => (await pool()).length === 2);
    expect((await fsp.readdir(disks.dir)).filter((n) => !n.startsWith('pool-'))).toEqual(['kept.img']);
    const file = await disks.take('sb-1', 64);
    expect(file).toBe(path.join(disks.dir, 'sb-1.img'));
    expect((await fsp.stat(file)).size).toBe(64 * 1024 * 1024);
    // Another size: made on the spot; spares follow it.
    expect((await fsp.stat(await disks.take('sb-2', 32))).size).toBe(32 * 1024 * 1024);
    expect(disks.spareSize).toBe(32);
    const helperImage = await disks.take('spare-9-x', disks.spareSize);
    expect(await disks.adopt('sb-3', helperImage, 64)).toBe(false);
    await expect(fsp.stat(helperImage)).rejects.toThrow();
    const helperImage2 = await disks.take('spare-9-y', disks.spareSize);
    expect(await disks.adopt('sb-4', helperImage2, 32)).toBe(true);
    expect((await fsp.stat(disks.fileOf('sb-4'))).size).toBe(32 * 1024 * 1024);
    await disks.remove('sb-1');
    await expect(fsp.stat(file)).rejects.toThrow();
    await disks.close();
    expect(await pool()).toEqual([]);
  });
});

describe('disk image templates', () => {
  it('copies of a template are sparse, whole ext4 images identical to it, made without mkfs', async () => {
    const t = await makeDiskTemplate(dir, 1024, mkfs!);
    expect(t.bytes).toBe(1024 * 1024 * 1024);
    // The template file itself is gone: only its extents are kept, in memory.
    expect(await fsp.readdir(dir)).toEqual([]);
    const file = path.join(dir, 'c.img');
    await writeFromTemplate(file, t);
    const st = await fsp.stat(file);
    expect(st.size).toBe(t.bytes);
    expect(st.mode & 0o777).toBe(0o600);
    expect(st.blocks * 512).toBeLessThan(8 * 1024 * 1024);
    const h = await fsp.open(file, 'r');
    for (const e of t.extents) {
      const b = Buffer.alloc(e.data.length);
      await h.read(b, 0, b.length, e.offset);
      expect(b.equals(e.data)).toBe(true);
    }
    const sb = Buffer.alloc(2);
    await h.read(sb, 0, 2, 1024 + 0x38);
    await h.close();
    expect(sb.readUInt16LE(0)).toBe(0xef53);
    // The filesystem checks clean (e2fsck -n reads only).
    const fsck = path.join(path.dirname(mkfs!), 'e2fsck');
    await expect(execFileP(fsck, ['-n', '-f', file])).resolves.toBeDefined();
    // A name taken is never overwritten halfway: the copy lands whole, by rename.
    await writeFromTemplate(file, t);
    expect((await fsp.readdir(dir)).sort()).toEqual(['c.img']);
  });

  it('an image is made from the template of its size by DiskImages.make', async () => {
    const disks = new DiskImages(path.join(dir, 'disks'), '/bin/false', 64, 0, log);
    await disks.makeDir();
    // No working mkfs: neither a template nor an image can be made, and nothing is left behind.
    await expect(disks.make(path.join(disks.dir, 'x.img'), 64)).rejects.toThrow();
    expect(await fsp.readdir(disks.dir)).toEqual([]);
    const good = new DiskImages(path.join(dir, 'disks'), mkfs!, 64, 0, log);
    await good.make(path.join(good.dir, 'y.img'), 64);
    await good.make(path.join(good.dir, 'z.img'), 64);
    expect((await fsp.readdir(good.dir)).sort()).toEqual(['y.img', 'z.img']);
    expect((await fsp.stat(path.join(good.dir, 'z.img'))).size).toBe(64 * 1024 * 1024);
  });
});

describe('disk overcommit (SANDBOX_DISK_OVERCOMMIT)', () => {
  it('reads the setting: default, 0 (off), fractions; refuses anything else', () => {
    expect(diskOvercommitFromEnv({})).toBe(DEFAULT_DISK_OVERCOMMIT);
    expect(diskOvercommitFromEnv({ SANDBOX_DISK_OVERCOMMIT: '0' })).toBe(0);
    expect(diskOvercommitFromEnv({ SANDBOX_DISK_OVERCOMMIT: '1.5' })).toBe(1.5);
    for (const bad of ['-1', 'x', '1e3', '1001', '0x10']) {
      expect(() => diskOvercommitFromEnv({ SANDBOX_DISK_OVERCOMMIT: bad })).toThrow(/SANDBOX_DISK_OVERCOMMIT/);
    }
  });

  it('fits a disk while the running ones and it stay within ratio × the free space', () => {
    expect(diskRoomProblem({ askMB: 1024, liveMB: 0, freeMB: 2048, ratio: 1 })).toBeNull();
    expect(diskRoomProblem({ askMB: 1024, liveMB: 1024, freeMB: 2048, ratio: 1 })).toBeNull();
    expect(diskRoomProblem({ askMB: 1024, liveMB: 1025, freeMB: 2048, ratio: 1 })).toMatch(/SANDBOX_DISK_OVERCOMMIT/);
    expect(diskRoomProblem({ askMB: 10240, liveMB: 30720, freeMB: 2048, ratio: 20 })).toBeNull();
    expect(diskRoomProblem({ askMB: 10240, liveMB: 40960, freeMB: 2048, ratio: 20 })).toMatch(/40960 MB/);
    // Off: nothing is checked; a full disk is refused whatever the ratio.
    expect(diskRoomProblem({ askMB: 10240, liveMB: 1e9, freeMB: 0, ratio: 0 })).toBeNull();
    expect(diskRoomProblem({ askMB: 16, liveMB: 0, freeMB: 8, ratio: 1000 })).toMatch(/8 MB free/);
  });

  it('fits as many default sandboxes in a given free space as before the default disk went to 20 GB: 2 per GB free', () => {
    const free = 10 * 1024;
    const problem = (n: number) => diskRoomProblem({ askMB: 20480, liveMB: (n - 1) * 20480, freeMB: free, ratio: DEFAULT_DISK_OVERCOMMIT });
    expect(problem(20)).toBeNull();
    expect(problem(21)).toMatch(/SANDBOX_DISK_OVERCOMMIT/);
  });

  it('measures the free space of a directory', async () => {
    const free = await freeMBOf(dir);
    expect(free).toBeGreaterThan(0);
  });
});

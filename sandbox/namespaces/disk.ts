/**
 * A sandbox's disk: its writable layer is an ext4 filesystem of `diskMB` in a sparse image file on the
 * host's storage (DATA_DIR/disks/<id>.img), attached to a loop device and mounted by the init helper in
 * the sandbox's own mount namespace (tools/sandbox-init, -I). The filesystem's size is the quota: a
 * write past it gets ENOSPC; the file costs what is written (a fresh image is about 230 KB on disk).
 * See docs/disk.md for why this and not a tmpfs, project quotas or btrfs.
 *
 * Each image is a copy of a template made once per size by mkfs.ext4 (see makeDiskTemplate: a copy
 * writes ~160 KiB, where a mkfs.ext4 process per image cost the host ~6 ms of CPU to fork and ~10 ms
 * to run). Images are also made ahead (`pool-<n>.img` of the size asked for last, renamed into place); the spare init helper mounts one ahead too (`spare-….img`, see ./init-helpers), since
 * attaching a loop device and mounting waits for the kernel (3-30 ms on a busy machine). An image of
 * another size is made at its create.
 */
import { execFile } from 'node:child_process';
import { promises as fsp, constants as fsc } from 'node:fs';
import * as path from 'node:path';
import { promisify } from 'node:util';
import type { Logger } from 'pino';
import { renameNow } from '../quick-fs';

const execFileP = promisify(execFile);

/**
 * mkfs.ext4 options: no journal (a sandbox's layer does not outlive a machine's crash: running
 * sandboxes die with it), no blocks reserved for root or for growth, inode tables left for the kernel
 * to treat as unused (lazy_itable_init; the helper mounts with noinit_itable so nothing zeroes them),
 * no discard of a file that is all holes anyway.
 */
const MKFS_ARGS = ['-q', '-F', '-O', '^has_journal,^resize_inode', '-E', 'lazy_itable_init=1,nodiscard', '-m', '0', '-L', 'sandbox'];

/** Where mkfs.ext4 is looked for (the host runs as root; sbin may be missing from PATH). */
const MKFS_CANDIDATES = ['/usr/sbin/mkfs.ext4', '/sbin/mkfs.ext4', '/usr/bin/mkfs.ext4'];

/** The smallest image mkfs.ext4 makes a usable filesystem of. */
const MIN_DISK_MB = 16;

/**
 * SANDBOX_DISK_OVERCOMMIT's default: see diskOvercommitFromEnv. 40 since the default disk went from
 * 10 to 20 GB (OpenComputer's): as many default sandboxes fit in a given free space as before (2 per
 * GB free), since a sandbox writes no more for being offered more.
 */
export const DEFAULT_DISK_OVERCOMMIT = 40;

/**
 * SANDBOX_DISK_OVERCOMMIT: how many times DATA_DIR's free space the disks of a host's running
 * sandboxes may add up to (their images are sparse: each costs what is written); `0` turns the check
 * off. A number from 0 to 1000 (fractions allowed); throws on anything else.
 */
export function diskOvercommitFromEnv(env: NodeJS.ProcessEnv): number {
  const text = env.SANDBOX_DISK_OVERCOMMIT?.trim();
  if (!text) return DEFAULT_DISK_OVERCOMMIT;
  const n = Number(text);
  if (!/^\d+(\.\d+)?$/.test(text) || n > 1000) throw new Error(`SANDBOX_DISK_OVERCOMMIT: must be a number from 0 to 1000 (got ${text})`);
  return n;
}

/**
 * Why a new disk of `askMB` does not fit (null when it does): the disks of the running sandboxes
 * (`liveMB`, their sizes summed) and it may add up to at most `ratio` × the free space of DATA_DIR
 * (`freeMB`); and the free space must at least hold the new disk's floor (MIN_DISK_MB), whatever the ratio.
 */
export function diskRoomProblem(o: { askMB: number; liveMB: number; freeMB: number; ratio: number }): string | null {
  if (o.ratio === 0) return null;
  if (o.freeMB < MIN_DISK_MB) return `DATA_DIR has ${Math.floor(o.freeMB)} MB free`;
  const budget = Math.floor(o.ratio * o.freeMB);
  if (o.liveMB + o.askMB > budget) {
    return (
      `its running sandboxes' disks (${o.liveMB} MB) and this one (${o.askMB} MB) would exceed ${o.ratio} × the ` +
      `${Math.floor(o.freeMB)} MB free in DATA_DIR (SANDBOX_DISK_OVERCOMMIT)`
    );
  }
  return null;
}

/** Free space of the filesystem holding `dir`, in MB (what an unprivileged writer could use is not the point: root writes the images). */
export async function freeMBOf(dir: string): Promise<number> {
  const st = await fsp.statfs(dir);
  return (st.bavail * st.bsize) / (1024 * 1024);
}

/** The mkfs.ext4 of this machine, or null (then the writable layer stays a tmpfs). */
export async function findMkfs(): Promise<string | null> {
  for (const c of MKFS_CANDIDATES) {
    if (
      await fsp.access(c, fsc.X_OK).then(
        () => true,
        () => false,
      )
    )
      return c;
  }
  return null;
}

/** Whether this machine can give sandboxes disk images: mkfs.ext4 and the loop devices' control file. */
export async function diskImagesSupported(): Promise<string | null> {
  const mkfs = await findMkfs();
  if (!mkfs) return null;
  const loop = await fsp.stat('/dev/loop-control').catch(() => null);
  return loop?.isCharacterDevice() ? mkfs : null;
}

/**
 * Makes `file`: a sparse ext4 image of `diskMB` MB, root's alone (0600), made under a temporary name
 * and renamed, so that `file` is always a whole image.
 */
export async function makeDiskImage(file: string, diskMB: number, mkfs = '/usr/sbin/mkfs.ext4'): Promise<void> {
  const tmp = `${file}.tmp-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
  try {
    const h = await fsp.open(tmp, fsc.O_CREAT | fsc.O_EXCL | fsc.O_WRONLY | fsc.O_NOFOLLOW, 0o600);
    try {
      await h.truncate(Math.max(diskMB, MIN_DISK_MB) * 1024 * 1024);
    } finally {
      await h.close();
    }
    await execFileP(mkfs, [...MKFS_ARGS, tmp], { timeout: 30000 });
    await fsp.rename(tmp, file);
  } catch (err) {
    await fsp.rm(tmp, { force: true });
    throw err;
  }
}

/**
 * A pristine image of one size, kept in memory: its size and the data of its allocated extents (what
 * mkfs.ext4 wrote: about 160 KiB in 17 extents for 10 GiB). A copy of it is a new, empty filesystem.
 */
export interface DiskTemplate {
  bytes: number;
  extents: { offset: number; data: Buffer }[];
}

/** Lists a file's allocated extents (SEEK_DATA / SEEK_HOLE, which Node does not offer) as "start end" lines. */
const LIST_EXTENTS = [
  'import os, sys',
  'f = os.open(sys.argv[1], os.O_RDONLY); end = os.fstat(f).st_size; o = 0',
  'while o < end:',
  '    try: d = os.lseek(f, o, os.SEEK_DATA)',
  '    except OSError: break',
  '    o = os.lseek(f, d, os.SEEK_HOLE); print(d, o)',
].join('\n');

/** The largest template kept in memory (its extents' data); a larger one falls back to mkfs per image. */
const MAX_TEMPLATE_DATA = 64 * 1024 * 1024;

/**
 * Makes an image of `diskMB` with mkfs.ext4 once (in `dir`, removed after) and reads its allocated
 * extents into memory: copies of it (writeFromTemplate) cost a few writes instead of a mkfs.ext4
 * process (its fork alone costs the host ~6 ms of CPU).
 */
export async function makeDiskTemplate(dir: string, diskMB: number, mkfs: string): Promise<DiskTemplate> {
  const file = path.join(dir, `template-${process.pid}-${diskMB}-${Math.random().toString(36).slice(2, 8)}.img`);
  try {
    await makeDiskImage(file, diskMB, mkfs);
    const { stdout } = await execFileP('python3', ['-c', LIST_EXTENTS, file], { timeout: 30000 });
    const ranges = stdout
      .trim()
      .split('\n')
      .filter(Boolean)
      .map((l) => l.split(' ').map(Number) as [number, number]);
    if (ranges.length === 0 || ranges.some(([a, b]) => !(b > a)) || ranges.reduce((n, [a, b]) => n + b - a, 0) > MAX_TEMPLATE_DATA) {
      throw new Error(`unexpected extents of a fresh image: ${stdout.slice(0, 200)}`);
    }
    const h = await fsp.open(file, 'r');
    try {
      const extents: DiskTemplate['extents'] = [];
      for (const [a, b] of ranges) {
        const data = Buffer.alloc(b - a);
        const { bytesRead } = await h.read(data, 0, data.length, a);
        if (bytesRead !== data.length) throw new Error('short read of a template image');
        extents.push({ offset: a, data });
      }
      return { bytes: (await h.stat()).size, extents };
    } finally {
      await h.close();
    }
  } finally {
    await fsp.rm(file, { force: true });
  }
}

/** Makes `file` a copy of `template` (sparse: only its extents are written), root's alone (0600), whole or not at all. */
export async function writeFromTemplate(file: string, template: DiskTemplate): Promise<void> {
  const tmp = `${file}.tmp-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
  try {
    const h = await fsp.open(tmp, fsc.O_CREAT | fsc.O_EXCL | fsc.O_WRONLY | fsc.O_NOFOLLOW, 0o600);
    try {
      await h.truncate(template.bytes);
      for (const e of template.extents) await h.write(e.data, 0, e.data.length, e.offset);
      // Written back now, while the image is made ahead: attaching a loop device with direct I/O
      // flushes a file's dirty pages first, and that wait (4–75 ms measured here) would be the create's.
      await h.datasync();
    } finally {
      await h.close();
    }
    await fsp.rename(tmp, file);
  } catch (err) {
    await fsp.rm(tmp, { force: true });
    throw err;
  }
}

/** The images of one host: DATA_DIR/disks, with spares of the default size made ahead. */
export class DiskImages {
  private spares: string[] = [];
  private making = 0;
  /** The spare being made, if any (close waits for it). */
  private inFlight: Promise<unknown> | null = null;
  private seq = 0;
  private closed = false;
  /** One template per size asked for (few: the default and what operators allow); a failed one falls back to mkfs. */
  private readonly templates = new Map<number, Promise<DiskTemplate | null>>();

  /**
   * `dir`: where images live (on real storage: never a tmpfs); `mkfs`: see diskImagesSupported;
   * `spareMB`: the size spares are made of; `spareCount`: how many are kept ready (0: none).
   */
  constructor(
    readonly dir: string,
    private readonly mkfs: string,
    private spareMB: number,
    private readonly spareCount: number,
    private readonly log: Logger,
  ) {}

  /** The size spares are made of: the one asked for last. */
  get spareSize(): number {
    return this.spareMB;
  }

  /** The image of sandbox `id`. */
  fileOf(id: string): string {
    return path.join(this.dir, `${id}.img`);
  }

  /**
   * Makes the directory, and removes every image no sandbox in `keep` owns (leftovers of a host that
   * died, spares of an earlier run whose size may differ), then starts making spares.
   */
  async start(keep: (id: string) => boolean): Promise<void> {
    await this.makeDir();
    for (const name of await fsp.readdir(this.dir)) {
      const id = name.endsWith('.img') ? name.slice(0, -'.img'.length) : null;
      // This process's own files (spare helpers' images, spares and templates being made) are in use:
      // the pool may start before adoption ends.
      if (['spare', 'pool', 'template'].some((p) => name.startsWith(`${p}-${process.pid}-`))) continue;
      if (id && !id.startsWith('spare-') && !id.startsWith('pool-') && keep(id)) continue;
      await fsp.rm(path.join(this.dir, name), { force: true, recursive: true });
    }
    this.refill();
  }

  /** Makes the directory (root's alone). */
  async makeDir(): Promise<void> {
    await fsp.mkdir(this.dir, { recursive: true, mode: 0o700 });
    await fsp.chmod(this.dir, 0o700);
  }

  /** Gives sandbox `id` a fresh image of `diskMB` (a spare when one of that size is ready); answers its file. */
  async take(id: string, diskMB: number): Promise<string> {
    const file = this.fileOf(id);
    await fsp.rm(file, { force: true });
    // Spares follow the size asked for last (the operator's default, in practice).
    if (diskMB !== this.spareMB) {
      this.spareMB = diskMB;
      for (const f of this.spares.splice(0)) await fsp.rm(f, { force: true });
    }
    const spare = this.spares.shift();
    if (spare) {
      try {
        await fsp.rename(spare, file);
        this.refill();
        return file;
      } catch (err) {
        this.log.warn({ err }, 'a spare disk image was gone');
      }
    }
    await this.make(file, diskMB);
    this.refill();
    return file;
  }

  /**
   * Makes `file` (a spare helper's image, mounted ahead) sandbox `id`'s when it has `diskMB`; answers
   * false (and removes it) otherwise: the caller then gives the sandbox an image of its own (take).
   */
  async adopt(id: string, file: string, diskMB: number): Promise<boolean> {
    const st = await fsp.stat(file).catch(() => null);
    if (st?.size !== Math.max(diskMB, MIN_DISK_MB) * 1024 * 1024) {
      await fsp.rm(file, { force: true });
      return false;
    }
    await fsp.rename(file, this.fileOf(id));
    return true;
  }

  /** Makes `file` (a spare's image, mounted by its helper) sandbox `id`'s image. */
  claim(id: string, file: string): void {
    renameNow(file, this.fileOf(id));
  }

  /** Makes `file`: a copy of the template of `diskMB` (made on first use), or, without one, mkfs.ext4's own. */
  async make(file: string, diskMB: number): Promise<void> {
    const size = Math.max(diskMB, MIN_DISK_MB);
    let template = this.templates.get(size);
    if (!template) {
      // Bounded: past 8 sizes the oldest template goes (each holds ~160 KiB).
      if (this.templates.size >= 8) this.templates.delete(this.templates.keys().next().value!);
      template = makeDiskTemplate(this.dir, size, this.mkfs).catch((err: Error) => {
        this.log.warn({ err: err.message, diskMB: size }, 'no template disk image: each image is made by mkfs.ext4');
        return null;
      });
      this.templates.set(size, template);
    }
    const t = await template;
    if (t) await writeFromTemplate(file, t);
    else await makeDiskImage(file, size, this.mkfs);
  }

  /** Removes sandbox `id`'s image (its blocks go back to the host's storage). */
  async remove(id: string): Promise<void> {
    await fsp.rm(this.fileOf(id), { force: true });
  }

  /** Stops making spares and removes those made. */
  async close(): Promise<void> {
    this.closed = true;
    await this.inFlight;
    const spares = this.spares.splice(0);
    await Promise.all(spares.map((f) => fsp.rm(f, { force: true })));
  }

  /** Makes spares, one at a time in the background, until `spareCount` are ready. */
  private refill(): void {
    if (this.closed || this.making > 0 || this.spares.length >= this.spareCount) return;
    this.making++;
    const file = path.join(this.dir, `pool-${process.pid}-${this.seq++}.img`);
    const size = this.spareMB;
    this.inFlight = this.make(file, size)
      .then(
        async () => {
          this.making--;
          if (this.closed || size !== this.spareMB) return fsp.rm(file, { force: true });
          this.spares.push(file);
          this.refill();
        },
        (err) => {
          // Not retried here: the next create tries again.
          this.making--;
          this.log.warn({ err }, 'could not make a spare disk image');
        },
      )
      .catch((err) => this.log.warn({ err }, 'could not remove a disk image'));
  }
}

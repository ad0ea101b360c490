/**
 * A disk that is disk (issue 30, item 1): a sandbox's writable layer is an ext4 image of diskMB on the
 * host's storage, not a tmpfs charged to its memory. Writing past diskMB gets ENOSPC (not an OOM kill),
 * the page cache is reclaimable (a 512 MB sandbox writes gigabytes), `df /` inside shows diskMB, the
 * image is root's alone and goes with the sandbox, and nothing of it is reachable from inside.
 */
import { promises as fsp } from 'node:fs';
import * as path from 'node:path';
import { loadLimits } from '../../../config/limits';
import { api, T } from '../../helpers/env';
import { runSdk } from '../../helpers/sdk';
import { bashAgent, runSession } from '../../helpers/sessions';

jest.setTimeout(900_000);

const limits = loadLimits(process.env);

/** Runs `script` with sh in the sandbox (timeout in seconds). */
async function sh(id: string, script: string, timeout = 60): Promise<{ exitCode: number; stdout: string; stderr: string; oomKilled?: boolean }> {
  const r = await api('POST', `/api/sandboxes/${id}/exec/run`, { body: { cmd: 'sh', args: ['-c', script], timeout } });
  expect(r.status).toBe(200);
  return r.body;
}

/** The host's image of sandbox `id` (DATA_DIR/disks/<id>.img of the stack's host), or null. */
async function imageOf(id: string): Promise<string | null> {
  const found: string[] = [];
  const walk = async (dir: string, depth: number): Promise<void> => {
    for (const e of await fsp.readdir(dir, { withFileTypes: true }).catch(() => [])) {
      const p = path.join(dir, e.name);
      if (e.isDirectory() && e.name === 'disks') {
        if (
          await fsp.stat(path.join(p, `${id}.img`)).then(
            () => true,
            () => false,
          )
        )
          found.push(path.join(p, `${id}.img`));
      } else if (e.isDirectory() && depth > 0 && !['sandboxes', 'layers', 'node_modules'].includes(e.name)) await walk(p, depth - 1);
    }
  };
  await walk(T.dataDir(), 3);
  return found[0] ?? null;
}

/** `df -m /` inside: the size and available MB of the root. */
async function df(id: string): Promise<{ size: number; avail: number }> {
  const r = await sh(id, 'df -m / | tail -1');
  expect(r.exitCode).toBe(0);
  const cols = r.stdout.trim().split(/\s+/);
  return { size: Number(cols[1]), avail: Number(cols[3]) };
}

const created: string[] = [];
afterAll(async () => {
  for (const id of created) await api('DELETE', `/api/sandboxes/${id}`).catch(() => undefined);
});

async function create(body: Record<string, unknown>): Promise<string> {
  const r = await api('POST', '/api/sandboxes', { body });
  expect(r.status).toBe(201);
  created.push(r.body.sandboxID);
  return r.body.sandboxID;
}

describe('a disk that is disk', () => {
  it("defaults diskMB to 20480 (OpenComputer's): df / inside shows it, and the sparse image costs next to nothing on the host", async () => {
    expect(limits.diskMB).toBe(Number(process.env.SANDBOX_DISK_MB ?? 20480));
    const id = await create({});
    expect((await api('GET', `/api/sandboxes/${id}`)).body.diskMB).toBe(limits.diskMB);
    const { size } = await df(id);
    expect(size).toBeGreaterThan(limits.diskMB * 0.97);
    expect(size).toBeLessThanOrEqual(limits.diskMB);
    const image = await imageOf(id);
    expect(image).not.toBeNull();
    const st = await fsp.stat(image!);
    // Root's alone, the full size in length, a few hundred KB in blocks.
    expect(st.uid).toBe(0);
    expect(st.mode & 0o777).toBe(0o600);
    expect(st.size).toBe(limits.diskMB * 1024 * 1024);
    expect(st.blocks * 512).toBeLessThan(16 * 1024 * 1024);
    expect((await api('DELETE', `/api/sandboxes/${id}`)).status).toBe(200);
    expect(await imageOf(id)).toBeNull();
  });

  it("mounts /workspace on its own, on the sandbox's disk: df /workspace names it, nosuid and nodev, and what is written there counts against diskMB", async () => {
    const id = await create({ diskMB: 512 });
    const r = await sh(
      id,
      [
        'df -P -m /workspace | tail -1',
        'grep " /workspace " /proc/self/mountinfo',
        'dd if=/dev/zero of=/workspace/w bs=1M count=600 2>&1 | grep -c "No space left on device"; rm /workspace/w',
        // Moved to and from the rest of the disk (another mount of the same filesystem: mv copies).
        'echo moved > /workspace/m && mv /workspace/m /tmp/m && mv /tmp/m /workspace/back && cat /workspace/back',
      ].join('; '),
      300,
    );
    const [dfLine, mountLine, ...rest] = r.stdout.trim().split('\n');
    const cols = dfLine!.trim().split(/\s+/);
    expect(cols[5]).toBe('/workspace');
    expect(cols[0]).not.toBe('/dev/root');
    expect(Number(cols[1])).toBeGreaterThan(512 * 0.9);
    expect(Number(cols[1])).toBeLessThanOrEqual(512);
    expect(mountLine).toMatch(/ \/workspace \/workspace \S*nosuid\S* /);
    expect(mountLine).toMatch(/ \/workspace \/workspace \S*nodev\S* /);
    expect(mountLine).toMatch(/ - overlay /);
    expect(rest).toEqual(['1', 'moved']);
    // As OpenComputer's example (test-environment.ts) checks it, through its client, as the sandbox user.
    const sdk = await runSdk(`
      const sb = await sdk.Sandbox.create(opts);
      try {
        out({ df: (await sb.commands.run('df -h /workspace | tail -1')).stdout.trim(), home: (await sb.commands.run('echo $HOME')).stdout.trim() });
      } finally {
        await sb.kill();
      }
    `);
    expect(sdk.df.startsWith('/dev/root')).toBe(false);
    expect(sdk.df).toContain('/workspace');
    expect(sdk.df).toMatch(/ 20G /);
    expect(sdk.home).toBe('/home/sandbox');
  });

  it('memoryMB 512 + diskMB 4096: 1 GiB is written, 3 GiB more fails only at the quota with ENOSPC (no OOM), then 3 GiB fits', async () => {
    const id = await create({ memoryMB: 512, diskMB: 4096 });
    const { size, avail } = await df(id);
    expect(size).toBeGreaterThan(4096 * 0.97);
    expect(size).toBeLessThanOrEqual(4096);
    const one = await sh(id, 'dd if=/dev/zero of=/workspace/one bs=1M count=1024 2>&1 && sync && stat -c %s /workspace/one', 600);
    expect(one.oomKilled).toBeUndefined();
    expect(one.exitCode).toBe(0);
    expect(one.stdout.trim().split('\n').pop()).toBe(String(1024 * 1024 * 1024));
    const three = await sh(id, 'dd if=/dev/zero of=/workspace/three bs=1M count=3072 2>&1; echo "exit $?"; stat -c %s /workspace/three', 600);
    expect(three.oomKilled).toBeUndefined();
    expect(three.stdout).toContain('No space left on device');
    expect(three.stdout).toMatch(/exit 1\n/);
    // It stopped at the quota: everything that was free was written.
    const written = Number(three.stdout.trim().split('\n').pop()) / (1024 * 1024);
    expect(written).toBeGreaterThan(avail - 1024 - 64);
    expect(written).toBeLessThan(avail - 1024 + 64);
    // The page cache was reclaimed, not charged until an OOM: a 512 MB sandbox writes a 3 GiB file.
    const again = await sh(
      id,
      'rm -f /workspace/one /workspace/three && dd if=/dev/zero of=/workspace/three bs=1M count=3072 2>&1 && stat -c %s /workspace/three',
      600,
    );
    expect(again.oomKilled).toBeUndefined();
    expect(again.exitCode).toBe(0);
    expect(again.stdout.trim().split('\n').pop()).toBe(String(3072 * 1024 * 1024));
    // The sandbox still works.
    expect((await sh(id, 'echo alive')).stdout).toBe('alive\n');
  });

  it("a session's sandbox has its disk on DATA_DIR too, not in memory: 256 MB of memory write 768 MiB, df / shows diskMB", async () => {
    const agentId = await bashAgent(
      'dd if=/dev/zero of=/workspace/big bs=1M count=768 2>/dev/null && size=$(stat -c %s /workspace/big) && df=$(df -m / | tail -1 | tr -s " " | cut -d" " -f2) && echo "{\\"size\\":$size,\\"df\\":$df}" > /tmp/agent_result.json',
      { memoryMB: 256, diskMB: 2048 },
    );
    const { session, result } = await runSession(agentId);
    expect(session.status).toBe('completed');
    expect(result).toMatchObject({ exit_code: 0, data: { size: 768 * 1024 * 1024 } });
    expect(result.data.df).toBeGreaterThan(2048 * 0.97);
    expect(result.data.df).toBeLessThanOrEqual(2048);
    await api('DELETE', `/v1/agents/${agentId}`);
  });

  it('keeps the image and loop device out of reach: no loop device, no host path, no device nodes on the disk', async () => {
    const id = await create({ diskMB: 256 });
    const image = await imageOf(id);
    expect(image).not.toBeNull();
    const r = await sh(
      id,
      [
        'ls /dev | grep -c loop || true',
        'cat /proc/self/mountinfo',
        // A block device node made on the disk (if mknod is allowed at all) cannot be opened: nodev.
        '(mknod /workspace/blk b 7 0 2>/dev/null && head -c1 /workspace/blk >/dev/null 2>&1 && echo OPENED) || echo refused',
        // Set-id bits do nothing on the disk: nosuid.
        'grep -E " / | /usr " /proc/self/mountinfo | grep -c nosuid',
      ].join('; '),
    );
    expect(r.exitCode).toBe(0);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toBe('0');
    expect(r.stdout).not.toContain(path.dirname(image!));
    expect(r.stdout).not.toContain('.img');
    expect(r.stdout).not.toMatch(/\/dev\/loop/);
    expect(r.stdout).toContain('refused');
    expect(r.stdout).not.toContain('OPENED');
    // Filling the small disk does not touch the host beyond its size.
    const fill = await sh(id, 'dd if=/dev/zero of=/workspace/fill bs=1M count=1024 2>&1; echo "exit $?"', 300);
    expect(fill.stdout).toContain('No space left on device');
    const st = await fsp.stat(image!);
    expect(st.blocks * 512).toBeLessThanOrEqual(256 * 1024 * 1024);
    // Deleting the file gives its blocks back to the host (the disk is mounted with discard).
    await sh(id, 'rm -f /workspace/fill && sync');
    expect((await fsp.stat(image!)).blocks * 512).toBeLessThan(64 * 1024 * 1024);
    expect((await api('DELETE', `/api/sandboxes/${id}`)).status).toBe(200);
    expect(await imageOf(id)).toBeNull();
  });
});

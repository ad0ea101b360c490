/**
 * Writes what the host puts into a sandbox's files so that it counts against that sandbox.
 *
 * A sandbox's writable layer is a tmpfs (RAM), and the kernel charges a tmpfs page to the memory
 * cgroup of the process that first writes it. Written by the host itself, a 384 MiB upload into a
 * sandbox of `memoryMB: 64` would sit in RAM charged to the host. So the bytes are written by a
 * short-lived helper (`cat`, reading a pipe from the host, writing to the file's descriptor, which the
 * host opened and checked through ./paths) that has joined the sandbox's cgroups before the host
 * sends it the first byte: every page of the file is charged to the sandbox's memory.
 *
 * Before the sandbox's memory is full, the upload is refused: every MiB, the room left in the
 * sandbox's memory group (its limit less what it cannot reclaim: usage less its file cache) is read,
 * and when what comes next would not fit with a margin (CHECK_EVERY + IN_FLIGHT), the write stops
 * there (payload_too_large, 413). Should the kernel get there first (a race with the sandbox's own
 * allocations), it reclaims the sandbox's page cache and then OOM-kills a process of the group: the
 * helper asks to be that one (oom_score_adj 1000), so the upload fails the same way and the sandbox's
 * own processes live on. Either way the partial file is truncated to nothing, giving its memory back. A full disk (ENOSPC, the tmpfs's diskMB) ends
 * the same way. The host's own memory stays a few pipe buffers whatever the size.
 */
import { spawn } from 'node:child_process';
import { promises as fsp, readFileSync } from 'node:fs';
import * as path from 'node:path';
import type { FileHandle } from 'node:fs/promises';
import type { Readable } from 'node:stream';
import { SandboxError } from '../contract/errors';
import { shownPath, type RootMap } from './paths';

/** The helper: reads stdin, writes stdout (the file), says strerror on stderr when a write fails. */
const CAT = '/bin/cat';
/** How often (bytes received) the room left in the sandbox's memory is read. */
const CHECK_EVERY = 1024 * 1024;
/** Bytes received but maybe not yet written (pipe, the helper's buffer) and the kernel's per-CPU charge batches. */
const IN_FLIGHT = 2 * 1024 * 1024;

/** Bytes the sandbox's memory group can still take (its limit less what it cannot reclaim), or null when not known. */
export function memoryRoom(memoryDir: string): number | null {
  try {
    const limit = Number(readFileSync(path.join(memoryDir, 'memory.limit_in_bytes'), 'latin1'));
    const usage = Number(readFileSync(path.join(memoryDir, 'memory.usage_in_bytes'), 'latin1'));
    const stat = readFileSync(path.join(memoryDir, 'memory.stat'), 'latin1');
    const field = (name: string) => Number(new RegExp(`^${name} (\\d+)$`, 'm').exec(stat)?.[1] ?? 0);
    const reclaimable = field('total_active_file') + field('total_inactive_file');
    if (!Number.isFinite(limit) || !Number.isFinite(usage)) return null;
    return limit - Math.max(0, usage - reclaimable);
  } catch {
    return null;
  }
}

/** What cat's stderr says for a failed write, as the error of the upload. */
function writeFailure(stderr: string, sandboxPath: string): SandboxError {
  const p = shownPath(sandboxPath);
  if (/No space left|Disk quota/i.test(stderr)) return new SandboxError('payload_too_large', `the sandbox's disk is full (its diskMB limit): ${p}`);
  if (/Cannot allocate memory/i.test(stderr)) return new SandboxError('payload_too_large', `the sandbox's memory is full (its memoryMB limit): ${p}`);
  if (/File too large/i.test(stderr)) return new SandboxError('payload_too_large', `file too large: ${p}`);
  return new SandboxError('conflict', `the sandbox refused the write: ${p}`);
}

/**
 * Streams `source` into the open file `fh` through a helper in the sandbox's cgroups (`charge`).
 * Resolves with the number of bytes written. On failure the file is truncated to nothing and the
 * error is a SandboxError: payload_too_large when the sandbox's memory or disk is full,
 * invalid_request when the source failed before its end, conflict otherwise. The source is unpiped,
 * never destroyed (the caller may still answer on its connection, then drain it).
 */
export async function writeCharged(source: Readable, fh: FileHandle, charge: NonNullable<RootMap['charge']>, sandboxPath: string): Promise<number> {
  // Nothing of the host's environment (its token); LC_ALL=C: strerror in words writeFailure knows.
  const child = spawn(CAT, [], { stdio: ['pipe', fh.fd, 'pipe'], env: { PATH: '/usr/bin:/bin', LC_ALL: 'C' } });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; error?: Error }>((resolve) => {
    child.on('error', (error) => resolve({ code: null, signal: null, error }));
    child.on('close', (code, signal) => resolve({ code, signal }));
  });
  let stderr = '';
  child.stderr!.on('data', (b: Buffer) => {
    if (stderr.length < 4096) stderr += b.toString('utf8');
  });
  const stdin = child.stdin!;
  stdin.on('error', () => undefined); // EPIPE when the helper dies: told by its exit
  const kill = () => {
    try {
      child.kill('SIGKILL');
    } catch {
      /* gone */
    }
  };
  let size = 0;
  let failure: SandboxError | null = null;
  try {
    await new Promise<void>((resolve, reject) => {
      child.once('spawn', resolve);
      child.once('error', reject);
    });
    const oomBefore = charge.oomKills();
    // Before the first byte: the helper is the one the sandbox's OOM killer picks, and it is in the
    // sandbox's groups (memory above all; a controller this machine lacks is skipped).
    await fsp.writeFile(`/proc/${child.pid}/oom_score_adj`, '1000');
    for (const f of charge.procsFiles) {
      await fsp.writeFile(f, String(child.pid)).catch((err: NodeJS.ErrnoException) => {
        if (err.code === 'ENOENT') return;
        throw new SandboxError('conflict', `the sandbox is not running (its cgroups are gone): ${shownPath(sandboxPath)}`);
      });
    }
    // Which comes first: the source's end, its failure (the client went away), or the helper's exit.
    let checkedAt = 0;
    const first = await new Promise<'end' | 'failed' | 'exited' | 'full'>((resolve) => {
      const onData = (b: Buffer) => {
        size += b.length;
        if (!charge.memoryDir || size - checkedAt < CHECK_EVERY) return;
        checkedAt = size;
        const room = memoryRoom(charge.memoryDir);
        if (room !== null && room < CHECK_EVERY + IN_FLIGHT) finish('full');
      };
      const finish = (what: 'end' | 'failed' | 'exited' | 'full') => {
        source.off('data', onData);
        source.off('end', onEnd);
        source.off('error', onFail);
        source.off('close', onClose);
        resolve(what);
      };
      const onEnd = () => finish('end');
      const onFail = () => finish('failed');
      // A request whose client went away closes without 'end'.
      const onClose = () => finish(source.readableEnded ? 'end' : 'failed');
      source.on('data', onData);
      source.once('end', onEnd);
      source.once('error', onFail);
      source.once('close', onClose);
      void exited.then(() => finish('exited'));
      source.pipe(stdin, { end: true });
    });
    if (first !== 'end') {
      source.unpipe(stdin);
      stdin.destroy();
    }
    if (first === 'failed' || first === 'full') {
      kill();
      await exited;
      failure =
        first === 'full'
          ? new SandboxError('payload_too_large', `the sandbox's memory is full (its memoryMB limit): ${shownPath(sandboxPath)}`)
          : new SandboxError('invalid_request', 'upload interrupted');
    } else {
      const ex = await exited;
      if (ex.error) failure = new SandboxError('internal', `could not start the writer of ${shownPath(sandboxPath)}`);
      else if (ex.signal) {
        failure =
          charge.oomKills() > oomBefore
            ? new SandboxError('payload_too_large', `the sandbox's memory is full (its memoryMB limit): ${shownPath(sandboxPath)}`)
            : new SandboxError('conflict', `the write was stopped (the sandbox stopped?): ${shownPath(sandboxPath)}`);
      } else if (ex.code !== 0) failure = writeFailure(stderr, sandboxPath);
      else if (first !== 'end') failure = new SandboxError('conflict', `the write was stopped: ${shownPath(sandboxPath)}`);
    }
  } catch (err) {
    kill();
    await exited;
    failure = err instanceof SandboxError ? err : new SandboxError('internal', `could not write ${shownPath(sandboxPath)}`);
  }
  if (failure) {
    // What was written of a failed upload would hold the sandbox's memory (a tmpfs): give it back.
    await fh.truncate(0).catch(() => undefined);
    throw failure;
  }
  return size;
}

/**
 * The entrypoint's lifecycle: its start (a run ticket the helper claims, so that a host that dies
 * mid-start never starts it twice), adoption of a start the previous host left unfinished, its exit
 * (the wrapper's exit file), waits on it and its output. The base provider delegates to one Entrypoints.
 */
import { randomBytes } from 'node:crypto';
import { promises as fsp, watch, openSync, closeSync, readSync, fstatSync, type FSWatcher } from 'node:fs';
import * as path from 'node:path';
import type { Logger } from 'pino';
import type { AuditLog } from '../audit-log';
import type { EntrypointLog, EntrypointLogChunk, SpawnOptions } from '../driver';
import { SandboxError } from '../../contract/errors';
import type { EntrypointSpec, EntrypointStatus } from '../host-contract/types';
import { isAlive, procRef, SandboxCgroups, signalRef, type ProcRef } from '../proc-refs-and-cgroups';
import type { Spawner } from '../spawner';
import { cgroupJoin, DEFAULT_ENV, KILL_AFTER_SECONDS, processNaming, shq, signalName, sleep, writeDurably } from './common';
import type { SandboxState } from './state-file';
import { runFiles, settleInterruptedRun } from './run-files';

/**
 * How a provider's one-exec entry helper (see BaseProvider.enterArgv) starts a process: the cgroups it
 * joins, and for entrypoints its own process group, a timeout and the file its exit code goes to.
 */
export interface EnterOptions {
  cgroupProcs: string[];
  /** The process leads a process group of its own (signals and the timeout reach its children). */
  ownGroup?: boolean;
  /** SIGTERM after this many seconds, SIGKILL killAfterSeconds later; the status is then 124 or 137. */
  timeoutSeconds?: number;
  killAfterSeconds?: number;
  /** Where the exit code ("<code>\n", one write) goes when the process ends. */
  exitFile?: string;
  /** Relay stdout and stderr through the helper, which records the order of their chunks here (see entrypointLog). */
  logIndex?: string;
  /**
   * The pid of the process's parent (this host, or the spawner helper that exits with it): the
   * process is hung up (SIGHUP to its group) when that parent dies. For processes that only this
   * host process can serve (exec sessions, terminals, patches), never for entrypoints.
   */
  hangUpWithCaller?: number;
  /** Run on a pseudo-terminal of the sandbox of this size (the helper's -T; fd 3 takes window sizes). */
  pty?: { rows: number; cols: number };
  /**
   * Claim this run first (the helper's -R): rename `<runFile>.pending` to `runFile`, or start nothing
   * when the pending file is gone (see runFiles and settleInterruptedRun).
   */
  runFile?: string;
}

/** How long a host waits for an entrypoint's helper to claim its start before cancelling it (SANDBOX_ENTRYPOINT_CLAIM_TIMEOUT_MS). */
export const DEFAULT_ENTRYPOINT_CLAIM_TIMEOUT_MS = 30_000;

/** How often a wait for an entrypoint's exit looks again without an inotify event: rarely when its directory is watched. */
const WATCHED_POLL_MS = 250;
const UNWATCHED_POLL_MS = 20;

/** What Entrypoints needs of its provider. */
export interface EntrypointDeps {
  log: Logger;
  audit: AuditLog | null;
  spawner: Spawner;
  /** See DEFAULT_ENTRYPOINT_CLAIM_TIMEOUT_MS. */
  claimTimeoutMs: number;
  /** Tests only (SANDBOX_TEST_PAUSE_FILE; unset: off): see testPause. */
  testPauseFile: string | null;
  dirOf(id: string): string;
  stateOf(id: string): SandboxState;
  /** Whether the sandbox is (still) known to the host. */
  has(id: string): boolean;
  saveState(state: SandboxState): Promise<void>;
  isLive(state: SandboxState): boolean;
  enterArgv(state: SandboxState, opts: SpawnOptions, how: EnterOptions): string[] | null;
  enterEnv(state: SandboxState, opts: SpawnOptions): Record<string, string>;
  innerArgv(state: SandboxState, opts: SpawnOptions): string[];
}

/** The entrypoints of a provider's sandboxes; see the module comment. */
export class Entrypoints {
  constructor(private readonly deps: EntrypointDeps) {}

  async startEntrypointUnlocked(state: SandboxState, spec: EntrypointSpec): Promise<void> {
    if (state.entrypoint) throw new SandboxError('conflict', `sandbox ${state.id} already has an entrypoint`);
    if (state.status !== 'running' || !this.deps.isLive(state)) {
      throw new SandboxError('conflict', `sandbox ${state.id} is not running`);
    }
    if (!spec.argv.length || spec.argv[0].includes('=')) {
      throw new SandboxError('invalid_request', 'entrypoint argv must be non-empty and argv[0] must not contain "="');
    }
    const dir = this.deps.dirOf(state.id);
    const exitFile = path.join(dir, 'entrypoint.exit');
    const cgroupProcs = SandboxCgroups.of(state.id).procsFiles();
    const run = randomBytes(8).toString('hex');
    const files = runFiles(dir, run);
    // Runs outside the sandbox, detached, so the exit code is written even when the host is gone:
    // by the entry helper, or by a shell wrapper around innerArgv (+ GNU timeout).
    const entered: SpawnOptions = { argv: spec.argv, env: spec.env, cwd: spec.cwd };
    let wrapperArgv = this.deps.enterArgv(state, entered, {
      cgroupProcs,
      ownGroup: true,
      exitFile,
      logIndex: path.join(dir, 'entrypoint.idx'),
      runFile: files.claimed,
      ...(spec.timeoutSeconds ? { timeoutSeconds: spec.timeoutSeconds, killAfterSeconds: KILL_AFTER_SECONDS } : {}),
    });
    let wrapperEnv = this.deps.enterEnv(state, entered);
    if (!wrapperArgv) {
      wrapperEnv = { PATH: DEFAULT_ENV.PATH };
      const argv = spec.timeoutSeconds
        ? ['timeout', '--signal=TERM', `--kill-after=${KILL_AFTER_SECONDS}`, String(spec.timeoutSeconds), ...spec.argv]
        : spec.argv;
      const inner = this.deps.innerArgv(state, { argv, env: spec.env, cwd: spec.cwd });
      const script =
        // The claim first (see EnterOptions.runFile): nothing starts once the pending file is gone.
        `mv -T -- ${shq(files.pending)} ${shq(files.claimed)} 2>/dev/null || exit 125; ` +
        `${cgroupJoin(cgroupProcs)} "$@"; code=$?; ` +
        // One short write, with shell builtins only; the file's modification time is the exit time.
        `printf '%s\\n' "$code" > ${shq(exitFile)}`;
      wrapperArgv = ['/bin/sh', '-c', script, 'sh', ...inner];
    }
    // Saved before the start (on disk only: until the helper runs, the entrypoint is not there to
    // report on): after a crash, the next host knows that a start may have happened, and which run.
    const starting = {
      wrapper: { pid: 0, start: -1 },
      startedAt: new Date().toISOString(),
      ...(spec.timeoutSeconds ? { timeoutSeconds: spec.timeoutSeconds } : {}),
      starting: true,
      run,
    };
    await this.deps.saveState({ ...state, entrypoint: starting });
    // The run's ticket: its helper claims it by renaming it (the durable mark that the run began), a
    // restarted host cancels it by renaming it away; whichever comes first wins (settleInterruptedRun).
    await writeDurably(files.pending, '');
    await this.testPause('before-spawn', state, spec);
    let pid: number;
    try {
      pid = await this.deps.spawner.spawn({
        argv: wrapperArgv,
        env: wrapperEnv,
        stdout: path.join(dir, 'entrypoint.out'),
        stderr: path.join(dir, 'entrypoint.err'),
      });
    } catch (e) {
      this.deps.log.error({ err: e, sandboxId: state.id }, 'entrypoint wrapper failed');
      // Whatever the spawner did, this run can no longer start, unless it was claimed already.
      const settled = await settleInterruptedRun(dir, run).catch(() => null);
      if (settled?.outcome !== 'started') {
        await this.deps.saveState(state);
        throw new SandboxError('internal', `could not start the entrypoint of ${state.id}: ${(e as Error).message}`);
      }
      pid = settled.pid ?? 0;
    }
    const wrapper = procRef(pid) ?? { pid, start: -1 };
    if (!(await this.awaitClaim(dir, run, wrapper))) {
      await this.deps.saveState(state);
      throw new SandboxError(
        'internal',
        `the entrypoint helper of ${state.id} exited (or did not answer within ${this.deps.claimTimeoutMs} ms) before starting it; nothing was started`,
      );
    }
    await this.testPause('after-claim', state, spec);
    // The run began (its claim is on disk): the audit line records that, never an intent.
    try {
      await this.recordStart(state, run, false);
    } catch (e) {
      // The run is under way and cannot be undone; its claim stays on disk as its record.
      this.deps.log.error({ err: e, sandboxId: state.id, run }, 'entrypoint audit log write failed');
    }
    state.entrypoint = {
      wrapper,
      startedAt: starting.startedAt,
      ...(spec.timeoutSeconds ? { timeoutSeconds: spec.timeoutSeconds } : {}),
      run,
    };
    this.deps.log.info({ sandboxId: state.id, pid: wrapper.pid, run }, 'entrypoint started');
  }

  /** Appends a run's `entrypoint_start` line to the audit log (durable when it resolves). */
  private async recordStart(state: SandboxState, run: string, recovered: boolean): Promise<void> {
    await this.deps.audit?.record({
      at: new Date().toISOString(),
      event: 'entrypoint_start',
      sandboxId: state.id,
      orgId: state.orgId,
      hostId: state.hostId,
      ...(state.owner ? { owner: state.owner } : {}),
      run,
      ...(recovered ? { recovered } : {}),
    });
  }

  /**
   * Waits until the run's helper has claimed it (true), or has exited or taken longer than the claim
   * timeout without (the run is then cancelled for good: false; a claim that wins that race is true).
   */
  private async awaitClaim(dir: string, run: string, wrapper: ProcRef): Promise<boolean> {
    const files = runFiles(dir, run);
    const claimed = () =>
      fsp.access(files.claimed).then(
        () => true,
        () => false,
      );
    const deadline = Date.now() + this.deps.claimTimeoutMs;
    for (let waitMs = 1; ; waitMs = Math.min(waitMs * 2, 50)) {
      if (await claimed()) return true;
      if (!isAlive(wrapper) || Date.now() >= deadline) {
        const settled = await settleInterruptedRun(dir, run);
        if (settled.outcome === 'started') return true;
        signalRef(wrapper, 'SIGKILL');
        return false;
      }
      await sleep(waitMs);
    }
  }

  /**
   * Tests only, off unless SANDBOX_TEST_PAUSE_FILE is set: when that file reads `<point> <marker>`
   * and the entrypoint's argv contains the marker, the start stops at `point` (renaming the file to
   * `<file>.reached`, so it stops once) until `<file>.reached` is removed or a minute has passed:
   * a test kills the host there.
   */
  private async testPause(point: 'before-spawn' | 'after-claim', state: SandboxState, spec: EntrypointSpec): Promise<void> {
    const file = this.deps.testPauseFile;
    if (!file) return;
    const [at, marker] = (await fsp.readFile(file, 'utf8').catch(() => '')).trim().split(/\s+/);
    if (at !== point || !marker || !spec.argv.some((a) => a.includes(marker))) return;
    const reached = `${file}.reached`;
    if (
      !(await fsp.rename(file, reached).then(
        () => true,
        () => false,
      ))
    )
      return;
    this.deps.log.warn({ sandboxId: state.id, point }, 'test pause: the entrypoint start stops here');
    const until = Date.now() + 60_000;
    while (
      Date.now() < until &&
      (await fsp.access(reached).then(
        () => true,
        () => false,
      ))
    )
      await sleep(50);
  }

  /**
   * A host that died while starting an entrypoint left `starting` in its state.json: the start may
   * or may not have happened. The run's files decide (settleInterruptedRun): a run its helper
   * claimed is adopted (its helper, if still alive, is the wrapper; its exit file says how it
   * ended) and recorded in the audit log (again, perhaps: lines of one run share its `run`); one
   * not claimed is cancelled for good, and a create of the same sandbox (the caller's retry) starts
   * a new run. Either way the entrypoint runs once.
   */
  async adoptInterruptedStart(state: SandboxState): Promise<void> {
    const run = state.entrypoint!.run;
    if (run) {
      const dir = this.deps.dirOf(state.id);
      const settled = await settleInterruptedRun(dir, run);
      if (settled.outcome === 'started') {
        const claimed = runFiles(dir, run).claimed;
        const own = settled.pid !== null && (await fsp.readFile(`/proc/${settled.pid}/cmdline`, 'utf8').catch(() => '')).split('\0').includes(claimed);
        const { starting: _, ...ep } = state.entrypoint!;
        state.entrypoint = { ...ep, wrapper: (own ? procRef(settled.pid!) : null) ?? { pid: 0, start: -1 } };
        // Its line, unless the previous host wrote it before dying.
        if (this.deps.audit && !(await this.deps.audit.hasRun(run).catch(() => false))) {
          await this.recordStart(state, run, true).catch((err) => this.deps.log.error({ err, sandboxId: state.id }, 'entrypoint audit log write failed'));
        }
        this.deps.log.warn(
          { sandboxId: state.id, run, pid: settled.pid, alive: own },
          'adopted an entrypoint run that its helper claimed before the previous host recorded it',
        );
      } else {
        delete state.entrypoint;
        this.deps.log.warn(
          { sandboxId: state.id, run, outcome: settled.outcome },
          'the previous host died before the entrypoint run was claimed; it is cancelled, and the next create starts a new one',
        );
      }
      await this.deps.saveState(state);
      return;
    }
    // A state of an older host (no run files): its helper or exit file says whether it started.
    const exitFile = path.join(this.deps.dirOf(state.id), 'entrypoint.exit');
    // The helper first: it writes the exit file before it exits, so one of the two is seen.
    const helper = await processNaming(exitFile);
    const exited = await fsp.stat(exitFile).then(
      () => true,
      () => false,
    );
    if (helper !== null || exited) {
      const { starting: _, ...ep } = state.entrypoint!;
      state.entrypoint = { ...ep, wrapper: procRef(helper ?? undefined) ?? { pid: 0, start: -1 } };
      this.deps.log.warn({ sandboxId: state.id, pid: helper }, 'adopted an entrypoint whose start the previous host did not finish recording');
    } else {
      delete state.entrypoint;
      this.deps.log.warn({ sandboxId: state.id }, 'the previous host died before starting the entrypoint; the next create starts it');
    }
    await this.deps.saveState(state);
  }

  /** The entrypoint's exit code and time (the exit file's mtime), or null before it has been written whole. */
  private async readExit(id: string): Promise<{ code: number; at: number } | null> {
    const file = path.join(this.deps.dirOf(id), 'entrypoint.exit');
    // One tiny file in the sandbox's directory (a tmpfs for sessions): read in place, without two
    // trips through the thread pool.
    let fd: number | undefined;
    try {
      fd = openSync(file, 'r');
      const buf = Buffer.alloc(32);
      const n = readSync(fd, buf, 0, buf.length, 0);
      const text = buf.toString('latin1', 0, n);
      if (!/^-?\d+\n/.test(text)) return null;
      return { code: Number(text.trim().split(' ')[0]), at: Math.round(fstatSync(fd).mtimeMs) };
    } catch {
      return null;
    } finally {
      if (fd !== undefined) closeSync(fd);
    }
  }

  async entrypointStatus(id: string): Promise<EntrypointStatus> {
    const state = this.deps.stateOf(id);
    const ep = state.entrypoint;
    if (!ep) return { state: 'none' };
    let exit = await this.readExit(id);
    if (!exit && isAlive(ep.wrapper)) return { state: 'running', pid: ep.wrapper.pid, startedAt: ep.startedAt };
    exit ??= await this.readExit(id);
    if (!exit) {
      // The wrapper died without recording an exit (killed with the sandbox, or the machine rebooted).
      return { state: 'exited', exitCode: -1, timedOut: false, signal: 'SIGKILL', startedAt: ep.startedAt, exitedAt: ep.startedAt };
    }
    const elapsed = exit.at - Date.parse(ep.startedAt);
    const timedOut = !!ep.timeoutSeconds && (exit.code === 124 || (exit.code === 137 && elapsed >= ep.timeoutSeconds * 1000 - 50));
    const sig = exit.code > 128 && exit.code < 160 ? signalName(exit.code - 128) : null;
    // Read while the sandbox's cgroups exist (a session captures its ending before destroying them).
    const oomKilled = SandboxCgroups.of(id).oomKills() > 0;
    return {
      state: 'exited',
      exitCode: exit.code,
      timedOut,
      signal: timedOut ? 'SIGTERM' : sig,
      startedAt: ep.startedAt,
      exitedAt: new Date(exit.at).toISOString(),
      ...(oomKilled ? { oomKilled } : {}),
    };
  }

  /**
   * The entrypoint's status once it has exited or `waitMs` has passed. The wrapper's exit file is
   * watched (inotify), so a wait costs no polling; a slow poll stays as a safety net, and a fast one
   * where the directory cannot be watched.
   */
  async waitEntrypoint(id: string, waitMs: number, signal?: AbortSignal): Promise<EntrypointStatus> {
    const deadline = Date.now() + Math.max(0, waitMs);
    let status = await this.entrypointStatus(id);
    if (status.state !== 'running' || waitMs <= 0) return status;
    let wake: (() => void) | undefined;
    let woken = false;
    let watcher: FSWatcher | undefined;
    try {
      watcher = watch(this.deps.dirOf(id), (_ev, file) => {
        if (file !== 'entrypoint.exit') return;
        woken = true;
        wake?.();
      });
      watcher.on('error', () => undefined);
    } catch {
      watcher = undefined;
    }
    const pollMs = watcher ? WATCHED_POLL_MS : UNWATCHED_POLL_MS;
    const onAbort = () => wake?.();
    signal?.addEventListener('abort', onAbort);
    try {
      // The exit may have been written between the first look and the watch.
      if (watcher) status = await this.entrypointStatus(id);
      while (status.state === 'running' && Date.now() < deadline && !signal?.aborted) {
        if (!woken) {
          await new Promise<void>((r) => {
            const t = setTimeout(r, Math.min(pollMs, Math.max(1, deadline - Date.now())));
            wake = () => {
              clearTimeout(t);
              r();
            };
          });
        }
        woken = false;
        if (!this.deps.has(id)) break;
        status = await this.entrypointStatus(id);
      }
    } finally {
      signal?.removeEventListener('abort', onAbort);
      watcher?.close();
    }
    return status;
  }

  /**
   * The entrypoint's stdout and stderr in the order they were written: the last `maxBytes` of
   * each, as chunks tagged with their stream and time, put back in order from the index the entry
   * helper keeps (`-L`). Bytes of a file that no index record covers (the helper's own messages, or
   * a provider without an index) come where they lie in their file, with no time.
   */
  async entrypointLog(id: string, maxBytes: number, since: { stdout?: number; stderr?: number } = {}): Promise<EntrypointLog> {
    this.deps.stateOf(id);
    const dir = this.deps.dirOf(id);
    /** The last `max` bytes of `file`, or fewer: nothing before `from`. */
    const readTail = async (file: string, max: number, from = 0): Promise<{ size: number; start: number; data: Buffer }> => {
      let fh;
      try {
        fh = await fsp.open(file, 'r');
      } catch {
        return { size: 0, start: 0, data: Buffer.alloc(0) };
      }
      try {
        const { size } = await fh.stat();
        const start = Math.min(size, Math.max(from, size - max));
        const data = Buffer.alloc(size - start);
        const { bytesRead } = await fh.read(data, 0, data.length, start);
        return { size, start, data: data.subarray(0, bytesRead) };
      } finally {
        await fh.close();
      }
    };
    const [out, err] = await Promise.all([
      readTail(path.join(dir, 'entrypoint.out'), maxBytes, since.stdout),
      readTail(path.join(dir, 'entrypoint.err'), maxBytes, since.stderr),
    ]);
    // Enough of the index to cover both tails: records are at least a byte each, so 2 × maxBytes records at most.
    const idx = await readTail(path.join(dir, 'entrypoint.idx'), Math.min(2 * maxBytes, 1 << 22) * 24);
    const skip = (24 - ((idx.start % 24) as number)) % 24;
    const records: { stream: 'stdout' | 'stderr'; len: number; offset: number; at: number }[] = [];
    for (let p = skip; p + 24 <= idx.data.length; p += 24) {
      const s = idx.data[p];
      if (s !== 1 && s !== 2) continue;
      records.push({
        stream: s === 1 ? 'stdout' : 'stderr',
        len: idx.data.readUInt32LE(p + 4),
        offset: Number(idx.data.readBigUInt64LE(p + 8)),
        at: Number(idx.data.readBigUInt64LE(p + 16)),
      });
    }
    const tails = { stdout: out, stderr: err };
    const next = { stdout: out.start, stderr: err.start };
    const chunks: EntrypointLogChunk[] = [];
    const take = (stream: 'stdout' | 'stderr', from: number, to: number, at: number | null) => {
      const t = tails[stream];
      const a = Math.max(from, next[stream]);
      const b = Math.min(to, t.start + t.data.length);
      if (b <= a) return;
      chunks.push({ stream, at, offset: a, data: t.data.subarray(a - t.start, b - t.start) });
      next[stream] = b;
    };
    for (const r of records) {
      // What lies before this chunk in its file and no record covered comes first, untimed.
      if (r.offset > next[r.stream]) take(r.stream, next[r.stream], r.offset, null);
      take(r.stream, r.offset, r.offset + r.len, r.at);
    }
    for (const stream of ['stdout', 'stderr'] as const) take(stream, next[stream], tails[stream].size, null);
    // Truncated: the beginning was cut for size (not merely skipped with `since`).
    return {
      chunks,
      bytes: { stdout: out.size, stderr: err.size },
      truncated: { stdout: out.start > (since.stdout ?? 0), stderr: err.start > (since.stderr ?? 0) },
    };
  }

  async entrypointOutput(id: string, stream: 'stdout' | 'stderr', maxBytes: number): Promise<Buffer> {
    this.deps.stateOf(id);
    const file = path.join(this.deps.dirOf(id), stream === 'stdout' ? 'entrypoint.out' : 'entrypoint.err');
    let fh;
    try {
      fh = await fsp.open(file, 'r');
    } catch {
      return Buffer.alloc(0);
    }
    try {
      const { size } = await fh.stat();
      const len = Math.min(size, maxBytes);
      const buf = Buffer.alloc(len);
      await fh.read(buf, 0, len, size - len);
      return buf;
    } finally {
      await fh.close();
    }
  }
}

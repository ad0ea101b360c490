/**
 * Processes in a running sandbox: started by the provider's one-exec entry helper when it has one
 * (directly, or through the spawner helper without forking the host), else by a shell wrapper that
 * joins the sandbox's cgroups; and the patches of a create, run that way.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import type { ProviderKind, SpawnOptions } from '../driver';
import { SandboxError } from '../../contract/errors';
import type { PatchOutcome } from '../host-contract/types';
import { SandboxCgroups } from '../proc-refs-and-cgroups';
import type { PipedProcess, Spawner } from '../spawner';
import { cgroupJoin, DEFAULT_ENV, PATCH_TAIL_BYTES } from './common';
import type { EnterOptions } from './entrypoint';
import type { SandboxState } from './state-file';

/** What SandboxProcesses needs of its provider. */
export interface ProcessDeps {
  kind(): ProviderKind;
  spawner: Spawner;
  stateOf(id: string): SandboxState;
  isLive(state: SandboxState): boolean;
  enterArgv(state: SandboxState, opts: SpawnOptions, how: EnterOptions): string[] | null;
  enterEnv(state: SandboxState, opts: SpawnOptions): Record<string, string>;
  innerArgv(state: SandboxState, opts: SpawnOptions): string[];
  /** The provider's spawn (a provider may wrap it, e.g. to track what it started). */
  spawn(id: string, opts: SpawnOptions): ChildProcess;
}

/** Starts processes in a provider's sandboxes; see the module comment. */
export class SandboxProcesses {
  constructor(private readonly deps: ProcessDeps) {}

  /** See SandboxProvider.spawn: a process of the sandbox with piped stdio, leading its own group. */
  spawn(id: string, opts: SpawnOptions): ChildProcess {
    const { state, cgroupProcs } = this.spawnable(id, opts);
    // Terminals and patches (and exec commands without the spawner helper) live in this process's memory: if it dies, they are hung up.
    const direct = this.deps.enterArgv(state, opts, { cgroupProcs, hangUpWithCaller: process.pid, ...(opts.pty ? { pty: opts.pty, ownGroup: true } : {}) });
    if (direct) {
      const stdio: 'pipe'[] = opts.pty ? ['pipe', 'pipe', 'pipe', 'pipe'] : ['pipe', 'pipe', 'pipe'];
      return spawn(direct[0]!, direct.slice(1), { stdio, detached: true, env: this.deps.enterEnv(state, opts) });
    }
    if (opts.pty) throw new SandboxError('invalid_request', `terminals need the namespaces provider (this host runs ${this.deps.kind()})`);
    const inner = this.deps.innerArgv(state, opts);
    const script = `${cgroupJoin(cgroupProcs)} exec "$@"`;
    return spawn('/bin/sh', ['-c', script, 'sh', ...inner], {
      stdio: ['pipe', 'pipe', 'pipe'],
      detached: true,
      env: { PATH: DEFAULT_ENV.PATH },
    });
  }

  /**
   * spawn without a terminal, started by the spawner helper when there is one (no fork of this
   * process: see Spawner.exec); the command then hangs up with the helper, which exits with this
   * process.
   */
  async spawnPiped(id: string, opts: SpawnOptions): Promise<PipedProcess> {
    if (opts.pty) return this.deps.spawn(id, opts);
    const helperPid = this.deps.spawner.helperPid();
    if (helperPid !== null) {
      const { state, cgroupProcs } = this.spawnable(id, opts);
      const direct = this.deps.enterArgv(state, opts, { cgroupProcs, hangUpWithCaller: helperPid });
      const child = direct ? await this.deps.spawner.exec(direct, this.deps.enterEnv(state, opts), helperPid) : null;
      if (child) return child;
    }
    return this.deps.spawn(id, opts);
  }

  /** A running sandbox's state and cgroups for a new process, or conflict / invalid_request. */
  spawnable(id: string, opts: SpawnOptions): { state: SandboxState; cgroupProcs: string[] } {
    const state = this.deps.stateOf(id);
    if (state.status !== 'running' || !this.deps.isLive(state)) throw new SandboxError('conflict', `sandbox ${id} is not running`);
    if (!opts.argv.length || opts.argv[0].includes('=')) {
      throw new SandboxError('invalid_request', 'argv must be non-empty and argv[0] must not contain "="');
    }
    return { state, cgroupProcs: SandboxCgroups.of(id).procsFiles() };
  }

  /**
   * Runs one patch; its outcome carries the last PATCH_TAIL_BYTES of its output. One that runs longer
   * than SANDBOX_PATCH_TIMEOUT_S (default 300 s, read at each patch) has its process group killed and
   * exits 124 (as timeout(1) reports).
   */
  runPatch(state: SandboxState, patch: { id: string; script: string }): Promise<PatchOutcome> {
    const limitS = Number(process.env.SANDBOX_PATCH_TIMEOUT_S) > 0 ? Number(process.env.SANDBOX_PATCH_TIMEOUT_S) : 300;
    return new Promise((resolve, reject) => {
      const child = this.deps.spawn(state.id, { argv: ['/bin/bash', '-c', patch.script], user: 'root' });
      let timedOut = false;
      const timer = setTimeout(() => {
        timedOut = true;
        try {
          process.kill(-child.pid!, 'SIGKILL');
        } catch {
          child.kill('SIGKILL');
        }
      }, limitS * 1000);
      let tail = Buffer.alloc(0);
      const add = (b: Buffer) => {
        tail = Buffer.concat([tail, b]);
        if (tail.length > PATCH_TAIL_BYTES * 2) tail = tail.subarray(tail.length - PATCH_TAIL_BYTES);
      };
      child.stdin?.end();
      child.stdout?.on('data', add);
      child.stderr?.on('data', add);
      child.on('error', reject);
      child.on('close', (code, signal) => {
        clearTimeout(timer);
        if (timedOut) add(Buffer.from(`\n[patch killed: it ran longer than ${limitS} s (SANDBOX_PATCH_TIMEOUT_S)]\n`));
        const outputTail = tail.subarray(Math.max(0, tail.length - PATCH_TAIL_BYTES)).toString('utf8');
        resolve({ id: patch.id, exitCode: timedOut ? 124 : (code ?? (signal ? 128 : -1)), outputTail });
      });
    });
  }
}

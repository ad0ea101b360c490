/**
 * The development provider: no isolation at all. A sandbox is a directory `${dataDir}/sandboxes/<id>/root`;
 * absolute paths given to writeFile/readFile and cwd are mapped under it, and processes are plain host
 * processes started there (they still see the whole host, including the real /tmp). Chosen only explicitly.
 */
import type { ChildProcess } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import * as path from 'node:path';
import { BaseProvider, DEFAULT_ENV, envPairs, type SandboxState } from './base';
import { SandboxError } from '../contract/errors';
import { hostPathOf, sandboxPathComponents, type RootMap } from './paths';
import { isAlive, SandboxCgroups } from './proc-refs-and-cgroups';
import type { ProviderOptions, SpawnOptions } from './driver';

/** Unisolated sandboxes for development; see the module comment. */
export class ProcessProvider extends BaseProvider {
  readonly kind = 'process' as const;
  /** Process groups started per sandbox, killed on destroy (cgroups do it too where available). */
  private readonly groups = new Map<string, Set<number>>();

  constructor(opts: ProviderOptions) {
    super(opts);
  }

  protected async prepare(): Promise<void> {
    this.log.warn('SANDBOX_PROVIDER=process: sandboxes are NOT isolated; use only for development');
  }

  private rootOf(id: string): string {
    return path.join(this.dirOf(id), 'root');
  }

  protected rootMap(state: SandboxState): RootMap {
    return { mounts: [{ at: '/', dir: this.rootOf(state.id) }] };
  }

  protected isLive(): boolean {
    return true;
  }

  protected async provision(state: SandboxState): Promise<void> {
    const root = this.rootOf(state.id);
    await Promise.all(['tmp', 'workspace', 'root', 'home', 'etc'].map((d) => fsp.mkdir(path.join(root, d), { recursive: true })));
    SandboxCgroups.create(state.id, state.limits);
  }

  protected innerArgv(state: SandboxState, opts: SpawnOptions): string[] {
    if (!opts.argv.length) throw new SandboxError('invalid_request', 'argv must not be empty');
    const map = this.rootMap(state);
    const cwd = hostPathOf(map, sandboxPathComponents(opts.cwd ?? state.cwd ?? '/workspace'));
    const root = this.rootOf(state.id);
    return [
      '/usr/bin/env',
      '-i',
      '-C',
      cwd,
      '--',
      ...envPairs(DEFAULT_ENV, { HOME: path.join(root, 'root'), TMPDIR: path.join(root, 'tmp'), SANDBOX_ROOT: root, HOSTNAME: state.id }, state.envs, opts.env),
      ...opts.argv,
    ];
  }

  override spawn(id: string, opts: SpawnOptions): ChildProcess {
    const child = super.spawn(id, opts);
    if (child.pid) {
      const set = this.groups.get(id) ?? new Set<number>();
      set.add(child.pid);
      this.groups.set(id, set);
      child.on('exit', () => set.delete(child.pid as number));
    }
    return child;
  }

  protected async teardown(id: string, state: SandboxState | undefined): Promise<void> {
    const pgids = [...(this.groups.get(id) ?? [])];
    if (state?.entrypoint && isAlive(state.entrypoint.wrapper)) pgids.push(state.entrypoint.wrapper.pid);
    for (const pgid of pgids) {
      try {
        process.kill(-pgid, 'SIGKILL');
      } catch {
        /* gone */
      }
    }
    this.groups.delete(id);
    const cgroups = SandboxCgroups.of(id);
    await cgroups.killAll();
    await this.waitGone([state?.entrypoint?.wrapper]);
    await cgroups.remove();
  }
}

/**
 * The sandbox's state on disk: `${dataDir}/sandboxes/<id>/state.json` (what a host knows of a running
 * sandbox) and the respawn records of hibernated sandboxes (`${dataDir}/hibernated/<id>.json`), both
 * mode 0600 with the sandbox's environment sealed (see envSealer).
 */
import type { SealedEntry } from '../seal/proxy';
import { promises as fsp, readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import * as path from 'node:path';
import type { Logger } from 'pino';
import { existsNoFollow, writeSmallAtomically } from '../quick-fs';
import { SecretBox } from '../../lib/secret-box';
import type { ProviderKind } from '../driver';
import type { ProcRef, Limits } from '../proc-refs-and-cgroups';
import type { CreateSandboxRequest, PatchOutcome, SandboxInfo } from '../host-contract/types';

/** What a host keeps about a sandbox, in state.json. */
export interface SandboxState {
  version: 1;
  id: string;
  orgId: string;
  hostId: string;
  provider: ProviderKind;
  owner?: CreateSandboxRequest['owner'];
  /** Read-only layers under the writable one, topmost first, parents expanded. */
  layers: string[];
  envs: Record<string, string>;
  /** Sealed secrets (../seal): placeholder, name, hosts, and the value sealed with the env key; its env holds the placeholders. */
  sealed?: SealedEntry[];
  /** Default working directory of processes (CreateSandboxRequest.cwd). */
  cwd?: string;
  /** Who its processes run as (CreateSandboxRequest.user); absent: root. */
  user?: CreateSandboxRequest['user'];
  limits: Limits;
  createdAt: string;
  metadata: Record<string, string>;
  patches: PatchOutcome[];
  status: 'creating' | 'running' | 'stopped';
  /** Provider-specific processes (e.g. the namespace init). */
  init?: { outer: ProcRef; ns: ProcRef };
  /**
   * namespaces provider: whether the sandbox's overlays are mounted in the host's mount namespace (false: in the
   * sandbox's own, gone with its processes; absent: a sandbox of an older host, so treated as true).
   */
  hostMounts?: boolean;
  /** The network policy asked for at create (absent: the default, `internet`). */
  network?: { egress: 'internet' | 'none' | { allow: string[] } };
  /** namespaces provider: the sandbox's link out (see network.ts); absent: loopback only. */
  link?: { ifname: string; gateway: string; address: string; prefix: number };
  /** namespaces provider: host uid/gid of the sandbox's root; its ids 0..65535 are host ids idBase.. (see id-slots.ts). */
  idBase?: number;
  /**
   * The entrypoint. `starting` is saved before the entrypoint's helper is started and cleared once
   * its pid is saved: a host that dies in between finds out at its next start whether the start
   * happened (see adoptInterruptedStart), so an entrypoint is never started twice. `run` names the
   * start (its run files, see runFiles): the helper's claim of it is the durable mark that it began.
   */
  entrypoint?: { wrapper: ProcRef; startedAt: string; timeoutSeconds?: number; starting?: boolean; run?: string };
}

/** What a hibernated sandbox (or one being restored) is made again from. */
export interface Respawn {
  version: 1;
  kind: 'hibernated' | 'restoring';
  id: string;
  orgId: string;
  owner?: CreateSandboxRequest['owner'];
  /** The layer to stack (its parents follow from its layer.json). */
  layer: string;
  envs: Record<string, string>;
  sealed?: SealedEntry[];
  cwd?: string;
  user?: SandboxState['user'];
  network?: SandboxState['network'];
  limits: Limits;
  metadata: Record<string, string>;
  at: string;
}

/** The host contract's view of a sandbox (`running`: it runs and its processes are there). */
export function infoOf(state: SandboxState, running: boolean): SandboxInfo {
  return {
    id: state.id,
    orgId: state.orgId,
    hostId: state.hostId,
    ...(state.owner ? { owner: state.owner } : {}),
    status: running ? 'running' : 'stopped',
    createdAt: state.createdAt,
    metadata: state.metadata,
    patches: state.patches,
    provider: state.provider,
    ...(state.link ? { network: state.network ?? { egress: 'internet' } } : {}),
  };
}

/** Provider kinds under their old names in state files written by older hosts. */
const OLD_KIND_NAMES: Record<string, ProviderKind> = { bwrap: 'namespaces' };

/** Reads and writes a host's state files; the base provider delegates to one. */
export class StateFile {
  /** Seals sandboxes' environments in the files this host keeps (see envSealer); made on first use. */
  private envBox: SecretBox | null = null;

  constructor(
    private readonly dataDir: string,
    private readonly log: Logger,
    private readonly dirOf: (id: string) => string,
  ) {}

  /**
   * The key that seals sandboxes' environments in state.json and respawn records (they hold agents'
   * env and secret-store values): DATA_DIR/sandbox-env.key, 32 random bytes made at first use, mode 0600.
   * A copy of a sandbox's files (a backup, a bug report) then holds no value.
   */
  envSealer(): SecretBox {
    if (this.envBox) return this.envBox;
    const file = path.join(this.dataDir, 'sandbox-env.key');
    let key: Buffer;
    try {
      key = Buffer.from(readFileSync(file, 'utf8').trim(), 'hex');
    } catch {
      mkdirSync(this.dataDir, { recursive: true });
      try {
        writeFileSync(file, randomBytes(32).toString('hex'), { mode: 0o600, flag: 'wx' });
      } catch {
        /* made by another start at the same moment: read it below */
      }
      key = Buffer.from(readFileSync(file, 'utf8').trim(), 'hex');
    }
    return (this.envBox = new SecretBox(key));
  }

  /** `rec` as written to disk: its envs sealed (context: the sandbox's id). */
  withSealedEnvs<T extends { id: string; envs: Record<string, string> }>(rec: T): T & { sealedEnvs?: string } {
    if (Object.keys(rec.envs).length === 0) return rec;
    return { ...rec, envs: {}, sealedEnvs: this.envSealer().seal(JSON.stringify(rec.envs), `sandbox-env:${rec.id}`) };
  }

  /** `rec` as read from disk, its envs opened (a record written before they were sealed has them plain). */
  withOpenedEnvs<T extends { id: string; envs: Record<string, string>; sealedEnvs?: string }>(rec: T): T {
    const { sealedEnvs, ...rest } = rec;
    if (!sealedEnvs) return rec;
    try {
      return { ...rest, envs: JSON.parse(this.envSealer().open(sealedEnvs, `sandbox-env:${rec.id}`)) as Record<string, string> } as T;
    } catch (err) {
      // The key file was lost or replaced: the sandbox lives on, its new processes without its environment.
      this.log.warn({ sandboxId: rec.id, err: (err as Error).message }, 'sandbox environment does not open; its processes start without it');
      return { ...rest, envs: {} } as T;
    }
  }

  save(state: SandboxState): Promise<void> {
    const file = path.join(this.dirOf(state.id), 'state.json');
    // Mode 0600, and its environment (secret-store values included) sealed. A small file: written at once (see ../quick-fs).
    try {
      writeSmallAtomically(file, JSON.stringify(this.withSealedEnvs(state), null, 1));
      return Promise.resolve();
    } catch (err) {
      return Promise.reject(err as Error);
    }
  }

  /** The state.json of sandbox `id` as it lies on disk (envs still sealed), or undefined. */
  async readPlain(id: string): Promise<SandboxState | undefined> {
    return fsp
      .readFile(path.join(this.dirOf(id), 'state.json'), 'utf8')
      .then((t) => JSON.parse(t) as SandboxState)
      .catch(() => undefined);
  }

  /** The state.json of sandbox `id`, its envs opened; a kind under its old name is given its new one. Throws when unreadable. */
  async read(id: string): Promise<SandboxState> {
    const state = this.withOpenedEnvs(JSON.parse(await fsp.readFile(path.join(this.dirOf(id), 'state.json'), 'utf8')) as SandboxState);
    const renamed = OLD_KIND_NAMES[state.provider];
    return renamed ? { ...state, provider: renamed } : state;
  }

  /** Where the respawn records of hibernated sandboxes (and of restores under way) are kept. */
  respawnDir(): string {
    return path.join(this.dataDir, 'hibernated');
  }

  async readRespawn(id: string): Promise<Respawn | null> {
    try {
      return this.withOpenedEnvs(JSON.parse(await fsp.readFile(path.join(this.respawnDir(), `${id}.json`), 'utf8')) as Respawn);
    } catch {
      return null;
    }
  }

  /** Writes a respawn record durably (mode 0600: it holds the sandbox's environment). */
  async writeRespawn(r: Respawn): Promise<void> {
    const file = path.join(this.respawnDir(), `${r.id}.json`);
    const fh = await fsp.open(`${file}.tmp`, 'w', 0o600);
    try {
      await fh.writeFile(JSON.stringify(this.withSealedEnvs(r)));
      await fh.sync();
    } finally {
      await fh.close();
    }
    await fsp.rename(`${file}.tmp`, file);
  }

  /** True when sandbox `id` has a respawn record (hibernated, or a restore under way). */
  hasRespawn(id: string): boolean {
    return existsNoFollow(path.join(this.respawnDir(), `${id}.json`));
  }

  async dropRespawn(id: string): Promise<void> {
    await fsp.rm(path.join(this.respawnDir(), `${id}.json`), { force: true });
  }
}

/**
 * The default provider: each sandbox is a small Linux machine built from namespaces, overlayfs and
 * cgroups, for untrusted code.
 *
 * On disk, `${dataDir}/sandboxes/<id>/`:
 *   state.json               what the host knows (see SandboxState)
 *   m/                       the staging directory: a mount point in the sandbox's own mount namespace
 *   init.log                 stderr of the sandbox's start
 *   entrypoint.{out,err,exit}
 *
 * Every sandbox starts one way: `sap-sandbox-init` (tools/sandbox-init), started ahead of the create
 * through the spawner in cgroups of its own (a spare from the pool, see InitHelpers.refill; a burst past the pool starts one the
 * same way) and handed the rest of its arguments over `${dataDir}/init.sock`. In a mount namespace
 * of its own it maps a user namespace whose ids 0..65535 are the host ids of the sandbox's slot
 * (`state.idBase`, see idSlots), clones every read-only layer as an idmapped mount (the base skeleton
 * `${dataDir}/base-v3`, the checkpoint layers `${dataDir}/layers/<id>/{root,usr}`, the host's /usr),
 * puts the writable layer on an ext4 image of `diskMB` (`${dataDir}/disks/<id>.img`, see ./disk) and mounts the overlays of `/` and `/usr`; then its
 * child, root of that user namespace, unshares the mount, pid, net, ipc, uts and cgroup namespaces
 * and becomes the sandbox's pid 1: proc with the OCI runtime spec's read-only and masked paths, a
 * private /dev, pivot_root, Docker's default capabilities, no_new_privs, seccomp. None of these mounts
 * is in the host's mount table, and the overlays name their layers by relative names only (l0, p0,
 * w/root…), so nothing the sandbox can read names a host path.
 * The host reaches a sandbox's files through /proc/<pid 1>/root (see rootMap and paths.ts), creating
 * what it writes as sandbox root, and its writable layer through /proc/<helper>/root/…/m/w (checkpoints).
 * Exec sessions' commands are started by pid 1 (./exec-channel), the rest enters through `sap-sandbox-enter`; all are in its cgroups.
 */
import { promises as fsp, constants as fsc } from 'node:fs';
import * as path from 'node:path';
import { PROJECT_ROOT } from '../../config';
import { DEFAULT_DISK_MB } from '../../config/limits';
import { BaseProvider, DEFAULT_ENV, assertId, envPairs, type EnterOptions, type LayerScan, type SandboxState } from '../base';
import type { ResourceProbe } from '../base/resources';
import { SandboxError } from '../../contract/errors';
import type { RootMap } from '../paths';
import { isAlive, procRef, SandboxCgroups, signalRef } from '../proc-refs-and-cgroups';
import { ID_COUNT, IdSlots } from '../id-slots';
import { normaliseEgress, SandboxNetwork, type Egress } from '../network';
import type { ProviderOptions, SpawnOptions } from '../driver';
import { captureLayer, migrateSetIds, restoreSetIds, scanLayer } from './layers';
import { sandboxMountIds, unmountUnder } from './mounts';
import { InitHelpers, type SpareKit, type Starting } from './init-helpers';
import { ExecChannels } from './exec-channel';
import { ensureBaseSkeleton } from './base-skeleton';
import { sealedContext, startSealing, type SealProxy } from '../seal';
import { ownerOf, SANDBOX_HOME, SANDBOX_UID, writeHostsFile } from './sandbox-user';
import { SandboxTeardowns } from './teardowns';
import { handOver, SpareKits } from './spare-kits';
import { DiskImages, diskImagesSupported, diskOvercommitFromEnv, diskRoomProblem, freeMBOf } from './disk';

export { sandboxMountIds };

/** Where scripts/toolchain.sh puts the init helper (tools/sandbox-init). */
const DEFAULT_INIT_HELPER = path.join(PROJECT_ROOT, '.tools', 'bin', 'sap-sandbox-init');
/** Where scripts/toolchain.sh puts the entry helper (tools/sandbox-enter). */
const DEFAULT_ENTER_HELPER = path.join(PROJECT_ROOT, '.tools', 'bin', 'sap-sandbox-enter');

/** Where scripts/toolchain.sh puts the seccomp filter (tools/sandbox-seccomp). */
const DEFAULT_SECCOMP = path.join(PROJECT_ROOT, '.tools', 'lib', 'sap-seccomp.bpf');
/** Where scripts/toolchain.sh installs the Claude Agent SDK, as a layer holding opt/sap/node_modules. */
const DEFAULT_AGENT_SDK_LAYER = path.join(PROJECT_ROOT, '.tools', 'agent-sdk');

/** Version of the base skeleton's contents: a new one is made next to an older one (sandboxes may still use it). */
const BASE_NAME = 'base-v3';

/** Throws unless `file` exists (and is executable when `exec`): the sandboxes cannot be isolated without it. */
async function requireFile(file: string, what: string, exec: boolean): Promise<string> {
  if (
    !(await fsp.access(file, exec ? fsc.X_OK : fsc.R_OK).then(
      () => true,
      () => false,
    ))
  ) {
    throw new Error(`${what} ${file} is missing: run scripts/toolchain.sh (npm start and npm test do)`);
  }
  return file;
}

/** Namespaced sandboxes with a copy-on-write root; see the module comment. */
export class NamespaceProvider extends BaseProvider {
  readonly kind = 'namespaces' as const;
  private readonly initHelper: string;
  private readonly enterHelper: string;
  private readonly seccompFilter: string;
  /** The agent SDK's layer as configured, and as found by prepare() (its real path, or null when absent). */
  private readonly agentSdkSetting: string | null;
  private agentSdkLayer: string | null = null;
  /** The init helpers, their socket and the pool of spares (see ./init-helpers). */
  private readonly helpers: InitHelpers;
  /** Which host id ranges are taken (one slot of 65536 ids per sandbox). */
  private readonly idSlots: IdSlots;
  /** Per sandbox: the mount ids of its `/` and `/usr`, read once per init (key: pid and start time). */
  private readonly mountIds = new Map<string, { key: string; ids: ReadonlySet<number> }>();
  private readonly execChannels = new ExecChannels(this.log); // pid 1 serves exec sessions (./exec-channel)
  /** Sandboxes' links out and their policies (null: SANDBOX_NETWORK=off, loopback only). */
  private readonly network: SandboxNetwork | null;
  /** Sealed secrets' egress proxy (../seal), with the network. */
  private seal: SealProxy | null = null;
  /**
   * DATA_DIR and /usr without symlinks (found by prepare): the init helper opens every layer path
   * refusing a symlink at any component (tools/sandbox-init), so it is handed real paths only.
   */
  private realDataDir: string | null = null;
  private realUsr = '/usr';
  /** Sandboxes' disk images (null: no loop devices or mkfs.ext4 here, or SANDBOX_DISK_IMAGES=off: a tmpfs). */
  private disks: DiskImages | null = null;
  /** SANDBOX_DISK_OVERCOMMIT (see ./disk): checked at each create that gets a disk image. */
  private readonly diskOvercommit: number;
  /** The disks of creates under way (see checkDiskRoom). */
  private creatingDiskMB = 0;
  /** Teardowns behind destroy's answer (see ./teardowns): made by prepare. */
  private teardowns: SandboxTeardowns | null = null;
  /** What spares are made whole with (see ./spare-kits). */
  private readonly kits: SpareKits;

  constructor(opts: ProviderOptions) {
    super(opts);
    this.initHelper = opts.initHelper ?? DEFAULT_INIT_HELPER;
    this.helpers = new InitHelpers({
      dataDir: this.dataDir,
      log: this.log,
      spawner: this.spawner,
      initHelper: this.initHelper,
      waitGone: (refs) => this.waitGone(refs),
      ...(opts.poolSize !== undefined ? { poolSize: opts.poolSize } : {}),
      prepareSpare: (name) => this.kits.prepare(name),
      releaseSpare: (kit) => this.kits.release(kit),
      execServer: this.execChannels.enabled,
    });
    this.enterHelper = opts.enterHelper ?? DEFAULT_ENTER_HELPER;
    this.seccompFilter = opts.seccompFilter ?? DEFAULT_SECCOMP;
    this.agentSdkSetting = opts.agentSdkLayer === undefined ? process.env.SANDBOX_AGENT_SDK_LAYER || DEFAULT_AGENT_SDK_LAYER : opts.agentSdkLayer;
    this.network = opts.network === undefined ? SandboxNetwork.fromEnv(process.env, this.log) : opts.network;
    this.diskOvercommit = diskOvercommitFromEnv(process.env);
    this.idSlots = new IdSlots(opts.idBase ?? (process.env.SANDBOX_ID_BASE ? Number(process.env.SANDBOX_ID_BASE) : undefined), this.network?.capacity);
    this.kits = new SpareKits({
      dataDir: () => this.realDataDir ?? this.dataDir,
      idSlots: this.idSlots,
      network: this.network,
      disks: () => this.disks,
      setup: () => ({ baseLayer: BASE_NAME, agentSdkLayer: this.agentSdkLayer, usr: this.realUsr, seccomp: this.seccompFilter }),
    });
  }

  /**
   * Adoption, then the network table with the policies of the sandboxes that survived (a host
   * restart keeps their links: a veth lives as long as its sandbox's namespace).
   */
  override async init(): ReturnType<BaseProvider['init']> {
    const all = await super.init();
    // Images no adopted sandbox owns are leftovers of a host that died; spares are made again.
    await this.disks?.start((id) => this.states.has(id));
    if (this.network) {
      const live = new Map<string, Egress>();
      for (const s of this.states.values()) if (s.link && this.isLive(s)) live.set(s.link.address, s.network?.egress ?? 'internet');
      this.seal ??= await startSealing(this.network, {
        dataDir: this.dataDir,
        baseDir: this.baseDir(),
        hostLabel: this.hostId,
        env: process.env,
        log: this.log,
      });
      await this.network.load(live);
      // Adopted sandboxes' sealed secrets (kept sealed in state.json) go back into the proxy.
      for (const s of this.states.values()) if (s.link && s.sealed?.length && this.isLive(s)) this.registerSealed(s);
    }
    // Spares hold id slots and links: made once adoption has marked the adopted sandboxes' slots as taken.
    this.helpers.refill();
    return all;
  }

  /** Hands the sandbox's sealed secrets to the proxy, keyed by its link address; values are opened per request only. */
  private registerSealed(state: SandboxState): void {
    const id = state.id;
    this.seal?.register(state.link!.address, id, state.sealed!, (e) => this.stateFile.envSealer().open(e.box, sealedContext(id, e.placeholder)));
  }

  private baseDir(): string {
    return path.join(this.dataDir, BASE_NAME);
  }

  protected override adopted(state: SandboxState): void {
    if (state.idBase !== undefined) this.idSlots.take(state.idBase);
  }

  protected async prepare(): Promise<void> {
    await requireFile(this.initHelper, 'the sandbox init helper', true);
    await requireFile(this.enterHelper, 'the sandbox entry helper', true);
    await requireFile(this.seccompFilter, 'the seccomp filter', false);
    // Optional: without it sandboxes work, and the default agent runner reports that the SDK is missing.
    this.agentSdkLayer = this.agentSdkSetting ? await fsp.realpath(this.agentSdkSetting).catch(() => null) : null;
    if (this.agentSdkSetting && !this.agentSdkLayer) {
      this.log.warn(
        { path: this.agentSdkSetting },
        'the Claude Agent SDK layer is missing (scripts/toolchain.sh installs it): agent sessions cannot use the default runner',
      );
    }
    this.realDataDir = await fsp.realpath(this.dataDir);
    this.realUsr = await fsp.realpath('/usr');
    const mkfs = process.env.SANDBOX_DISK_IMAGES === 'off' ? null : await diskImagesSupported();
    if (mkfs) await (this.disks = new DiskImages(path.join(this.realDataDir, 'disks'), mkfs, DEFAULT_DISK_MB, 2, this.log)).makeDir();
    else this.log.warn('no loop devices or mkfs.ext4 (or SANDBOX_DISK_IMAGES=off): writable layers are tmpfs, charged to memory');
    await migrateSetIds(this.layersDir(), this.log);
    if (!this.helpers.closed) await this.helpers.listen();
    // Spares of a host process that is gone (see SpareKits.sweep). Teardowns a host left pending (it stopped, or died): finished before anything is made.
    this.teardowns = new SandboxTeardowns({
      dir: path.join(this.realDataDir, 'teardown'),
      log: this.log,
      idSlots: this.idSlots,
      network: this.network,
      disks: this.disks,
      waitGone: (refs) => this.waitGone(refs),
      pauseFile: process.env.SANDBOX_TEST_TEARDOWN_PAUSE_FILE || null,
    });
    await this.teardowns.start();
    await this.kits.sweep();
    await ensureBaseSkeleton(this.baseDir(), this.log);
  }

  /**
   * The sandbox's tree as its init sees it: /proc/<init>/root, with /usr mounted inside, in the
   * sandbox's mount namespace. Every descriptor opened there must be on the sandbox's own `/` or `/usr`
   * (their mount ids, from /proc/<init>/mountinfo), never on its /proc or /dev.
   */
  protected async rootMap(state: SandboxState): Promise<RootMap> {
    const ns = state.init?.ns;
    const notRunning = () => new SandboxError('conflict', `sandbox ${state.id} is not running`);
    if (!ns || !isAlive(ns)) throw notRunning();
    const key = `${ns.pid}:${ns.start}`;
    let cached = this.mountIds.get(state.id);
    if (cached?.key !== key) {
      const text = await fsp.readFile(`/proc/${ns.pid}/mountinfo`, 'utf8').catch(() => '');
      // Read from the right process only if it is still the same one afterwards (pids are reused).
      if (!isAlive(ns)) throw notRunning();
      const ids = sandboxMountIds(text);
      if (ids.size === 0) throw new SandboxError('internal', `sandbox ${state.id} has no overlay root in its mount table`);
      cached = { key, ids };
      this.mountIds.set(state.id, cached);
    }
    return {
      mounts: [{ at: '/', dir: `/proc/${ns.pid}/root` }],
      mountIds: cached.ids,
      // Created as the sandbox's user: root, or the sandbox user (who can then edit what it was given).
      ...(state.idBase !== undefined ? { owner: ownerOf(state.idBase, state.user) } : {}),
      // What the host writes into the sandbox's files is charged to the sandbox's cgroups (memory above all).
      charge: {
        procsFiles: SandboxCgroups.of(state.id).procsFiles(),
        oomKills: () => SandboxCgroups.of(state.id).oomKills(),
        memoryDir: SandboxCgroups.of(state.id).dirs.memory,
      },
      // The root opened through the pid is the sandbox's only if the init is still that process.
      verifyRoot: () => {
        if (!isAlive(ns)) throw notRunning();
      },
    };
  }

  protected isLive(state: SandboxState): boolean {
    return isAlive(state.init?.ns);
  }

  /** Stops the pool's spares and the helpers' socket; sandboxes keep running. */
  override async close(): Promise<void> {
    await this.helpers.close();
    await this.teardowns?.drain();
    await this.disks?.close();
    await this.network?.close();
    await this.seal?.close();
    await super.close();
  }

  /** The writable layer as the init helper's namespace holds it (see captureLayer), and the link's host end. */
  protected override resourceProbe(state: SandboxState): ResourceProbe {
    const outer = state.init?.outer;
    return {
      upperDir: outer && isAlive(outer) ? path.join(`/proc/${outer.pid}/root`, this.dirOf(state.id), 'm', 'w') : null,
      ifname: state.link?.ifname ?? null,
    };
  }

  protected override async applyNetwork(state: SandboxState, egress: Egress): Promise<void> {
    if (!this.network || !state.link) return super.applyNetwork(state, egress);
    await this.network.apply(state.link.address, egress);
  }

  protected async provision(state: SandboxState): Promise<void> {
    const diskMB = await this.checkDiskRoom(state);
    this.creatingDiskMB += diskMB;
    // The pool refills once no create is running (see InitHelpers.refill).
    this.helpers.createStarted();
    try {
      await this.provisionNow(state);
    } finally {
      this.creatingDiskMB -= diskMB;
      this.helpers.createEnded();
    }
  }

  /**
   * Refuses (503 unavailable) a create whose disk would overcommit DATA_DIR past SANDBOX_DISK_OVERCOMMIT
   * (see diskRoomProblem), before anything is made for it.
   */
  private async checkDiskRoom(state: SandboxState): Promise<number> {
    if (!this.disks || this.diskOvercommit === 0) return 0;
    const sizeOf = (s: SandboxState) => s.limits.diskMB ?? DEFAULT_DISK_MB;
    // Creates under way are not in `states` yet: counted apart; idle spares not (a claimed one counts as its create); a
    // running sandbox by its status (one whose processes died holds its disk until destroyed), without a /proc read each.
    let liveMB = this.creatingDiskMB;
    for (const s of this.states.values()) if (s.id !== state.id && s.status === 'running') liveMB += sizeOf(s);
    const problem = diskRoomProblem({ askMB: sizeOf(state), liveMB, freeMB: await freeMBOf(this.disks.dir), ratio: this.diskOvercommit });
    if (problem) throw new SandboxError('unavailable', `sandbox host has no room for a disk of ${sizeOf(state)} MB: ${problem}`);
    return sizeOf(state);
  }

  /** Teardowns queued or running behind destroys' answers (see ./teardowns). */
  pendingTeardowns(): number {
    return this.teardowns?.pending() ?? 0;
  }

  /** The pool's state (spares ready and starting): for tests and the host's metrics. */
  poolState(): { ready: number; starting: number; size: number } {
    return this.helpers.poolState();
  }

  private async provisionNow(state: SandboxState): Promise<void> {
    const id = state.id;
    const dir = this.dirOf(id);
    const sub = (p: string) => path.join(dir, p);
    const realData = this.realDataDir ?? this.dataDir;
    state.hostMounts = false;
    let egress: Egress;
    try {
      egress = normaliseEgress(state.network?.egress);
    } catch (err) {
      throw new SandboxError('invalid_request', (err as Error).message);
    }
    if (state.network) state.network = { egress };
    const diskMB = state.limits.diskMB ?? DEFAULT_DISK_MB;
    // A spare made whole ahead serves a create without layers of its own and of the spares' disk size:
    // a checkpoint's layers go under the overlay, which the spare has already mounted (and its pid 1
    // has pivoted into), so such a create starts a helper of its own.
    const whole = state.layers.length === 0 ? await this.helpers.claimSpare(id, state.limits, (kit) => kit?.diskMB === diskMB) : null;
    if (whole?.kit) {
      // Its exec channel came while it was made (pid 1 was forked then): now the sandbox's.
      this.execChannels.expect(id, () => whole.exec ?? Promise.resolve(null));
      return this.finishClaim(state, whole, whole.kit, egress);
    }
    // Spares follow the disk size asked for last (as ./disk's do): those of another size go, and the pool refills.
    if (state.layers.length === 0 && !whole) this.helpers.discardWhere((kit) => kit !== null && kit.diskMB !== diskMB);
    state.idBase = this.idSlots.allocate();
    // The slot's /31; a restricted policy is in the table before the sandbox can send anything.
    const link = this.network?.linkFor((state.idBase - this.idSlots.base) / ID_COUNT);
    if (link) {
      await this.network!.apply(link.address, egress);
      state.link = link;
      if (state.sealed?.length) this.registerSealed(state);
    }
    const failure = async (why: string) => {
      const logText = await fsp.readFile(sub('init.log'), 'utf8').catch(() => '');
      return new SandboxError('internal', `sandbox ${id} failed to start (${why}): ${logText.trim().slice(-1000)}`);
    };
    const starting = whole ?? (await this.helpers.startHelperFor(id, state.limits, failure));
    const image = this.disks ? await this.disks.take(id, diskMB) : null;
    // Everything the helper does, in order (see tools/sandbox-init); its log comes first, so that any
    // failure is in init.log. Each argument ends with a NUL byte.
    const args = this.kits.setupArgs({ staging: dir, idBase: state.idBase, layers: state.layers, realData, diskMB, image, name: id, link: link ?? null });
    this.execChannels.expect(id, () => this.helpers.expectExec(starting.key)); // before the helper has its arguments
    const nsPid = await handOver(starting.sock, args, failure);
    const outer = procRef(starting.pid);
    const ns = procRef(nsPid);
    if (!outer || !ns) throw new SandboxError('internal', `sandbox ${id} init exited right after start`);
    state.init = { outer, ns };
    await restoreSetIds(state, this.layersDir(), () => this.rootMap(state), this.log);
    if (state.user === 'sandbox') await writeHostsFile(await this.rootMap(state), state.idBase, id);
  }

  /** A spare made whole ahead, claimed by sandbox `state`: see SpareKits.claim. */
  private async finishClaim(state: SandboxState, starting: Starting, kit: SpareKit, egress: Egress): Promise<void> {
    const undo = (id: string) => this.helpers.discardClaimed(id, { ...kit, disk: kit.disk && this.disks ? this.disks.fileOf(id) : null });
    // The sandbox user's /etc/hosts is written by the helper at the claim (-E).
    state.init = await this.kits.claim(state.id, starting, kit, egress, this.dirOf(state.id), undo, state.user === 'sandbox');
    state.idBase = kit.idBase;
    if (kit.link) {
      state.link = kit.link;
      if (state.sealed?.length) this.registerSealed(state);
    }
  }

  /** The init to enter, the working directory, the user and the environment of a process to run in the sandbox. */
  private target(state: SandboxState, opts: SpawnOptions): { nsPid: number; cwd: string; uid: number; env: string[] } {
    const ns = state.init?.ns;
    if (!ns || !isAlive(ns)) throw new SandboxError('conflict', `sandbox ${state.id} is not running`);
    if (!opts.argv.length) throw new SandboxError('invalid_request', 'argv must not be empty');
    const cwd = opts.cwd ?? state.cwd ?? '/workspace';
    if (!cwd.startsWith('/')) throw new SandboxError('invalid_request', `cwd must be absolute: ${cwd}`);
    const asUser = (opts.user ?? state.user ?? 'root') === 'sandbox';
    const who: Record<string, string> = asUser ? { HOME: SANDBOX_HOME, USER: 'sandbox', LOGNAME: 'sandbox' } : { USER: 'root', LOGNAME: 'root' };
    return { nsPid: ns.pid, cwd, uid: asUser ? SANDBOX_UID : 0, env: envPairs(DEFAULT_ENV, who, { HOSTNAME: state.id }, state.envs, opts.env) };
  }

  protected innerArgv(state: SandboxState, opts: SpawnOptions): string[] {
    return this.enterArgv(state, opts, { cgroupProcs: [] });
  }

  /** `sap-sandbox-enter`: cgroups, namespaces, root, capabilities, seccomp, environment, timeout and exit file in one exec. */
  protected override enterArgv(state: SandboxState, opts: SpawnOptions, how: EnterOptions): string[] {
    const { nsPid, cwd, uid, env } = this.target(state, opts);
    return [
      this.enterHelper,
      ...how.cgroupProcs.flatMap((f) => ['-c', f]),
      '-n',
      String(nsPid),
      '-S',
      this.seccompFilter,
      '-w',
      cwd,
      // Values never in the process list: the helper reads them from its environment (enterEnv).
      '-E',
      String(env.length),
      ...(how.ownGroup ? ['-g'] : []),
      ...(how.timeoutSeconds ? ['-t', String(how.timeoutSeconds), '-k', String(how.killAfterSeconds ?? 0)] : []),
      ...(how.exitFile ? ['-x', how.exitFile] : []),
      ...(how.logIndex ? ['-L', how.logIndex] : []),
      ...(how.pty ? ['-T', `${how.pty.rows}x${how.pty.cols}`] : []),
      ...(how.hangUpWithCaller ? ['-P', String(how.hangUpWithCaller)] : []),
      ...(how.runFile ? ['-R', how.runFile] : []),
      ...(uid ? ['-u', String(uid)] : []),
      '--',
      ...opts.argv,
    ];
  }

  /** The process's variables as SAP_ENV_<n> = "NAME=VALUE", for the helper's `-E` (see enterArgv). */
  protected override enterEnv(state: SandboxState, opts: SpawnOptions): Record<string, string> {
    return Object.fromEntries(this.target(state, opts).env.map((pair, n) => [`SAP_ENV_${n}`, pair]));
  }

  protected override networkPrefix(state: SandboxState): string[] {
    return ['/usr/bin/nsenter', '-t', String(state.init!.ns.pid), '-n', '--'];
  }

  override async spawnPiped(id: string, opts: SpawnOptions): ReturnType<BaseProvider['spawnPiped']> {
    return (await this.execChannels.spawn(this.stateOf(id), opts, (s) => this.target(s, opts))) ?? super.spawnPiped(id, opts);
  }

  /**
   * Destroy's teardown. A sandbox this host started (its overlays in its own namespaces) is stopped
   * and its names moved away now, the rest behind destroy's answer (SandboxTeardowns.detach: its
   * directory moves too, so destroy has nothing left to remove); others are torn down here in full.
   */
  protected async teardown(id: string, state: SandboxState | undefined): Promise<void> {
    this.mountIds.delete(id);
    if (this.teardowns && (await this.teardowns.detach(id, state, this.dirOf(id)))) return;
    const cgroups = SandboxCgroups.of(id);
    signalRef(state?.init?.ns, 'SIGKILL');
    signalRef(state?.init?.outer, 'SIGKILL');
    // The init's death takes every process of its pid namespace with it; wait for that first, so
    // that the cgroups are usually empty by the time they are checked.
    await this.waitGone([state?.init?.ns, state?.init?.outer]);
    await cgroups.killAll();
    await this.waitGone([state?.entrypoint?.wrapper]);
    this.mountIds.delete(id);
    // Overlays mounted in the sandbox's own namespace went with its processes. Those on the host: a
    // sandbox of an older host (no hostMounts), or one whose state is unknown.
    if (!state?.init || state.hostMounts !== false) await unmountUnder(this.dirOf(id), this.spawner);
    await cgroups.remove();
    // The veth went with the sandbox's network namespace; its policy goes from the table.
    if (state?.link) await this.network?.release(state.link.address);
    if (state?.idBase !== undefined) this.idSlots.release(state.idBase);
    await this.disks?.remove(id);
  }

  /** See captureLayer (./layers): the sandbox's writable layer copied into read-only layer `layerId`. */
  override async checkpoint(id: string, layerId: string): Promise<{ layerId: string; parents: string[]; sizeBytes?: number }> {
    assertId(layerId, 'layer id');
    return captureLayer(this.stateOf(id), layerId, this.layersDir(), this.dirOf(id));
  }

  override async layerHash(layerId: string): Promise<string> {
    assertId(layerId, 'layer id');
    const dir = path.join(this.layersDir(), layerId);
    if (
      !(await fsp.stat(path.join(dir, 'layer.json')).then(
        () => true,
        () => false,
      ))
    ) {
      throw new SandboxError('not_found', `layer ${layerId} not found`);
    }
    return this.hashOfDir(dir);
  }

  /** See scanLayer (./layers). */
  protected override async scanLayerDir(dir: string): Promise<LayerScan> {
    return scanLayer(dir);
  }

  protected override async hashOfDir(dir: string): Promise<string> {
    return (await this.scanLayerDir(dir)).sha256;
  }
}

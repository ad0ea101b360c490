/**
 * What the namespaces provider's spares are made whole with (see ./init-helpers and
 * docs/isolation.md): an id slot with its link, a disk image, a staging directory
 * (`${dataDir}/spares/<spare>`) and the helper's SETUP arguments, all before any create; and the
 * helper's hand-over (arguments in, the sandbox's pid 1 out).
 */
import { trace } from '../../lib/trace';
import { promises as fsp } from 'node:fs';
import type * as net from 'node:net';
import * as path from 'node:path';
import { DEFAULT_DISK_MB } from '../../config/limits';
import { ID_COUNT, type IdSlots } from '../id-slots';
import { RESOLVER_ADDRESS, type Egress, type SandboxNetwork } from '../network';
import { SandboxError } from '../../contract/errors';
import { procRef, SandboxCgroups, signalRef, type ProcRef } from '../proc-refs-and-cgroups';
import type { DiskImages } from './disk';
import { removeDir, renameNow } from '../quick-fs';
import { SPARE_PREFIX, type SpareKit, type Starting } from './init-helpers';

/** What SpareKits needs of its provider (getters: some are known only once the provider has prepared). */
export interface SpareKitDeps {
  dataDir(): string;
  idSlots: IdSlots;
  network: SandboxNetwork | null;
  disks(): DiskImages | null;
  setup(): { baseLayer: string; agentSdkLayer: string | null; usr: string; seccomp: string };
}

/** The SETUP arguments of one sandbox (see setupArgs). */
export interface SetupOptions {
  staging: string;
  idBase: number;
  layers: string[];
  realData: string;
  diskMB: number;
  image: string | null;
  name: string;
  link: SpareKit['link'];
}

export class SpareKits {
  constructor(private readonly deps: SpareKitDeps) {}

  /** Where spares keep their staging directory and log until a claim moves them. */
  dir(): string {
    return path.join(this.deps.dataDir(), 'spares');
  }

  /**
   * What spare `name` is made whole with: an id slot (the user namespace's id map, and the link and
   * address of that slot), a disk image of the spares' size, a staging directory, and every SETUP
   * argument of the helper but the sandbox's name (a placeholder until the claim).
   */
  async prepare(name: string): Promise<SpareKit> {
    const { idSlots, network } = this.deps;
    const disks = this.deps.disks();
    const idBase = idSlots.allocate();
    const staging = path.join(this.dir(), name);
    let disk: string | null = null;
    try {
      await fsp.mkdir(staging, { recursive: true, mode: 0o700 });
      const diskMB = disks?.spareSize ?? DEFAULT_DISK_MB;
      disk = disks ? await disks.take(name, diskMB) : null;
      const link = network?.linkFor((idBase - idSlots.base) / ID_COUNT) ?? null;
      const args = this.setupArgs({ staging, idBase, layers: [], realData: this.deps.dataDir(), diskMB, image: disk, name: 'sandbox', link });
      return { args, idBase, link, disk, diskMB, staging };
    } catch (err) {
      idSlots.release(idBase);
      if (disk) await fsp.rm(disk, { force: true });
      await fsp.rm(staging, { recursive: true, force: true });
      throw err;
    }
  }

  /** Gives back what prepare took (the spare's processes are gone): policy, id slot, disk image, staging directory. */
  async release(kit: SpareKit): Promise<void> {
    if (kit.link) await this.deps.network?.release(kit.link.address);
    this.deps.idSlots.release(kit.idBase);
    if (kit.disk) await fsp.rm(kit.disk, { force: true });
    await fsp.rm(kit.staging, { recursive: true, force: true });
  }

  /**
   * At a host's start: what spares of a host process that is gone left. Their helpers end when their
   * connection does (with their sandbox's pid 1); whatever is still in their cgroups is killed, then
   * the groups and staging directories go (a live host's spares are in use and stay). Their images
   * go with DiskImages.start.
   */
  async sweep(): Promise<void> {
    const dead = (n: string) => n.startsWith(SPARE_PREFIX) && !signalable(Number(n.slice(SPARE_PREFIX.length).split('-')[0]));
    for (const name of await fsp.readdir('/sys/fs/cgroup/pids/sap').catch(() => [] as string[])) {
      if (dead(name)) await SandboxCgroups.of(name).killAll();
    }
    await SandboxCgroups.removeGroups(dead);
    await fsp.mkdir(this.dir(), { recursive: true, mode: 0o700 });
    for (const name of await fsp.readdir(this.dir())) {
      if (dead(name)) await fsp.rm(path.join(this.dir(), name), { recursive: true, force: true });
    }
  }

  /**
   * A spare claimed by sandbox `id` (its cgroups already renamed and limited): its egress policy goes
   * into the table and its disk image takes the sandbox's name, then the helper is handed the
   * sandbox's name (its hostname) and staging directory `${dir}/m` (where the spare's moves, in the
   * helper's mount namespace), and answers with pid 1. The spare's log joins the sandbox's directory
   * (the helper's descriptor follows the file). A failed claim kills the helper and gives everything
   * back (`undo`: its cgroups, id slot, policy, disk).
   */
  async claim(
    id: string,
    starting: Starting,
    kit: SpareKit,
    egress: Egress,
    dir: string,
    undo: (id: string) => Promise<void>,
    hostsFile: boolean,
  ): Promise<{ outer: ProcRef; ns: ProcRef }> {
    const failure = async (why: string) => {
      const logText = await fsp.readFile(path.join(kit.staging, 'init.log'), 'utf8').catch(() => '');
      return new SandboxError('internal', `sandbox ${id} failed to start (${why}): ${logText.trim().slice(-1000)}`);
    };
    try {
      if (kit.link) await this.deps.network!.apply(kit.link.address, egress);
      trace(id, 'host:egress-applied');
      if (kit.disk) this.deps.disks()!.claim(id, kit.disk);
      trace(id, 'host:disk-claimed');
      // -E 1: the helper writes /etc/hosts naming the sandbox (as writeHostsFile would, without a walk through /proc).
      const nsPid = await handOver(starting.sock, ['-H', id, '-m', path.join(dir, 'm'), ...(hostsFile ? ['-E', '1'] : [])], failure);
      trace(id, 'host:handed-over');
      const outer = procRef(starting.pid);
      const ns = procRef(nsPid);
      if (!outer || !ns) throw new SandboxError('internal', `sandbox ${id} init exited right after start`);
      // The log joins the sandbox's directory; the staging directory's leftovers (an empty mount point) go (a host start sweeps what a crash leaves).
      try {
        renameNow(path.join(kit.staging, 'init.log'), path.join(dir, 'init.log'));
      } catch {
        /* gone, or the sandbox's directory is on the scratch tmpfs (EXDEV): the log goes with the staging directory */
      }
      void removeDir(kit.staging).catch(() => undefined);
      return { outer, ns };
    } catch (err) {
      signalRef(procRef(starting.pid), 'SIGKILL');
      await undo(id);
      if (kit.disk) await fsp.rm(kit.disk, { force: true });
      throw err;
    }
  }

  /** The helper's SETUP arguments (see tools/sandbox-init), in its order; its log comes first. */
  setupArgs(o: SetupOptions): string[] {
    const { baseLayer, agentSdkLayer, usr, seccomp } = this.deps.setup();
    const layerPart = (part: 'root' | 'usr') => o.layers.map((l) => path.join(o.realData, 'layers', l, part));
    return [
      '-l',
      path.join(o.staging, 'init.log'),
      '-m',
      path.join(o.staging, 'm'),
      '-u',
      String(o.idBase),
      // The agent SDK's layer lies lowest: shared read-only by all, and a checkpoint never captures it.
      ...[...layerPart('root'), path.join(o.realData, baseLayer), ...(agentSdkLayer ? [agentSdkLayer] : [])].flatMap((l) => ['-r', l]),
      ...[...layerPart('usr'), usr].flatMap((l) => ['-p', l]),
      '-D', // The host's server fills in SANDBOX_DISK_MB; a provider used on its own takes the built-in default.
      String(o.diskMB),
      ...(o.image ? ['-I', o.image] : []),
      '-H',
      o.name,
      '-S',
      seccomp,
      ...(o.link ? ['-N', o.link.ifname, '-A', `${o.link.gateway}/${o.link.prefix}`, '-B', o.link.address] : []),
      // Its resolver: the table sends it to the host's resolver for sandboxes (network.ts, dns.ts).
      ...(o.link ? ['-d', RESOLVER_ADDRESS] : []),
    ];
  }
}

/**
 * Writes `args` to the helper's connection (each ended by a NUL byte) and shuts down the host's
 * side: the helper reads them to the end. It answers with the sandbox's pid 1 once the sandbox is
 * ready, or closes the connection when a step failed.
 */
export async function handOver(sock: net.Socket, args: string[], failure: (why: string) => Promise<Error>): Promise<number> {
  sock.end(Buffer.from(args.map((a) => a + '\0').join('')));
  return new Promise<number>((resolve, reject) => {
    let text = '';
    const fail = async (why: string) => {
      reject(await failure(why));
    };
    const timer = setTimeout(() => void fail('timeout'), 15000);
    sock.on('data', (chunk: Buffer) => {
      text += chunk.toString('utf8');
      try {
        const parsed = JSON.parse(text) as { 'child-pid'?: number };
        clearTimeout(timer);
        if (parsed['child-pid']) resolve(parsed['child-pid']);
        else void fail('no child pid');
      } catch {
        /* incomplete JSON so far */
      }
    });
    // A socket paused since its helper connected.
    sock.resume();
    sock.on('close', () => {
      clearTimeout(timer);
      void fail('the init helper closed its connection');
    });
  }).finally(() => {
    sock.removeAllListeners('close');
    sock.destroy();
  });
}

/** True while a process with this pid exists (signal 0 checks without sending anything). */
function signalable(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

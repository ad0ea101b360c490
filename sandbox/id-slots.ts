/**
 * Host id ranges of sandboxes' user namespaces. Sandbox ids 0..65535 map to host ids
 * base + slot × 65536 + 0..65535, one slot per live sandbox, so that no two sandboxes share a host
 * uid: even if they met, neither could touch the other's files or processes. On disk (checkpoint
 * layers, snapshots) ids are the sandbox's own, 0..65535: a layer means the same in every sandbox
 * and on every host (see shiftIdsToSandbox).
 */
import { promises as fsp } from 'node:fs';
import * as path from 'node:path';

/** Ids in a sandbox's user namespace. */
export const ID_COUNT = 65536;
/** Default host id of the first slot's root: 2^30, far above the ids of the host's own users. */
export const DEFAULT_ID_BASE = 1 << 30;
/** The overflow id: what an unmapped owner reads as inside a sandbox. */
const NOBODY = 65534;

export class IdSlots {
  private readonly used = new Set<number>();
  private readonly max: number;
  /**
   * Where the next search starts: slots are taken round the ring, not lowest first, so that a slot
   * just freed is not reused at once (its sandbox's network link, see network.ts, goes with an
   * asynchronous namespace cleanup in the kernel; deleting a leftover link takes tens of ms).
   */
  private next = 0;

  /** `capacity`: at most this many slots (e.g. the /31s of the sandbox network's pool). */
  constructor(
    readonly base = DEFAULT_ID_BASE,
    capacity = Infinity,
  ) {
    if (!Number.isInteger(base) || base < ID_COUNT || base > 2 ** 32 - 2 * ID_COUNT) {
      throw new Error(`SANDBOX_ID_BASE must be an integer from ${ID_COUNT} to ${2 ** 32 - 2 * ID_COUNT}: ${base}`);
    }
    // uid (2^32 - 1) is invalid: the last slot ends below it.
    this.max = Math.min(capacity, Math.floor((2 ** 32 - 1 - base) / ID_COUNT));
  }

  /** The host id of a free slot's root, now taken. */
  allocate(): number {
    for (let i = 0; i < this.max; i++) {
      const slot = (this.next + i) % this.max;
      if (!this.used.has(slot)) {
        this.used.add(slot);
        this.next = (slot + 1) % this.max;
        return this.base + slot * ID_COUNT;
      }
    }
    throw new Error('no free user-namespace id range');
  }

  /** Marks the slot of an adopted sandbox (its root's host id) as taken. */
  take(idBase: number): void {
    const slot = (idBase - this.base) / ID_COUNT;
    if (Number.isInteger(slot) && slot >= 0) this.used.add(slot);
  }

  release(idBase: number): void {
    this.used.delete((idBase - this.base) / ID_COUNT);
  }
}

/** The sandbox's id for a host id of the slot starting at `idBase` (unmapped ones read as nobody). */
export function toSandboxId(hostId: number, idBase: number): number {
  return hostId >= idBase && hostId < idBase + ID_COUNT ? hostId - idBase : NOBODY;
}

/** A regular file of a layer that had set-id bits: its path in the layer (`root/…`, `usr/…`) and its mode, bits included. */
export type SetIdFile = [string, number];

/**
 * Rewrites the owners of everything under `dir` (a copy of a sandbox's writable layer, owned by the
 * host ids of its slot) to the sandbox's own ids, so that the layer is portable. `dir` itself is the
 * host's and left alone.
 *
 * On disk those ids are host ids too (sandbox root's files are host root's): a set-id file there
 * would be a host set-id file. So regular files lose their set-id bits on disk; they are returned,
 * for the layer to keep as data (setid.json), and put back inside each sandbox made from the layer,
 * on its own copy (see NamespaceProvider.restoreSetIds).
 */
export async function shiftIdsToSandbox(dir: string, idBase: number): Promise<SetIdFile[]> {
  const setId: SetIdFile[] = [];
  const walk = async (rel: string): Promise<void> => {
    for (const name of (await fsp.readdir(path.join(dir, rel))).sort()) {
      const r = rel ? `${rel}/${name}` : name;
      const p = path.join(dir, r);
      const st = await fsp.lstat(p);
      const uid = toSandboxId(st.uid, idBase);
      const gid = toSandboxId(st.gid, idBase);
      const shifted = uid !== st.uid || gid !== st.gid;
      if (shifted) await fsp.lchown(p, uid, gid);
      if (st.isFile() && st.mode & 0o6000) {
        setId.push([r, st.mode & 0o7777]);
        await fsp.chmod(p, st.mode & 0o1777);
      } else if (shifted && st.isDirectory() && st.mode & 0o6000) {
        // chown may clear a directory's set-group-id bit; it is the layer's content (and harmless).
        await fsp.chmod(p, st.mode & 0o7777);
      }
      if (st.isDirectory()) await walk(r);
    }
  };
  await walk('');
  return setId;
}

/**
 * Removes the set-id bits of the regular files under `dir` (a layer made by an older host, which kept
 * them on disk) and returns them, as shiftIdsToSandbox does for a new layer. Owners are left alone.
 */
export async function stripSetIds(dir: string): Promise<SetIdFile[]> {
  const setId: SetIdFile[] = [];
  const walk = async (rel: string): Promise<void> => {
    for (const name of (await fsp.readdir(path.join(dir, rel))).sort()) {
      const r = rel ? `${rel}/${name}` : name;
      const st = await fsp.lstat(path.join(dir, r));
      if (st.isFile() && st.mode & 0o6000) {
        setId.push([r, st.mode & 0o7777]);
        await fsp.chmod(path.join(dir, r), st.mode & 0o1777);
      }
      if (st.isDirectory()) await walk(r);
    }
  };
  await walk('');
  return setId;
}

/**
 * Sandboxes: provisioning (the record and the host's create at once), destroying, hibernating and
 * waking, their egress policy and idle timeout, and the throttled "last active" write that the idle
 * timeout counts from.
 */
import { trace } from '../../lib/trace';
import { effectiveResources, overMaximum } from '../../config/limits';
import { ApiError, invalid, notFound } from '../../contract/errors';
import { randomId } from '../../lib/ids';
import { normaliseEgress, type Egress } from '../../contract/network';
import { findOrgCheckpoint, listPatches } from '../../store/checkpoints';
import { ImageError, resolveImage } from '../checkpoints/images';
import {
  deleteSandboxRecord,
  findOrgSandbox,
  insertSandbox,
  listLiveOrgSandboxes,
  markSandboxStoppedOnce,
  markSandboxStopped,
  SandboxDoc,
  updateSandbox,
} from '../../store/sandboxes';
import { findSecretStore, storeSecretsOf, SecretStoreMissing, SecretUnreadable } from '../../store/secrets';
import { withoutOverridden, type SealedSecretSpec } from '../../contract/sealed';
import { assertStoreUnused, removeSecretStore } from '../orgs/secret-stores';
import { hibernateSandbox } from './hibernation';
import type { PreviewService } from './previews';
import type { SandboxDeps } from '../deps';
import { patchRecord, patchRefs, pendingPatches, type PatchRef } from '../checkpoints/patch-state';

export type { SandboxDoc };

/** What a create asks for (the parsed body of POST /api/sandboxes, defaults applied). */
export interface SandboxCreateRequest {
  templateID: string;
  envs: Record<string, string>;
  secretStore?: string;
  metadata: Record<string, string>;
  timeout: number;
  onTimeout: 'kill' | 'hibernate';
  memoryMB?: number;
  cpuCount?: number;
  diskMB?: number;
  previewAuth?: unknown;
  webhooks?: unknown;
  network?: { egress: Egress };
  /** Who its processes run as; absent: SANDBOX_USER, else sandbox (OpenComputer's convention). */
  user?: 'root' | 'sandbox';
}

/** What a new sandbox is made from, besides the base image. */
export interface SandboxOrigin {
  layers?: string[];
  /** The checkpoint's patches, in sequence order (`sequence` kept: the record says which it has). */
  patches?: PatchRef[];
  /**
   * A failing patch stops the chain and the sandbox is created with the patches before it (its record
   * and view say which failed; a wake applies the rest once it is deleted). Otherwise the create fails.
   */
  keepOnPatchFailure?: boolean;
  fromCheckpoint?: string | null;
  snapshot?: string | null;
  instanceId?: string | null;
  /** The host that has the layers (a sandbox placed elsewhere gets them from it first). */
  hostId?: string;
  /** Environment from the image (the caller's envs override it) and its default working directory. */
  envs?: Record<string, string>;
  cwd?: string | null;
}

/** The organisation's sandbox, or 404. */
export async function getOrgSandbox(deps: Pick<SandboxDeps, 'store'>, orgId: string, id: string): Promise<SandboxDoc> {
  const doc = await findOrgSandbox(deps.store, orgId, id);
  if (!doc) throw notFound(`sandbox ${id}`);
  return doc;
}

/** A sandbox as its record says, plus `hostLost` when it is running or hibernated on a host that is lost now. */
export type SandboxState = SandboxDoc & { hostLost?: boolean };

/** True for a record whose sandbox lives on its host (running, or hibernated: its files are there). */
const onItsHost = (doc: SandboxDoc): boolean => doc.status === 'running' || doc.status === 'hibernated';

/**
 * The organisation's sandbox, or 404; 410 `gone` while it is running or hibernated on a lost host
 * (its host's liveness, cached: see HostDirectory.lostReason). Killed sandboxes answer as recorded.
 */
export async function getLiveOrgSandbox(deps: Pick<SandboxDeps, 'store' | 'hosts'>, orgId: string, id: string): Promise<SandboxDoc> {
  const doc = await getOrgSandbox(deps, orgId, id);
  const lost = onItsHost(doc) ? await deps.hosts.lostReason(doc.hostId) : null;
  if (lost) throw new ApiError('gone', `sandbox ${id} is unreachable: ${lost}`);
  return doc;
}

/** The organisation's running and hibernated sandboxes, newest first, each marked `hostLost` when its host is lost (one liveness lookup per host). */
export async function listOrgSandboxStates(deps: Pick<SandboxDeps, 'store' | 'hosts'>, orgId: string): Promise<SandboxState[]> {
  const docs = await listLiveOrgSandboxes(deps.store, orgId);
  const hostIds = [...new Set(docs.map((d) => d.hostId))];
  const lost = new Set((await Promise.all(hostIds.map(async (h) => ((await deps.hosts.lostReason(h)) ? h : null)))).filter((h) => h !== null));
  return lost.size ? docs.map((d) => (lost.has(d.hostId) ? { ...d, hostLost: true } : d)) : docs;
}

/** Where a sandbox started from a snapshot comes from (its layer, patches, env, workdir and host). 400 for an unusable snapshot. */
export async function snapshotOrigin(deps: Pick<SandboxDeps, 'store'>, orgId: string, ref: string): Promise<SandboxOrigin> {
  try {
    const img = await resolveImage(deps.store, orgId, ref);
    return {
      layers: img.layers,
      patches: img.patches,
      snapshot: img.snapshotId,
      fromCheckpoint: img.checkpointId,
      keepOnPatchFailure: true,
      hostId: img.hostId,
      envs: img.env,
      cwd: img.workdir,
    };
  } catch (err) {
    if (err instanceof ImageError) throw new ApiError('invalid_request', `body.snapshot: ${err.message}`);
    throw err;
  }
}

/** 501 for create options of the client this server does not implement: ignoring them would leave previews public or events undelivered while the caller thinks otherwise. */
export function refuseUnsupported(body: { previewAuth?: unknown; webhooks?: unknown }): void {
  if (body.previewAuth !== undefined)
    throw new ApiError(
      'not_implemented',
      'Sandbox.create({ previewAuth }) is not implemented by this server: protect each preview URL with authConfig at POST /api/sandboxes/{id}/preview',
    );
  if (body.webhooks !== undefined)
    throw new ApiError(
      'not_implemented',
      'Sandbox.create({ webhooks }) is not implemented by this server: no sandbox lifecycle webhooks (sessions have webhooks: see the README)',
    );
}

/**
 * Records a sandbox and creates it on a host. The record's insert and the host's create run at the
 * same time; if either fails, the other is undone (the host sandbox destroyed, the record removed) and
 * the error passed on. A sandbox left on a host without a record (the API died between the two) is
 * destroyed by the worker's reaper once it is older than its grace period (services/sandboxes/reaper.ts).
 * Limits above the operator's maxima are refused (400) before anything is created; absent ones get
 * the defaults, and the record holds the effective values the host is asked to apply.
 */
export async function provisionSandbox(
  deps: Pick<SandboxDeps, 'cfg' | 'store' | 'logger' | 'hosts' | 'secrets'>,
  orgId: string,
  body: SandboxCreateRequest,
  origin: SandboxOrigin = {},
): Promise<SandboxDoc> {
  const sandboxId = `sb-${randomId()}`;
  trace(sandboxId, 'api:provision');
  refuseUnsupported(body);
  const over = overMaximum(deps.cfg.limits, body, 'body.');
  if (over) throw invalid(over);
  const limits = effectiveResources(deps.cfg.limits, body);
  let secretEnv: Record<string, string>;
  let sealed: SealedSecretSpec[];
  try {
    ({ env: secretEnv, sealed } = await storeSecretsOf(deps.store, deps.secrets, orgId, body.secretStore));
    sealed = withoutOverridden(sealed, body.envs);
  } catch (err) {
    if (err instanceof SecretStoreMissing) throw invalid(`body.secretStore: no secret store named ${err.storeName}`);
    if (err instanceof SecretUnreadable) throw new ApiError('internal', err.message);
    throw err;
  }
  trace(sandboxId, 'api:secrets-read');
  const { hostId, client } = await deps.hosts.pick();
  trace(sandboxId, 'api:host-picked');
  if (origin.hostId && origin.layers?.length && origin.hostId !== hostId) await deps.hosts.bringLayers(hostId, origin.hostId, origin.layers);
  const now = new Date();
  const user = body.user ?? deps.cfg.SANDBOX_USER ?? 'sandbox';
  const doc: SandboxDoc = {
    _id: sandboxId,
    orgId,
    hostId,
    status: 'running',
    templateID: body.templateID,
    metadata: JSON.stringify(body.metadata),
    fromCheckpoint: origin.fromCheckpoint ?? null,
    snapshot: origin.snapshot ?? null,
    timeout: body.timeout,
    onTimeout: body.onTimeout,
    memoryMB: limits.memoryMB,
    cpuCount: limits.cpuCount,
    diskMB: limits.diskMB,
    instanceId: origin.instanceId ?? null,
    network: body.network ? { egress: normaliseEgress(body.network.egress) } : null,
    secretStore: body.secretStore ?? null,
    ...(origin.patches ? { patchesApplied: [], patchFailed: null } : {}),
    user,
    noPreviews: true,
    createdAt: now,
    updatedAt: now,
  };
  const [recorded, created] = await Promise.allSettled([
    insertSandbox(deps.store, doc).then(() => trace(sandboxId, 'api:inserted')),
    client.createSandbox({
      id: doc._id,
      orgId,
      owner: origin.instanceId ? { kind: 'instance', id: origin.instanceId } : { kind: 'api', id: doc._id },
      // Image env, then the store's secrets, then the caller's envs (the most specific wins).
      envs: { ...origin.envs, ...secretEnv, ...body.envs },
      // Sealed secrets: the host keeps the values and gives the sandbox placeholders (docs/sealed-secrets.md).
      ...(sealed.length ? { sealedSecrets: sealed } : {}),
      ...(origin.cwd ? { cwd: origin.cwd } : {}),
      user,
      memoryMB: limits.memoryMB,
      cpuCount: limits.cpuCount,
      diskMB: limits.diskMB,
      layers: origin.layers,
      patches: origin.patches?.map((p) => ({ id: p.id, script: p.script })),
      ...(origin.keepOnPatchFailure ? { keepOnPatchFailure: true } : {}),
      ...(body.network ? { network: body.network } : {}),
      metadata: body.metadata,
    }),
  ]);
  trace(sandboxId, 'api:host-created');
  if (recorded.status === 'rejected') {
    if (created.status === 'fulfilled') {
      await client
        .destroySandbox(doc._id)
        .catch((err) => deps.logger.warn({ err: String(err), sandboxId: doc._id }, 'could not destroy an unrecorded sandbox; the reaper will'));
    }
    throw recorded.reason;
  }
  if (created.status === 'rejected') {
    await deleteSandboxRecord(deps.store, doc._id);
    const e = created.reason as { type?: string; message?: string };
    if (e.type === 'patch_failed') throw new ApiError('conflict', e.message ?? 'a patch failed');
    if (e.type === 'invalid_request' || e.type === 'not_found') throw new ApiError('invalid_request', e.message ?? 'invalid sandbox request');
    throw new ApiError('unavailable', `could not create the sandbox: ${e.message ?? String(created.reason)}`);
  }
  if (origin.patches?.length) {
    const set = patchRecord([], origin.patches, created.value.patches ?? []);
    await updateSandbox(deps.store, doc._id, set);
    Object.assign(doc, set);
  }
  return doc;
}

/**
 * The sandbox operations of the API, built once per process: the wakes in flight and the throttle
 * of the "last active" write are its state.
 */
export function createSandboxService(deps: SandboxDeps, previews: PreviewService) {
  /** Wakes in flight, by sandbox: concurrent requests that wake one sandbox share one wake. */
  const waking = new Map<string, Promise<unknown>>();
  /**
   * A sandbox just created: its record's createdAt is its last activity (the reaper reads
   * `lastActiveAt ?? createdAt`), so its first minute's touches write nothing (one write less per create).
   */
  const created = (doc: SandboxDoc): SandboxDoc => {
    if (touched.size > 10_000) touched.clear();
    touched.set(doc._id, doc.createdAt.getTime());
    rememberOwner(doc);
    return doc;
  };
  /** When each sandbox's last-active time was last written (by this process). */
  const touched = new Map<string, number>();
  /**
   * The organisation and host of the sandboxes this process created or read (neither ever changes):
   * an exec needs no lookup of the record, and a delete no read before it destroys the sandbox.
   */
  const owners = new Map<string, { orgId: string; hostId: string }>();
  const rememberOwner = (doc: Pick<SandboxDoc, '_id' | 'orgId' | 'hostId'>): void => {
    if (owners.size > 10_000) owners.clear();
    owners.set(doc._id, { orgId: doc.orgId, hostId: doc.hostId });
  };

  /**
   * Destroys a sandbox known from its create (`owner`) without reading its record first: the host's
   * destroy (idempotent), then the record marked stopped (one write that answers it as it was), then
   * its previews. A sandbox stopped already (by its reaper, another API process) answers as recorded.
   */
  async function destroyKnown(orgId: string, id: string, owner: { orgId: string; hostId: string }): Promise<SandboxDoc> {
    if (owner.orgId !== orgId) throw notFound(`sandbox ${id}`);
    if (!(await deps.hosts.lostReason(owner.hostId))) await (await deps.hosts.get(owner.hostId)).destroySandbox(id);
    const now = new Date();
    const before = await markSandboxStoppedOnce(deps.store, id, now);
    owners.delete(id);
    if (!before) throw notFound(`sandbox ${id}`);
    // Previews are looked for as in destroy (the stop and the record's mark are read in one operation).
    if (!before.noPreviews) await previews.removeAll(id);
    return before.status === 'stopped' ? before : { ...before, status: 'stopped', updatedAt: now };
  }

  /**
   * Wakes a hibernated sandbox on its host and records it running; answers the fields it set. `patches`
   * (the ones it lacks) run first and the record says which it has now; a failing one stops the chain
   * and the sandbox wakes with those before it. null: none run and the record's patches stay as they are.
   */
  async function wakeOnHost(doc: SandboxDoc, patches: PatchRef[] | null, timeout?: number): Promise<Partial<SandboxDoc>> {
    const host = await deps.hosts.get(doc.hostId);
    let ran: Partial<SandboxDoc> = {};
    try {
      const info = await host.wake(
        doc._id,
        (patches ?? []).map((p) => ({ id: p.id, script: p.script })),
        { keepOnPatchFailure: true },
      );
      if (patches) ran = patchRecord(doc.patchesApplied, patches, info.patches ?? []);
    } catch (err) {
      const e = err as { type?: string; message?: string };
      if (e.type === 'patch_failed') throw new ApiError('conflict', `sandbox ${doc._id} stays hibernated: ${e.message}`);
      // Already awake on the host (a wake whose record was not written): record it below.
      if (e.type !== 'conflict') throw new ApiError('unavailable', `could not wake the sandbox: ${e.message ?? String(err)}`);
    }
    const now = new Date();
    const set = { status: 'running' as const, hibernation: null, lastActiveAt: now, updatedAt: now, ...(timeout !== undefined ? { timeout } : {}), ...ran };
    await updateSandbox(deps.store, doc._id, set, doc);
    return set;
  }

  /** Wakes a hibernated sandbox with the on_wake patches of its checkpoint that it does not have yet; answers the fields it set. */
  async function wakeWithPatches(doc: SandboxDoc, timeout?: number): Promise<Partial<SandboxDoc>> {
    const cp = doc.fromCheckpoint ? await findOrgCheckpoint(deps.store, doc.orgId, doc.fromCheckpoint) : null;
    const all = cp ? patchRefs(await listPatches(deps.store, cp)) : [];
    return wakeOnHost(doc, pendingPatches(doc, all), timeout);
  }

  /** Hibernates a running sandbox (its record too); 409 when it is not running. */
  async function hibernateRunning(doc: SandboxDoc): Promise<SandboxDoc> {
    if (doc.status !== 'running') throw new ApiError('conflict', `sandbox ${doc._id} is ${doc.status}; only a running sandbox can hibernate`);
    const host = await deps.hosts.get(doc.hostId);
    try {
      return await hibernateSandbox(deps.store, host, doc);
    } catch (err) {
      const e = err as { type?: string; message?: string };
      if (e.type === 'conflict' || e.type === 'not_found' || e.type === 'invalid_request')
        throw new ApiError('conflict', `sandbox ${doc._id} cannot hibernate: ${e.message}`);
      throw new ApiError('unavailable', `could not hibernate the sandbox: ${e.message ?? String(err)}`);
    }
  }

  /**
   * Destroys a sandbox on its host, removes its previews and marks its record stopped. Idempotent.
   * On a lost host the record alone is marked: the host destroys the sandbox when it rejoins.
   */
  async function destroy(doc: SandboxDoc): Promise<SandboxDoc> {
    if (doc.status === 'stopped') {
      // A delete cut short after the record was marked: its previews go now.
      if (!doc.noPreviews) await previews.removeAll(doc._id);
      return doc;
    }
    if (!(await deps.hosts.lostReason(doc.hostId))) await (await deps.hosts.get(doc.hostId)).destroySandbox(doc._id);
    const now = new Date();
    // Previews are looked for where one was made, as the record says once stopped: a preview's create
    // marks the record before it opens the port (previews.create), so one made meanwhile is seen here.
    const after = await markSandboxStopped(deps.store, doc._id, now);
    if (!after?.noPreviews) await previews.removeAll(doc._id);
    return { ...doc, status: 'stopped', updatedAt: now };
  }

  return {
    /** The organisation's sandbox (404); 410 while it lives on a lost host. */
    get: (orgId: string, id: string) => getLiveOrgSandbox(deps, orgId, id),
    /** The organisation's running and hibernated sandboxes, newest first; those on a lost host marked `hostLost`. */
    list: (orgId: string) => listOrgSandboxStates(deps, orgId),
    provision: async (orgId: string, body: SandboxCreateRequest, origin?: SandboxOrigin) => created(await provisionSandbox(deps, orgId, body, origin)),
    /** Provisions a sandbox from a snapshot (id or name); 400 for an unusable snapshot. */
    provisionFromSnapshot: async (orgId: string, body: SandboxCreateRequest, ref: string) =>
      created(await provisionSandbox(deps, orgId, body, await snapshotOrigin(deps, orgId, ref))),
    /** A sandbox's organisation and host as this process knows them (from its create or an earlier read), or undefined. */
    ownerOf: (id: string) => owners.get(id),
    rememberOwner,
    destroy,
    wakeWithPatches,

    /**
     * Kills a sandbox; with `deleteSecretStore`, also deletes the secret store it was created with
     * (409, and nothing killed, while an agent names that store).
     */
    async kill(orgId: string, id: string, deleteSecretStore: boolean): Promise<SandboxDoc> {
      const owner = owners.get(id);
      if (owner && !deleteSecretStore) return destroyKnown(orgId, id, owner);
      const doc = await getOrgSandbox(deps, orgId, id);
      const store = deleteSecretStore && doc.secretStore ? await findSecretStore(deps.store, orgId, doc.secretStore) : null;
      const secretDeps = deps;
      if (store) await assertStoreUnused(secretDeps, store);
      const after = await destroy(doc);
      if (store) await removeSecretStore(secretDeps, store);
      return after;
    },

    /** Changes a running sandbox's egress policy (at once, on its host) and records it. */
    async setNetwork(orgId: string, id: string, policy: { egress: Egress }): Promise<SandboxDoc> {
      const doc = await getOrgSandbox(deps, orgId, id);
      if (doc.status !== 'running') throw new ApiError('conflict', `sandbox ${doc._id} is ${doc.status}`);
      const host = await deps.hosts.get(doc.hostId);
      let info;
      try {
        info = await host.setNetwork(doc._id, policy);
      } catch (err) {
        const e = err as { type?: string; message?: string };
        if (e.type === 'conflict' || e.type === 'not_found') throw new ApiError('conflict', e.message ?? `sandbox ${doc._id} cannot change its policy`);
        if (e.type === 'invalid_request') throw new ApiError('invalid_request', e.message ?? 'invalid policy');
        throw err;
      }
      const network = info.network ?? policy;
      const now = new Date();
      await updateSandbox(deps.store, doc._id, { network, updatedAt: now });
      return { ...doc, network, updatedAt: now };
    },

    /** Hibernates a sandbox (a hibernated one is answered as it is); 409 when it is not running. */
    async hibernate(orgId: string, id: string): Promise<SandboxDoc> {
      const doc = await getLiveOrgSandbox(deps, orgId, id);
      if (doc.status === 'hibernated') return doc;
      return hibernateRunning(doc);
    },

    /** Wakes a hibernated sandbox (its checkpoint's patches first), optionally with a new idle timeout; 409 otherwise. */
    async wake(orgId: string, id: string, timeout?: number): Promise<SandboxDoc> {
      const doc = await getLiveOrgSandbox(deps, orgId, id);
      if (doc.status !== 'hibernated') {
        const why = doc.status === 'running' ? 'is running' : doc.status === 'stopped' ? 'was killed' : `is ${doc.status}`;
        throw new ApiError('conflict', `sandbox ${doc._id} ${why}; only a hibernated sandbox can be woken`);
      }
      return { ...doc, ...(await wakeWithPatches(doc, timeout)) };
    },

    /** Reboots a running sandbox: a hibernate and a wake, without patches. */
    async restart(orgId: string, id: string): Promise<SandboxDoc> {
      const doc = await hibernateRunning(await getOrgSandbox(deps, orgId, id));
      return { ...doc, ...(await wakeOnHost(doc, null)) };
    },

    /** Sets the idle timeout (0 = none), counted from now; 409 for a killed sandbox. */
    async setIdleTimeout(orgId: string, id: string, timeout: number): Promise<SandboxDoc> {
      const doc = await getLiveOrgSandbox(deps, orgId, id);
      if (doc.status === 'stopped') throw new ApiError('conflict', `sandbox ${doc._id} was killed`);
      const now = new Date();
      const set = { timeout, lastActiveAt: now, updatedAt: now };
      await updateSandbox(deps.store, doc._id, set);
      return { ...doc, ...set };
    },

    /**
     * Starts waking a hibernated sandbox in the background (at most one wake per sandbox at a time), for
     * the client's async wake: its requests are answered 503 `{ waking: true }` and retried.
     */
    wakeInBackground(doc: SandboxDoc): void {
      if (waking.has(doc._id)) return;
      const p = wakeWithPatches(doc)
        .catch((err: unknown) => deps.logger.warn({ err: String(err), sandboxId: doc._id }, 'background wake failed'))
        .finally(() => waking.delete(doc._id));
      waking.set(doc._id, p);
    },

    /**
     * Marks a sandbox as used now (its idle timeout counts from here), at most once a minute per
     * sandbox per process: it costs a write, so the check is made before any is started. Never throws.
     */
    touch(id: string): void {
      const now = Date.now();
      if ((touched.get(id) ?? 0) > now - 60_000) return;
      touched.set(id, now);
      if (touched.size > 10_000) touched.clear();
      updateSandbox(deps.store, id, { lastActiveAt: new Date(now) }).catch((err: unknown) => deps.logger.warn({ err, sandboxId: id }, 'touchSandbox failed'));
    },
  };
}

/** The sandbox operations (see createSandboxService). */
export type SandboxService = ReturnType<typeof createSandboxService>;

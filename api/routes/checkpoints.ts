import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import '../http';
import { ApiError, conflict, notFound } from '../../lib/errors';
import { randomId } from '../../lib/ids';
import {
  CheckpointDoc,
  checkpointsOf,
  createPatch,
  deletePatch,
  findOrgCheckpoint,
  listPatches,
  PatchDoc,
  checkpointStatus,
  patchesOf,
  snapshotsOf,
} from '../../store/checkpoints';
import { sandboxesOf } from '../../store/sandboxes';
import { CreateSandboxBody, getOrgSandbox, provisionSandbox, SandboxParams, sandboxView, SandboxView } from './sandboxes';
import { assertRoomAfterCapture, assertStorageRoom } from '../storage-quota';

const CheckpointId = z.string().regex(/^cp-[a-z0-9]{1,64}$/, 'must be a checkpoint id (cp-…)');
const PatchId = z.string().regex(/^pa-[a-z0-9]{1,64}-[0-9]{1,9}$/, 'must be a patch id (pa-…)');

export const CheckpointView = z
  .object({
    id: z.string(),
    sandboxId: z.string(),
    orgId: z.string(),
    name: z.string(),
    status: z.enum(['processing', 'ready', 'failed']).describe('processing while its layer is copied, then ready (or failed, with error)'),
    error: z.string().nullable(),
    sizeBytes: z.number().int().describe("Bytes of the sandbox's own files it holds (its writable layer)"),
    sandboxConfig: z.record(z.string(), z.unknown()),
    createdAt: z.string(),
  })
  .openapi('Checkpoint');

export const PatchView = z
  .object({
    id: z.string(),
    checkpointId: z.string(),
    script: z.string(),
    description: z.string(),
    strategy: z.literal('on_wake'),
    sequence: z.number().int(),
    createdAt: z.string(),
  })
  .openapi('Patch');

/** The public form of a checkpoint (the OpenComputer client's CheckpointInfo). */
export function checkpointView(c: CheckpointDoc): z.infer<typeof CheckpointView> {
  const { status, error } = checkpointStatus(c);
  return { id: c._id, sandboxId: c.sandboxId, orgId: c.orgId, name: c.name, status, error, sizeBytes: c.sizeBytes ?? 0, sandboxConfig: {}, createdAt: c.createdAt.toISOString() };
}

const READY_WAIT_MS = 120_000;

/**
 * The checkpoint once it is ready: a `processing` one (its copy is under way in another request) is
 * waited for (bounded); a failed one is 409.
 */
export async function readyCheckpoint(deps: ApiDeps, cp: CheckpointDoc): Promise<CheckpointDoc> {
  const deadline = Date.now() + READY_WAIT_MS;
  let cur = cp;
  for (;;) {
    const { status, error } = checkpointStatus(cur);
    if (status === 'ready') return cur;
    if (status === 'failed') throw conflict(`checkpoint ${cur._id} failed: ${error ?? 'unknown error'}`);
    if (Date.now() > deadline) throw conflict(`checkpoint ${cur._id} is still processing`);
    await new Promise((r) => setTimeout(r, 100));
    const next = await checkpointsOf(deps.store).findOne({ _id: cur._id });
    if (!next) throw notFound(`checkpoint ${cur._id}`);
    cur = next;
  }
}

/** The public form of a patch (2.6). */
export function patchView(p: PatchDoc): z.infer<typeof PatchView> {
  return {
    id: p._id,
    checkpointId: p.checkpointId,
    script: p.script,
    description: p.description,
    strategy: p.strategy,
    sequence: p.sequence,
    createdAt: p.createdAt.toISOString(),
  };
}

/** The organisation's checkpoint, or 404. */
export async function getOrgCheckpoint(deps: ApiDeps, orgId: string, id: string): Promise<CheckpointDoc> {
  const cp = await findOrgCheckpoint(deps.store, orgId, id);
  if (!cp) throw notFound(`checkpoint ${id}`);
  return cp;
}

/**
 * Why a checkpoint cannot be deleted yet, or null: a snapshot uses it, a later checkpoint was
 * taken over it, or a running sandbox stacks it. (List queries: this is not a hot path.)
 */
export async function checkpointInUse(deps: ApiDeps, cp: CheckpointDoc, exceptSnapshot?: string): Promise<string | null> {
  const [snap, child, sandbox] = await Promise.all([
    snapshotsOf(deps.store).findOne(
      exceptSnapshot ? { orgId: cp.orgId, checkpointId: cp._id, _id: { $ne: exceptSnapshot } } : { orgId: cp.orgId, checkpointId: cp._id },
      { projection: { _id: 1 } },
    ),
    checkpointsOf(deps.store).findOne({ orgId: cp.orgId, parents: cp.layerId }, { projection: { _id: 1 } }),
    sandboxesOf(deps.store).findOne({ orgId: cp.orgId, fromCheckpoint: cp._id, status: { $in: ['running', 'hibernated'] } }, { projection: { _id: 1 } }),
  ]);
  if (snap) return `snapshot ${snap._id} uses it`;
  if (child) return `checkpoint ${child._id} was taken over it`;
  if (sandbox) return `sandbox ${sandbox._id} runs from it`;
  return null;
}

/**
 * Checkpoints, spawning from them, and their patches:
 * - POST/GET /api/sandboxes/{id}/checkpoints, DELETE /api/sandboxes/{id}/checkpoints/{checkpointId}
 * - POST /api/sandboxes/from-checkpoint/{checkpointId}
 * - POST/GET /api/sandboxes/checkpoints/{checkpointId}/patches, DELETE …/patches/{patchId}
 */
export function registerCheckpointRoutes(t: RouteTable, deps: ApiDeps): void {
  // Built here, not at load: ./sandboxes and this module import each other (through ./snapshots).
  const SandboxCheckpointParams = SandboxParams.extend({ checkpointId: CheckpointId });
  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/checkpoints',
    tag: 'checkpoints',
    summary: "Capture the sandbox's filesystem (its writable layer, copied while the sandbox is frozen) as a checkpoint",
    params: SandboxParams,
    body: z.object({ name: z.string().max(200).optional() }).passthrough(),
    responses: { 201: { description: 'The checkpoint', schema: CheckpointView } },
    errors: [409, 503, 507],
    handler: async ({ params, body, org, res }) => {
      const sb = await getOrgSandbox(deps, org.id, params.id);
      if (sb.status !== 'running') throw conflict(`sandbox ${sb._id} is ${sb.status}`);
      await assertStorageRoom(deps, org.id);
      const id = `cp-${randomId()}`;
      const host = await deps.hosts.get(sb.hostId);
      // Recorded as processing first: a list or spawn meanwhile sees it (and a spawn waits for it).
      const doc: CheckpointDoc = {
        _id: id,
        orgId: org.id,
        sandboxId: sb._id,
        hostId: sb.hostId,
        name: body.name || id,
        layerId: id,
        parents: [],
        patchSeq: 0,
        status: 'processing',
        error: null,
        sizeBytes: null,
        createdAt: new Date(),
      };
      await checkpointsOf(deps.store).insertOne(doc);
      let layer: { layerId: string; parents: string[]; sizeBytes?: number };
      try {
        layer = await host.createCheckpoint(sb._id, id);
      } catch (err) {
        const e = err as { type?: string; message?: string };
        const message = e.message ?? String(err);
        await checkpointsOf(deps.store).updateOne({ _id: id }, { $set: { status: 'failed', error: message } });
        if (e.type === 'not_found' || e.type === 'conflict') throw conflict(`sandbox ${sb._id} cannot be checkpointed: ${message}`);
        throw new ApiError('unavailable', `could not checkpoint the sandbox: ${message}`);
      }
      const done = { layerId: layer.layerId, parents: layer.parents, status: 'ready' as const, sizeBytes: layer.sizeBytes ?? null };
      try {
        await assertRoomAfterCapture(deps, org.id, id);
        await checkpointsOf(deps.store).updateOne({ _id: id }, { $set: done });
      } catch (err) {
        if (err instanceof ApiError) await checkpointsOf(deps.store).updateOne({ _id: id }, { $set: { status: 'failed', error: err.message } }).catch(() => undefined);
        await host.deleteLayer(layer.layerId).catch(() => undefined);
        throw err;
      }
      Object.assign(doc, done);
      res.status(201).json(checkpointView(doc));
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/checkpoints',
    tag: 'checkpoints',
    summary: "List a sandbox's checkpoints, oldest first",
    params: SandboxParams,
    responses: { 200: { description: 'Checkpoints (a bare array, as the OpenComputer client expects)', schema: z.array(CheckpointView) } },
    handler: async ({ params, org, res }) => {
      const sb = await getOrgSandbox(deps, org.id, params.id);
      const docs = await checkpointsOf(deps.store).find({ sandboxId: sb._id }).sort({ createdAt: 1 }).limit(1000).toArray();
      res.json(docs.filter((d) => d.orgId === org.id).map(checkpointView));
    },
  });

  t.add({
    method: 'delete',
    path: '/api/sandboxes/:id/checkpoints/:checkpointId',
    tag: 'checkpoints',
    summary: 'Delete a checkpoint, its layer and its patches (409 while a snapshot, a later checkpoint or a running sandbox uses it)',
    params: SandboxCheckpointParams,
    responses: { 200: { description: 'The deleted checkpoint', schema: CheckpointView } },
    errors: [409],
    handler: async ({ params, org, res }) => {
      const cp = await getOrgCheckpoint(deps, org.id, params.checkpointId);
      if (cp.sandboxId !== params.id) throw notFound(`checkpoint ${params.checkpointId} of sandbox ${params.id}`);
      if (checkpointStatus(cp).status === 'processing') throw conflict(`checkpoint ${cp._id} is still processing`);
      const why = await checkpointInUse(deps, cp);
      if (why) throw conflict(`checkpoint ${cp._id} is in use: ${why}`);
      await deleteCheckpoint(deps, cp);
      res.json(checkpointView(cp));
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/checkpoints/:checkpointId/restore',
    tag: 'checkpoints',
    summary: "Put the sandbox's files back to a checkpoint in place (same id; its processes end, as at a reboot); the checkpoint's patches run first",
    params: SandboxCheckpointParams,
    responses: { 200: { description: 'The running sandbox', schema: SandboxView } },
    errors: [409, 503],
    handler: async ({ params, org, res }) => {
      const sb = await getOrgSandbox(deps, org.id, params.id);
      if (sb.status !== 'running') throw conflict(`sandbox ${sb._id} is ${sb.status}; only a running sandbox can be restored`);
      const cp = await readyCheckpoint(deps, await getOrgCheckpoint(deps, org.id, params.checkpointId));
      // Taken on another host: its layer (and parents) are copied to the sandbox's host first.
      if (cp.hostId !== sb.hostId) await deps.hosts.bringLayers(sb.hostId, cp.hostId, [cp.layerId]);
      const patches = (await listPatches(deps.store, cp)).map((p) => ({ id: p._id, script: p.script }));
      const host = await deps.hosts.get(sb.hostId);
      try {
        await host.restore(sb._id, cp.layerId, patches);
      } catch (err) {
        const e = err as { type?: string; message?: string };
        if (e.type === 'patch_failed') {
          // The host keeps it hibernated over the checkpoint: a wake retries the patches.
          const now = new Date();
          await sandboxesOf(deps.store).updateOne({ _id: sb._id }, { $set: { status: 'hibernated', hibernation: { layerId: cp.layerId, at: now }, fromCheckpoint: cp._id, updatedAt: now } });
          throw conflict(`sandbox ${sb._id} was restored but a patch failed, so it is hibernated (wake retries): ${e.message}`);
        }
        if (e.type === 'conflict' || e.type === 'not_found') throw conflict(`sandbox ${sb._id} cannot be restored: ${e.message}`);
        throw new ApiError('unavailable', `could not restore the sandbox: ${e.message ?? String(err)}`);
      }
      // It now stands on the checkpoint: that checkpoint cannot be deleted under it, and its patches run at each wake.
      const now = new Date();
      const set = { fromCheckpoint: cp._id, lastActiveAt: now, updatedAt: now };
      await sandboxesOf(deps.store).updateOne({ _id: sb._id }, { $set: set });
      res.json(sandboxView(deps, { ...sb, ...set }));
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/checkpoints/:checkpointId',
    tag: 'checkpoints',
    summary: 'Get a checkpoint (its status: processing, ready or failed)',
    params: SandboxCheckpointParams,
    responses: { 200: { description: 'The checkpoint', schema: CheckpointView } },
    handler: async ({ params, org, res }) => {
      const cp = await getOrgCheckpoint(deps, org.id, params.checkpointId);
      if (cp.sandboxId !== params.id) throw notFound(`checkpoint ${params.checkpointId} of sandbox ${params.id}`);
      res.json(checkpointView(cp));
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/from-checkpoint/:checkpointId',
    tag: 'checkpoints',
    summary: "Spawn a sandbox from a checkpoint (copy-on-write over its layer, on the checkpoint's host); the checkpoint's patches run first, in order",
    params: z.object({ checkpointId: CheckpointId }),
    body: CreateSandboxBody.omit({ templateID: true, snapshot: true }),
    responses: { 201: { description: 'The running sandbox', schema: SandboxView } },
    errors: [409, 503],
    handler: async ({ params, body, org, res }) => {
      const cp = await readyCheckpoint(deps, await getOrgCheckpoint(deps, org.id, params.checkpointId));
      const patches = await listPatches(deps.store, cp);
      const doc = await provisionSandbox(deps, org.id, { ...body, templateID: 'base' }, {
        layers: [cp.layerId],
        patches: patches.map((p) => ({ id: p._id, script: p.script })),
        fromCheckpoint: cp._id,
        hostId: cp.hostId,
      });
      res.status(201).json(sandboxView(deps, doc));
    },
  });

  const PatchParams = z.object({ checkpointId: CheckpointId });

  t.add({
    method: 'post',
    path: '/api/sandboxes/checkpoints/:checkpointId/patches',
    tag: 'checkpoints',
    summary: 'Add a patch: a bash script run in every sandbox spawned from the checkpoint, in sequence order, before anything else',
    params: PatchParams,
    body: z.object({ script: z.string().min(1).max(256 * 1024), description: z.string().max(2000).default('') }),
    responses: { 201: { description: 'The patch, with the next sequence number', schema: z.object({ patch: PatchView }) } },
    handler: async ({ params, body, org, res }) => {
      const cp = await getOrgCheckpoint(deps, org.id, params.checkpointId);
      let patch: PatchDoc;
      try {
        patch = await createPatch(deps.store, cp, body);
      } catch (err) {
        if ((err as { code?: string }).code === 'not_found') throw notFound(`checkpoint ${cp._id}`);
        throw err;
      }
      res.status(201).json({ patch: patchView(patch) });
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/checkpoints/:checkpointId/patches',
    tag: 'checkpoints',
    summary: "List a checkpoint's patches in sequence order",
    params: PatchParams,
    responses: { 200: { description: 'Patches (a bare array, as the OpenComputer client expects)', schema: z.array(PatchView) } },
    handler: async ({ params, org, res }) => {
      const cp = await getOrgCheckpoint(deps, org.id, params.checkpointId);
      res.json((await listPatches(deps.store, cp)).map(patchView));
    },
  });

  t.add({
    method: 'delete',
    path: '/api/sandboxes/checkpoints/:checkpointId/patches/:patchId',
    tag: 'checkpoints',
    summary: 'Delete a patch; its sequence number is not reused',
    params: PatchParams.extend({ patchId: PatchId }),
    responses: { 200: { description: 'The deleted patch', schema: z.object({ patch: PatchView }) } },
    handler: async ({ params, org, res }) => {
      const cp = await getOrgCheckpoint(deps, org.id, params.checkpointId);
      const patch = await patchesOf(deps.store).findOne({ _id: params.patchId });
      if (!patch || patch.checkpointId !== cp._id || patch.deleted) throw notFound(`patch ${params.patchId}`);
      await deletePatch(deps.store, patch._id);
      res.json({ patch: patchView(patch) });
    },
  });
}

/** Removes a checkpoint's record, patches and layer (the caller has checked it is unused). */
export async function deleteCheckpoint(deps: ApiDeps, cp: CheckpointDoc): Promise<void> {
  await checkpointsOf(deps.store).deleteOne({ _id: cp._id });
  await patchesOf(deps.store).deleteMany({ checkpointId: cp._id });
  const host = await deps.hosts.get(cp.hostId).catch(() => null);
  await host?.deleteLayer(cp.layerId).catch((err) => deps.logger.warn({ err: String(err), layerId: cp.layerId }, 'could not delete a layer'));
}

import { createHash } from 'node:crypto';
import { z } from 'zod';
import type { Response } from 'express';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import '../http';
import { ApiError, conflict, invalid, notFound } from '../../lib/errors';
import { randomId } from '../../lib/ids';
import { fromJsonText, isDuplicateKey } from '../../store';
import {
  findOrgSnapshot,
  ImageManifest,
  SnapshotDoc,
  snapshotNameKey,
  snapshotNamesOf,
  snapshotsOf,
} from '../../store/checkpoints';
import { sandboxesOf } from '../../store/sandboxes';
import { buildSnapshot, chainHash, reapStaleBuild } from '../snapshot-builder';
import { checkpointInUse, deleteCheckpoint, getOrgCheckpoint, readyCheckpoint } from './checkpoints';
import { hostTaskQueue } from '../../config';
import { assertStorageRoom } from '../storage-quota';

export { ImageManifestSchema, ImageStepSchema } from '../../contract/image-schema';
import { ImageManifestSchema } from '../../contract/image-schema';

const SnapshotName = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/, 'must be 1-128 letters, digits, ".", "_" or "-", starting with a letter or digit');

export const CreateSnapshotBody = z
  .object({
    name: SnapshotName,
    image: ImageManifestSchema.optional(),
    checkpointId: z.string().regex(/^cp-[a-z0-9]{1,64}$/, 'must be a checkpoint id (cp-…)').optional(),
  })
  .refine((b) => (b.image === undefined) !== (b.checkpointId === undefined), { message: 'give exactly one of image and checkpointId', path: ['image'] })
  .openapi('CreateSnapshot');

export const SnapshotView = z
  .object({
    id: z.string(),
    orgId: z.string(),
    name: z.string(),
    status: z.enum(['building', 'ready', 'failed']),
    contentHash: z.string().nullable(),
    checkpointId: z.string().nullable(),
    manifest: z.record(z.string(), z.unknown()),
    error: z.string().nullable(),
    createdAt: z.string(),
    lastUsedAt: z.string(),
  })
  .openapi('Snapshot');

/** The public form of a snapshot (2.8). */
export function snapshotView(s: SnapshotDoc): z.infer<typeof SnapshotView> {
  return {
    id: s._id,
    orgId: s.orgId,
    name: s.name,
    status: s.status,
    contentHash: s.contentHash,
    checkpointId: s.checkpointId,
    manifest: fromJsonText(s.manifest) ?? { steps: [] },
    error: s.error,
    createdAt: s.createdAt.toISOString(),
    lastUsedAt: s.lastUsedAt.toISOString(),
  };
}

const IdOrName = z.object({ idOrName: SnapshotName });

/** The organisation's snapshot by id or name (a dead build is reported failed), or 404. */
async function getOrgSnapshot(deps: ApiDeps, orgId: string, idOrName: string): Promise<SnapshotDoc> {
  const s = await findOrgSnapshot(deps.store, orgId, idOrName);
  if (!s) throw notFound(`snapshot ${idOrName}`);
  return reapStaleBuild(deps, s);
}

/** Server-Sent Events on `res`: `event: <name>` + one JSON `data:` line. */
function sse(res: Response): { send(event: string, data: unknown): void; end(): void } {
  res.status(200);
  res.setHeader('content-type', 'text/event-stream; charset=utf-8');
  res.setHeader('cache-control', 'no-cache');
  res.setHeader('x-accel-buffering', 'no');
  res.flushHeaders();
  const keepalive = setInterval(() => res.write(': keepalive\n\n'), 15_000);
  keepalive.unref();
  return {
    send: (event, data) => {
      if (!res.writableEnded) res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
    },
    end: () => {
      clearInterval(keepalive);
      if (!res.writableEnded) res.end();
    },
  };
}

/** A new snapshot record, `building`, named `name` (not stored yet). */
function newSnapshotDoc(orgId: string, name: string, manifest: ImageManifest): SnapshotDoc {
  const now = new Date();
  return {
    _id: `snap-${randomId()}`,
    orgId,
    name,
    status: 'building',
    contentHash: null,
    checkpointId: null,
    hostId: null,
    layerId: null,
    ownsCheckpoint: false,
    manifest: JSON.stringify(manifest),
    env: [],
    workdir: null,
    error: null,
    build: null,
    createdAt: now,
    updatedAt: now,
    lastUsedAt: now,
  };
}

/** The name under which an image given at sandbox create is cached: `image-` + 24 hex digits of its manifest's hash. */
export function imageCacheName(manifest: ImageManifest): string {
  const canonical = JSON.stringify({ base: manifest.base, steps: manifest.steps });
  return `image-${createHash('sha256').update(canonical).digest('hex').slice(0, 24)}`;
}

const IMAGE_WAIT_MS = 30 * 60_000;

/**
 * The snapshot of an image given at sandbox create, built once per organisation and manifest: a ready
 * one is reused (no build); one being built by another request is waited for; a failed one is built
 * again; otherwise it is built here, its steps' output going to `log`. Throws conflict when the
 * build fails (with its error).
 */
export async function imageSnapshot(deps: ApiDeps, orgId: string, manifest: ImageManifest, log: (e: { step: number; type: string; message: string }) => void): Promise<SnapshotDoc> {
  const name = imageCacheName(manifest);
  const deadline = Date.now() + IMAGE_WAIT_MS;
  for (let attempt = 0; ; attempt++) {
    const found = await findOrgSnapshot(deps.store, orgId, name);
    const cur = found ? await reapStaleBuild(deps, found) : null;
    if (cur?.status === 'ready') {
      log({ step: 0, type: 'cache', message: `image ${name} is built already (snapshot ${cur._id}): no build` });
      return cur;
    }
    if (cur?.status === 'failed') {
      if (attempt > 0) throw conflict(`the image build failed: ${cur.error ?? 'unknown error'}`);
      // A failed build of the same manifest is built again (it may have been a network failure).
      await snapshotsOf(deps.store).deleteOne({ _id: cur._id });
      await snapshotNamesOf(deps.store).deleteOne({ _id: snapshotNameKey(orgId, name) });
      continue;
    }
    if (cur?.status === 'building') {
      if (Date.now() > deadline) throw conflict(`image ${name} is still building`);
      await new Promise((r) => setTimeout(r, 500));
      attempt = -1;
      continue;
    }
    await assertStorageRoom(deps, orgId);
    const doc = newSnapshotDoc(orgId, name, manifest);
    try {
      await snapshotNamesOf(deps.store).insertOne({ _id: snapshotNameKey(orgId, name), snapshotId: doc._id });
    } catch (err) {
      if (isDuplicateKey(err)) continue; // another request started the build just now
      throw err;
    }
    try {
      await snapshotsOf(deps.store).insertOne(doc);
    } catch (err) {
      await snapshotNamesOf(deps.store).deleteOne({ _id: snapshotNameKey(orgId, name) });
      throw err;
    }
    const done = await buildSnapshot(deps, doc, manifest, log);
    if (done.status !== 'ready') throw conflict(`the image build failed: ${done.error ?? 'unknown error'}`);
    return done;
  }
}

/** Server-Sent Events when the request asks for them (Accept: text/event-stream), else null. */
export function sseIfAsked(req: import('express').Request, res: Response): ReturnType<typeof sse> | null {
  return (req.header('accept') ?? '').includes('text/event-stream') ? sse(res) : null;
}

/** /api/snapshots: build (from an image manifest) or take (from a checkpoint), list, read, delete. */
export function registerSnapshotRoutes(t: RouteTable, deps: ApiDeps): void {
  t.add({
    method: 'post',
    path: '/api/snapshots',
    tag: 'snapshots',
    summary:
      'Create a snapshot. With `image`, the steps run in a fresh sandbox which is then checkpointed; with `Accept: text/event-stream` the build streams ' +
      '`build_log` events ({ step, type, message }) and ends with `result` (the snapshot) or `error` ({ error }); without it the answer is 202 at once with ' +
      'status `building` (poll GET). With `checkpointId`, the checkpoint is named as a snapshot at once (201).',
    body: CreateSnapshotBody,
    responses: {
      201: { description: 'The snapshot of a checkpoint, ready', schema: SnapshotView },
      202: { description: 'The snapshot, building', schema: SnapshotView },
    },
    errors: [409, 503, 507],
    handler: async ({ body, org, req, res }) => {
      const builderMB = body.image?.builderMemoryMB;
      if (builderMB !== undefined && builderMB > deps.cfg.limits.maxMemoryMB) {
        throw invalid(`body.image.builderMemoryMB: ${builderMB} is above the maximum of ${deps.cfg.limits.maxMemoryMB} MB (SANDBOX_MAX_MEMORY_MB)`);
      }
      await assertStorageRoom(deps, org.id);
      const found = body.checkpointId ? await getOrgCheckpoint(deps, org.id, body.checkpointId).catch(() => null) : null;
      if (body.checkpointId && !found) throw invalid(`body.checkpointId: checkpoint ${body.checkpointId} not found`);
      const cp = found ? await readyCheckpoint(deps, found) : null;
      const manifest: ImageManifest = body.image ?? { base: 'base', steps: [] };
      const doc = newSnapshotDoc(org.id, body.name, manifest);
      try {
        await snapshotNamesOf(deps.store).insertOne({ _id: snapshotNameKey(org.id, body.name), snapshotId: doc._id });
      } catch (err) {
        if (isDuplicateKey(err)) throw conflict(`a snapshot named ${body.name} exists`);
        throw err;
      }

      if (cp) {
        try {
          const host = await deps.hosts.get(cp.hostId);
          const hashes = await Promise.all([cp.layerId, ...cp.parents].map((l) => host.layerHash(l)));
          Object.assign(doc, { status: 'ready', contentHash: chainHash(hashes), checkpointId: cp._id, hostId: cp.hostId, layerId: cp.layerId });
          await snapshotsOf(deps.store).insertOne(doc);
        } catch (err) {
          await snapshotNamesOf(deps.store).deleteOne({ _id: snapshotNameKey(org.id, body.name) });
          if (err instanceof ApiError) throw err;
          throw new ApiError('unavailable', `could not read the checkpoint's layers: ${(err as Error).message}`);
        }
        res.status(201).json(snapshotView(doc));
        return;
      }

      try {
        await snapshotsOf(deps.store).insertOne(doc);
      } catch (err) {
        await snapshotNamesOf(deps.store).deleteOne({ _id: snapshotNameKey(org.id, body.name) });
        throw err;
      }
      if (req.accepts(['application/json', 'text/event-stream']) === 'text/event-stream' && (req.header('accept') ?? '').includes('text/event-stream')) {
        const stream = sse(res);
        const done = await buildSnapshot(deps, doc, manifest, (e) => stream.send('build_log', e));
        if (done.status === 'ready') stream.send('result', snapshotView(done));
        else stream.send('error', { error: done.error ?? 'build failed' });
        stream.end();
        return;
      }
      void buildSnapshot(deps, doc, manifest, () => undefined);
      res.status(202).json(snapshotView(doc));
    },
  });

  t.add({
    method: 'get',
    path: '/api/snapshots',
    tag: 'snapshots',
    summary: "List the organisation's snapshots, newest first (a bare JSON array)",
    responses: { 200: { description: 'Snapshots', schema: z.array(SnapshotView) } },
    handler: async ({ org, res }) => {
      const docs = await snapshotsOf(deps.store).find({ orgId: org.id }).sort({ createdAt: -1 }).limit(1000).toArray();
      const current = await Promise.all(docs.map((d) => reapStaleBuild(deps, d)));
      res.json(current.map(snapshotView));
    },
  });

  t.add({
    method: 'get',
    path: '/api/snapshots/:idOrName',
    tag: 'snapshots',
    summary: 'Get a snapshot by id (snap-…) or name',
    params: IdOrName,
    responses: { 200: { description: 'The snapshot', schema: SnapshotView } },
    handler: async ({ params, org, res }) => {
      res.json(snapshotView(await getOrgSnapshot(deps, org.id, params.idOrName)));
    },
  });

  t.add({
    method: 'delete',
    path: '/api/snapshots/:idOrName',
    tag: 'snapshots',
    summary: 'Delete a snapshot (and the checkpoint its build made); 409 while it is building or an agent or a running sandbox uses it',
    params: IdOrName,
    responses: { 200: { description: 'The deleted snapshot', schema: SnapshotView } },
    errors: [409],
    handler: async ({ params, org, res }) => {
      const snap = await getOrgSnapshot(deps, org.id, params.idOrName);
      if (snap.status === 'building') throw conflict(`snapshot ${snap.name} is still building`);
      const [agent, sandbox] = await Promise.all([
        deps.store.agents.findOne({ orgId: org.id, snapshot: { $in: [snap._id, snap.name] } }, { projection: { id: 1 } }),
        sandboxesOf(deps.store).findOne({ orgId: org.id, snapshot: snap._id, status: 'running' }, { projection: { _id: 1 } }),
      ]);
      if (agent) throw conflict(`snapshot ${snap.name} is used by agent ${agent.id}`);
      if (sandbox) throw conflict(`snapshot ${snap.name} is used by running sandbox ${sandbox._id}`);
      const cp = snap.ownsCheckpoint && snap.checkpointId ? await getOrgCheckpoint(deps, org.id, snap.checkpointId).catch(() => null) : null;
      if (cp) {
        const why = await checkpointInUse(deps, cp, snap._id);
        if (why) throw conflict(`snapshot ${snap.name}'s checkpoint ${cp._id} is in use: ${why}`);
      }
      await snapshotsOf(deps.store).deleteOne({ _id: snap._id });
      await snapshotNamesOf(deps.store).deleteOne({ _id: snapshotNameKey(org.id, snap.name) });
      if (cp) await deleteCheckpoint(deps, cp);
      res.json(snapshotView(snap));
    },
  });
}

/**
 * Where sessions and instances of an agent with `snapshot` (id or name) are provisioned: the
 * snapshot's id and the task queue of the host that has its layer. 400 when it is missing or not ready.
 */
export async function snapshotRefOf(deps: ApiDeps, orgId: string, ref: string): Promise<{ snapshotId: string; taskQueue: string }> {
  const snap = await findOrgSnapshot(deps.store, orgId, ref);
  if (!snap) throw invalid(`the agent's snapshot ${ref} does not exist`);
  if (snap.status !== 'ready' || !snap.hostId) throw invalid(`the agent's snapshot ${ref} is ${snap.status}, not ready`);
  return { snapshotId: snap._id, taskQueue: hostTaskQueue(deps.cfg, snap.hostId) };
}

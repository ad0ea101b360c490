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

const noDotDot = (p: string) => !p.split('/').includes('..');
const AbsPath = z.string().min(2).max(4096).startsWith('/', 'must be an absolute path').refine(noDotDot, 'must not contain ..');
const EnvName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid environment variable name');
const Packages = (re: RegExp) => z.array(z.string().min(1).max(200).regex(re, 'must be a package name (no spaces, no leading -)')).min(1).max(500);

/** One manifest step, in the open API's shape (`{ type, args }`). */
export const ImageStepSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('run'), args: z.object({ commands: z.array(z.string().min(1).max(64 * 1024)).min(1).max(200) }) }),
  z.object({ type: z.literal('apt_install'), args: z.object({ packages: Packages(/^[A-Za-z0-9][A-Za-z0-9+.:=~_-]*$/) }) }),
  z.object({ type: z.literal('pip_install'), args: z.object({ packages: Packages(/^[A-Za-z0-9][^\s]*$/) }) }),
  z.object({ type: z.literal('env'), args: z.object({ vars: z.record(EnvName, z.string().max(32 * 1024)) }) }),
  z.object({ type: z.literal('workdir'), args: z.object({ path: AbsPath }) }),
  z.object({
    type: z.literal('add_file'),
    args: z.object({ path: AbsPath, content: z.string(), encoding: z.enum(['base64', 'utf8']).default('base64') }),
  }),
  z.object({
    type: z.literal('add_dir'),
    args: z.object({
      path: AbsPath,
      files: z
        .array(z.object({ relativePath: z.string().min(1).max(4096).refine((p) => !p.startsWith('/') && noDotDot(p), 'must be a relative path without ..'), content: z.string() }))
        .max(10_000),
    }),
  }),
]);

/** An image manifest: the base image and its build steps. */
export const ImageManifestSchema = z
  .object({
    base: z.literal('base', { message: 'only the "base" image exists' }).default('base'),
    steps: z.array(ImageStepSchema).max(500).default([]),
    builderMemoryMB: z.number().int().min(64).optional().describe('Memory limit of the build sandbox in MB; default SANDBOX_MEMORY_MB, at most SANDBOX_MAX_MEMORY_MB'),
  })
  .openapi('ImageManifest');

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
    errors: [409, 503],
    handler: async ({ body, org, req, res }) => {
      const builderMB = body.image?.builderMemoryMB;
      if (builderMB !== undefined && builderMB > deps.cfg.limits.maxMemoryMB) {
        throw invalid(`body.image.builderMemoryMB: ${builderMB} is above the maximum of ${deps.cfg.limits.maxMemoryMB} MB (SANDBOX_MAX_MEMORY_MB)`);
      }
      const found = body.checkpointId ? await getOrgCheckpoint(deps, org.id, body.checkpointId).catch(() => null) : null;
      if (body.checkpointId && !found) throw invalid(`body.checkpointId: checkpoint ${body.checkpointId} not found`);
      const cp = found ? await readyCheckpoint(deps, found) : null;
      const now = new Date();
      const manifest: ImageManifest = body.image ?? { base: 'base', steps: [] };
      const doc: SnapshotDoc = {
        _id: `snap-${randomId()}`,
        orgId: org.id,
        name: body.name,
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

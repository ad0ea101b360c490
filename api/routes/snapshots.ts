import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import '../http';
import type { SnapshotDoc } from '../../services/checkpoints/snapshots';
import type { SandboxServices } from '../../services/sandboxes/sandbox-services';
import { sse } from '../sse';

export { ImageManifestSchema, ImageStepSchema } from '../../contract/image-schema';
import { CreateSnapshotBody, SnapshotView, IdOrName } from '../../contract/checkpoints';

/** The public form of a snapshot (2.8). */
export function snapshotView(s: SnapshotDoc): z.infer<typeof SnapshotView> {
  return {
    id: s._id,
    orgId: s.orgId,
    name: s.name,
    status: s.status,
    contentHash: s.contentHash,
    checkpointId: s.checkpointId,
    manifest: (JSON.parse(s.manifest) as Record<string, unknown> | null) ?? { steps: [] },
    error: s.error,
    createdAt: s.createdAt.toISOString(),
    lastUsedAt: s.lastUsedAt.toISOString(),
  };
}

/** /api/snapshots: build (from an image manifest) or take (from a checkpoint), list, read, delete. */
export function registerSnapshotRoutes(t: RouteTable, deps: ApiDeps, sandbox: SandboxServices): void {
  const svc = sandbox.snapshots;
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
      const { snapshot: doc, manifest } = await svc.create(org.id, body);
      if (doc.status === 'ready') {
        res.status(201).json(snapshotView(doc));
        return;
      }
      if (req.accepts(['application/json', 'text/event-stream']) === 'text/event-stream' && (req.header('accept') ?? '').includes('text/event-stream')) {
        const stream = sse(res);
        const done = await svc.build(doc, manifest, (e) => stream.send('build_log', e));
        if (done.status === 'ready') stream.send('result', snapshotView(done));
        else stream.send('error', { error: done.error ?? 'build failed' });
        stream.end();
        return;
      }
      void svc.build(doc, manifest, () => undefined);
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
      res.json((await svc.list(org.id)).map(snapshotView));
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
      res.json(snapshotView(await svc.get(org.id, params.idOrName)));
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
      res.json(snapshotView(await svc.remove(org.id, params.idOrName)));
    },
  });
}

import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import '../http';
import { checkpointStatus, type CheckpointDoc, type PatchDoc } from '../../services/checkpoints/checkpoints';
import type { SandboxServices } from '../../services/sandboxes/sandbox-services';
import { CreateSandboxBody, SandboxParams, SandboxView } from '../../contract/sandboxes';
import { sandboxView } from '../../services/views';
import { CheckpointId, PatchId, CheckpointView, PatchView, SandboxCheckpointParams, PatchParams } from '../../contract/checkpoints';

/** The public form of a checkpoint (the OpenComputer client's CheckpointInfo). */
export function checkpointView(c: CheckpointDoc): z.infer<typeof CheckpointView> {
  const { status, error } = checkpointStatus(c);
  return {
    id: c._id,
    sandboxId: c.sandboxId,
    orgId: c.orgId,
    name: c.name,
    status,
    error,
    sizeBytes: c.sizeBytes ?? 0,
    sandboxConfig: {},
    createdAt: c.createdAt.toISOString(),
  };
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

/**
 * Checkpoints, spawning from them, and their patches:
 * - POST/GET /api/sandboxes/{id}/checkpoints, DELETE /api/sandboxes/{id}/checkpoints/{checkpointId}
 * - POST /api/sandboxes/from-checkpoint/{checkpointId}
 * - POST/GET /api/sandboxes/checkpoints/{checkpointId}/patches, DELETE …/patches/{patchId}
 */
export function registerCheckpointRoutes(t: RouteTable, deps: ApiDeps, sandbox: SandboxServices): void {
  const svc = sandbox.checkpoints;
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
      const doc = await svc.capture(org.id, params.id, body.name);
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
      res.json((await svc.list(org.id, params.id)).map(checkpointView));
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
      res.json(checkpointView(await svc.remove(org.id, params.id, params.checkpointId)));
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
      res.json(sandboxView(deps, await svc.restore(org.id, params.id, params.checkpointId)));
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
      res.json(checkpointView(await svc.get(org.id, params.id, params.checkpointId)));
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
      const doc = await svc.spawn(org.id, params.checkpointId, { ...body, templateID: 'base' });
      res.status(201).json(sandboxView(deps, doc));
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/checkpoints/:checkpointId/patches',
    tag: 'checkpoints',
    summary: 'Add a patch: a bash script run in every sandbox spawned from the checkpoint, in sequence order, before anything else',
    params: PatchParams,
    body: z.object({
      script: z
        .string()
        .min(1)
        .max(256 * 1024),
      description: z.string().max(2000).default(''),
    }),
    responses: { 201: { description: 'The patch, with the next sequence number', schema: z.object({ patch: PatchView }) } },
    handler: async ({ params, body, org, res }) => {
      const patch = await svc.addPatch(org.id, params.checkpointId, body);
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
      res.json((await svc.listPatches(org.id, params.checkpointId)).map(patchView));
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
      res.json({ patch: patchView(await svc.removePatch(org.id, params.checkpointId, params.patchId)) });
    },
  });
}

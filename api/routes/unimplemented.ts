import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import { ApiError } from '../../contract/errors';
import type { SandboxServices } from '../../services/sandboxes/sandbox-services';
import { SandboxParams } from '../../contract/sandboxes';

/**
 * Calls of the OpenComputer client (@opencomputer/sdk 0.12.4) that concern sandboxes and that this
 * server does not implement. Each answers 501 with the error body naming the call, after the usual
 * authentication and, for a sandbox's call, the usual 404 for a sandbox of another organisation, so
 * that a client never mistakes a missing feature for a missing sandbox. They are not in /openapi.json.
 * The README lists them, with why.
 */
export const UNIMPLEMENTED: { method: 'get' | 'post' | 'put' | 'delete'; path: string; call: string; why: string }[] = [
  { method: 'put', path: '/api/sandboxes/:id/autoscale', call: 'Sandbox.setAutoscale', why: 'no autoscaling of a running sandbox' },
  { method: 'get', path: '/api/sandboxes/:id/autoscale', call: 'Sandbox.getAutoscale', why: 'no autoscaling of a running sandbox' },
  { method: 'put', path: '/api/sandboxes/:id/scaling-lock', call: 'Sandbox.setScalingLock', why: 'no autoscaling of a running sandbox' },
  { method: 'get', path: '/api/sandboxes/:id/scaling-lock', call: 'Sandbox.getScalingLock', why: 'no autoscaling of a running sandbox' },
  {
    method: 'post',
    path: '/api/sandboxes/:id/preview/rotate',
    call: 'Sandbox.rotatePreviewAuthToken',
    why: 'preview tokens are per preview URL (authConfig at POST /preview), not per sandbox',
  },
  { method: 'post', path: '/api/sandboxes/:id/mounts', call: 'Mounts.add', why: 'no remote (rclone) mounts inside sandboxes' },
  { method: 'get', path: '/api/sandboxes/:id/mounts', call: 'Mounts.list', why: 'no remote (rclone) mounts inside sandboxes' },
  { method: 'delete', path: '/api/sandboxes/:id/mounts', call: 'Mounts.remove', why: 'no remote (rclone) mounts inside sandboxes' },
  { method: 'post', path: '/api/templates', call: 'Templates.create', why: 'images are built from manifests (Image, snapshots), not from Dockerfiles' },
  { method: 'get', path: '/api/templates', call: 'Templates.list', why: 'images are built from manifests (Image, snapshots), not from Dockerfiles' },
  { method: 'get', path: '/api/templates/:name', call: 'Templates.get', why: 'images are built from manifests (Image, snapshots), not from Dockerfiles' },
  { method: 'delete', path: '/api/templates/:name', call: 'Templates.delete', why: 'images are built from manifests (Image, snapshots), not from Dockerfiles' },
];

/** Registers the 501 answers of UNIMPLEMENTED. */
export function registerUnimplementedRoutes(t: RouteTable, deps: ApiDeps, sandbox: SandboxServices): void {
  const sandboxes = sandbox.sandboxes;
  for (const u of UNIMPLEMENTED) {
    const onSandbox = u.path.includes(':id');
    t.add({
      method: u.method,
      path: u.path,
      tag: 'unimplemented',
      summary: `${u.call}: not implemented (501)`,
      undocumented: true,
      params: onSandbox ? SandboxParams : u.path.includes(':name') ? z.object({ name: z.string().min(1).max(200) }) : undefined,
      responses: { 501: { description: 'Not implemented' } },
      handler: async ({ params, org }) => {
        if (onSandbox) await sandboxes.get(org.id, (params as { id: string }).id);
        throw new ApiError('not_implemented', `${u.call} is not implemented by this server: ${u.why}`);
      },
    });
  }
}

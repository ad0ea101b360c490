/**
 * Checkpoints, patches and snapshots (/api/sandboxes/checkpoints, /api/snapshots): ids, bodies and views.
 */
import { z } from './zod'; // zod with .openapi()
import { ImageManifestSchema } from './image-schema';
import { SandboxParams } from './sandboxes';

/** A conversation turn's checkpoint id: `cp-c<the conversation id's body>-t<turn>` (taken at the turn's end). */
export const turnCheckpointId = (conversationId: string, turn: number): string => `cp-${conversationId.replace(/^conv_/, 'c')}-t${turn}`;

/** The conversation and turn a turn checkpoint's id names, or null for any other checkpoint. */
export function turnOfCheckpoint(id: string): { conversationId: string; turn: number } | null {
  const m = /^cp-c([a-z0-9]{1,64})-t([0-9]{1,9})$/.exec(id);
  return m ? { conversationId: `conv_${m[1]}`, turn: Number(m[2]) } : null;
}

/** A checkpoint's id: `cp-` and its body, or a conversation turn's (`cp-c…-t<turn>`). */
export const CheckpointId = z.string().regex(/^cp-[a-z0-9]{1,64}(-t[0-9]{1,9})?$/, 'must be a checkpoint id (cp-…)');

export const PatchId = z.string().regex(/^pa-[a-z0-9]{1,64}-[0-9]{1,9}$/, 'must be a patch id (pa-…)');

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

export const SnapshotName = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/, 'must be 1-128 letters, digits, ".", "_" or "-", starting with a letter or digit');

export const CreateSnapshotBody = z
  .object({
    name: SnapshotName,
    image: ImageManifestSchema.optional(),
    checkpointId: z
      .string()
      .regex(/^cp-[a-z0-9]{1,64}$/, 'must be a checkpoint id (cp-…)')
      .optional(),
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

export const IdOrName = z.object({ idOrName: SnapshotName });

export const SandboxCheckpointParams = SandboxParams.extend({ checkpointId: CheckpointId });

export const PatchParams = z.object({ checkpointId: CheckpointId });

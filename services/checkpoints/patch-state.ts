/**
 * Which of its checkpoint's patches a sandbox has: the chain stops at a patch that exits non-zero
 * (as OpenComputer's does); the sandbox runs with the patches before it, its record names the failed
 * one, and each wake applies the patches it does not have yet, in sequence order, once each (the
 * failed one again until it is deleted).
 */
import type { PatchOutcome } from '../../sandbox';
import type { PatchDoc } from '../../store/checkpoints';
import type { SandboxDoc } from '../../store/sandboxes';

/** A patch as it is handed to a host, with its sequence number. */
export interface PatchRef {
  id: string;
  sequence: number;
  script: string;
}

/** The patches of a checkpoint (listPatches) as PatchRefs. */
export function patchRefs(docs: PatchDoc[]): PatchRef[] {
  return docs.map((p) => ({ id: p._id, sequence: p.sequence, script: p.script }));
}

/**
 * The patches of `all` (sequence order) that the sandbox does not have. A record from before the
 * applied patches were kept gets them all, as it did then.
 */
export function pendingPatches(doc: Pick<SandboxDoc, 'patchesApplied'>, all: PatchRef[]): PatchRef[] {
  if (!doc.patchesApplied) return all;
  const have = new Set(doc.patchesApplied.map((p) => p.id));
  return all.filter((p) => !have.has(p.id));
}

/** The record's patch fields after a host ran `ran` (in order) and answered their `outcomes`. */
export function patchRecord(
  prev: SandboxDoc['patchesApplied'],
  ran: PatchRef[],
  outcomes: PatchOutcome[],
  at = new Date(),
): Required<Pick<SandboxDoc, 'patchesApplied' | 'patchFailed'>> {
  const seq = new Map(ran.map((p) => [p.id, p.sequence]));
  const applied = [...(prev ?? [])];
  let failed: SandboxDoc['patchFailed'] = null;
  for (const o of outcomes) {
    if (!seq.has(o.id)) continue;
    if (o.exitCode !== 0) {
      failed = { id: o.id, sequence: seq.get(o.id)!, exitCode: o.exitCode, outputTail: o.outputTail, at };
      break;
    }
    if (!applied.some((p) => p.id === o.id)) applied.push({ id: o.id, sequence: seq.get(o.id)! });
  }
  return { patchesApplied: applied, patchFailed: failed };
}

/** The view's patch fields: `patchError` (OpenComputer's, a message) and `patches` (which are applied, which failed). */
export function patchFields(s: SandboxDoc): {
  patchError?: string;
  patches?: { applied: { id: string; sequence: number }[]; failed: { id: string; sequence: number; exitCode: number; outputTail: string } | null };
} {
  if (!s.fromCheckpoint || !s.patchesApplied) return {};
  const f = s.patchFailed ?? null;
  const failed = f ? { id: f.id, sequence: f.sequence, exitCode: f.exitCode, outputTail: f.outputTail } : null;
  return {
    ...(f
      ? {
          patchError:
            `patch ${f.id} (sequence ${f.sequence}) failed with exit code ${f.exitCode}: ${f.outputTail.slice(-500)}` +
            ` — it and the patches after it are not applied; delete it (DELETE /api/sandboxes/checkpoints/${s.fromCheckpoint}/patches/${f.id}) and the next wake applies the rest`,
        }
      : {}),
    patches: { applied: s.patchesApplied, failed },
  };
}

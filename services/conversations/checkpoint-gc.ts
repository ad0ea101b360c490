/**
 * Garbage collection of a conversation's turn checkpoints (docs/api/conversations.md, "Checkpoints
 * and garbage collection"). Every live turn keeps its checkpoint (it stays forkable). A turn a rewind
 * left keeps it while something stands on it: a fork made at that turn (or at a turn layered on it),
 * a checkpoint taken over its layer, a snapshot made of it, a sandbox spawned from it. The others are
 * freed: the checkpoint's record goes (the storage quota counts it no more) and its layer is released
 * on the hosts (removed once nothing on a host stands on it). The turn stays in the conversation's
 * history, left, with `checkpointFreed: true`; a fork of it or a rewind to it is refused (409).
 *
 * It runs after a rewind (the conversation's workflow, behind the rewind's answer) and, for the whole
 * organisation, before a turn is admitted when the organisation is at its storage quota.
 *
 * Races. A turn's checkpoint is claimed by inserting a lock document (the one atomic claim on
 * FerretDB): `gc` while it is freed (and for good after), `rewind` while a rewind to it runs. The
 * collection claims the turns it would free from the highest down and stops at the first it cannot
 * claim (a turn is layered only on lower ones), then reads everything again and frees only what is
 * still unreachable; a fork, once recorded, looks whether its base turn is claimed by `gc` and is
 * refused when it is. Each side writes before it reads, so one of them always sees the other.
 */
import type { CheckpointDoc } from '../../store/checkpoints';
import { findSnapshotOfCheckpoint, listChildCheckpoints, listSandboxCheckpoints } from '../../store/checkpoints';
import { findSandboxOnCheckpoint } from '../../store/sandboxes';
import {
  conversationsWithLeftCheckpoints,
  findConversation,
  listAllTurns,
  listForks,
  lockTurn,
  unlockTurn,
  updateTurn,
  type ConversationDoc,
  type TurnDoc,
} from '../../store/conversations';
import { ApiError } from '../../contract/errors';
import { deleteCheckpoint } from '../checkpoints/checkpoints';
import { assertStorageRoom } from '../checkpoints/storage-quota';
import type { SandboxDeps } from '../deps';
import { unreachableTurns } from './reachability';

/** What the collection needs: the store, the hosts (to release layers), a logger. */
export type GcDeps = Parameters<typeof deleteCheckpoint>[0];

/** At most this many conversations are collected before one turn is admitted at the quota. */
const ORG_GC_CONVERSATIONS = 50;
/** Forks followed from one conversation (its forks, theirs standing on its turns, …). */
const MAX_FORKS_FOLLOWED = 1000;

/** The message of a fork of, or a rewind to, a turn whose checkpoint was freed. */
export const checkpointFreedMessage = (conversationId: string, turn: number): string =>
  `turn ${turn} of conversation ${conversationId} has no checkpoint any more: a rewind left it and nothing stood on it, so garbage collection freed it ` +
  `(the turn stays in /turns with "checkpointFreed": true); fork or rewind to a turn that is still on the conversation's line`;

/**
 * The turns of `doc` that forks stand on: its forks at its own turns, and the forks of those forks
 * made at or before their fork point (they stand on the same checkpoint), and so on.
 */
async function forkBases(deps: GcDeps, doc: ConversationDoc): Promise<Set<number>> {
  const bases = new Set<number>();
  const own = doc.forkedFrom?.turn ?? -1;
  const seen = new Set([doc._id]);
  // (conversation, the highest of its turns that is one of doc's own)
  const work: [string, number][] = [[doc._id, Infinity]];
  while (work.length && seen.size < MAX_FORKS_FOLLOWED) {
    const [id, upTo] = work.pop()!;
    for (const f of await listForks(deps.store, id)) {
      const at = f.forkedFrom?.turn ?? -1;
      if (seen.has(f._id) || at <= own || at > upTo) continue;
      seen.add(f._id);
      bases.add(at);
      work.push([f._id, at]);
    }
  }
  return bases;
}

interface Plan {
  doc: ConversationDoc;
  turns: Map<number, TurnDoc>;
  checkpoints: Map<string, CheckpointDoc>;
  /** The turns to free, highest first. */
  free: number[];
}

/** Reads what the reachability needs and answers the turns nothing reaches (see reachability.ts). */
async function plan(deps: GcDeps, conversationId: string): Promise<Plan | null> {
  const doc = await findConversation(deps.store, conversationId);
  if (!doc) return null;
  const own = doc.forkedFrom?.turn ?? -1;
  const [all, bases, cps] = await Promise.all([
    listAllTurns(deps.store, conversationId),
    forkBases(deps, doc),
    doc.sandboxId ? listSandboxCheckpoints(deps.store, doc.sandboxId) : Promise.resolve([]),
  ]);
  const turns = new Map(all.filter((t) => t.turn > own).map((t) => [t.turn, t]));
  const checkpoints = new Map(cps.filter((c) => c.orgId === doc.orgId).map((c) => [c._id, c]));
  const parents = new Map(cps.map((c) => [c.layerId, c.parents]));
  const candidates = [...turns.values()].filter((t) => t.left && t.layerId && !t.checkpointFreed);
  const candidateLayers = new Set(candidates.map((t) => t.layerId!));
  // What stands on a candidate from outside the candidates: a checkpoint over its layer, a snapshot of it, a sandbox spawned from it.
  const pinnedLayers: string[] = [];
  await Promise.all(
    candidates.map(async (t) => {
      const [children, snap, sandbox] = await Promise.all([
        listChildCheckpoints(deps.store, doc.orgId, t.layerId!),
        t.checkpointId ? findSnapshotOfCheckpoint(deps.store, doc.orgId, t.checkpointId) : null,
        t.checkpointId ? findSandboxOnCheckpoint(deps.store, doc.orgId, t.checkpointId) : null,
      ]);
      if (snap || sandbox || children.some((c) => !candidateLayers.has(c.layerId))) pinnedLayers.push(t.layerId!);
    }),
  );
  const free = unreachableTurns({
    turns: [...turns.values()].map((t) => ({ turn: t.turn, after: t.after, left: t.left, layerId: t.layerId, freed: t.checkpointFreed === true })),
    pinnedTurns: [doc.headTurn, ...bases],
    pinnedLayers,
    parentsOf: (l) => parents.get(l) ?? [],
  });
  return { doc, turns, checkpoints, free };
}

/**
 * Frees the checkpoints of conversation `conversationId`'s left turns that nothing reaches any more
 * (see the module comment); answers the turns whose checkpoints it freed, highest first.
 */
export async function collectConversationCheckpoints(deps: GcDeps, conversationId: string): Promise<number[]> {
  const first = await plan(deps, conversationId);
  if (!first) return [];
  // A collection that stopped between marking a turn freed and deleting its checkpoint: finished now.
  for (const t of first.turns.values()) {
    const cp = t.checkpointFreed && t.checkpointId ? first.checkpoints.get(t.checkpointId) : undefined;
    if (cp) await deleteCheckpoint(deps, cp);
  }
  const claimed: number[] = [];
  for (const turn of first.free) {
    if ((await lockTurn(deps.store, conversationId, turn, 'gc')) !== 'gc') break;
    claimed.push(turn);
  }
  if (!claimed.length) return [];
  // Read again after the claims: a fork recorded or a rewind done meanwhile is seen now.
  const again = await plan(deps, conversationId);
  const still = new Set(again?.free ?? []);
  const freed: number[] = [];
  for (const turn of claimed) {
    if (!still.has(turn)) {
      await unlockTurn(deps.store, conversationId, turn, 'gc');
      continue;
    }
    const t = again!.turns.get(turn)!;
    await updateTurn(deps.store, conversationId, turn, { checkpointFreed: true });
    const cp = t.checkpointId ? again!.checkpoints.get(t.checkpointId) : undefined;
    if (cp) await deleteCheckpoint(deps, cp);
    freed.push(turn);
  }
  if (freed.length) deps.logger.info({ conversationId, turns: freed }, 'freed the checkpoints of left turns nothing stands on');
  return freed;
}

/** Collects the organisation's conversations that have left turns with checkpoints; answers how many checkpoints were freed. */
export async function collectOrgCheckpoints(deps: GcDeps, orgId: string): Promise<number> {
  let n = 0;
  for (const id of await conversationsWithLeftCheckpoints(deps.store, orgId, ORG_GC_CONVERSATIONS)) {
    n += (
      await collectConversationCheckpoints(deps, id).catch((err: unknown) => {
        deps.logger.warn({ err: String(err), conversationId: id }, 'could not collect the checkpoints of a conversation');
        return [];
      })
    ).length;
  }
  return n;
}

/**
 * Admits a new turn (a message, a conversation or a fork): 507 (the checkpoint routes' answer) when
 * the organisation is at its storage quota even after its conversations' unreachable checkpoints
 * are freed. Nothing is stored before it answers.
 */
export async function assertTurnRoom(deps: GcDeps & Pick<SandboxDeps, 'cfg'>, orgId: string): Promise<void> {
  try {
    await assertStorageRoom(deps, orgId);
    return;
  } catch (err) {
    if (!(err instanceof ApiError && err.type === 'insufficient_storage')) throw err;
  }
  await collectOrgCheckpoints(deps, orgId);
  await assertStorageRoom(deps, orgId);
}

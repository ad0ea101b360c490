/**
 * Which turn checkpoints of a conversation nothing can reach any more (pure: the decision of
 * checkpoint-gc.ts, which reads its inputs and frees what this answers).
 *
 * A turn's checkpoint is a copy-on-write layer over the sandbox's layers when it was taken: its
 * record's `parents` (expanded, topmost first) and, in the conversation, the turn it continued
 * from (`after`: the checkpoint its sandbox stood on). A checkpoint is kept when it is
 *   - a live turn's (not `left`): every live turn stays forkable;
 *   - pinned: the conversation's head, the base of a fork (a fork stands on its parent's checkpoint
 *     at the fork turn, its sandbox and its own checkpoints layered on it);
 *   - a pinned layer: something outside the conversation's turns stands on it (a checkpoint taken
 *     over it, a snapshot made of it, a sandbox spawned from it);
 *   - under a kept one: a layer a kept checkpoint is layered on (its `after` turn's, its parents).
 * The rest, the checkpoints of turns a rewind left, are unreachable.
 */

/** One turn of the conversation (its own turns, turn 0 included) as the reachability sees it. */
export interface ReachTurn {
  turn: number;
  /** The turn it continued from (its start state). */
  after: number;
  left: boolean;
  /** Its checkpoint's layer, or null while it has none. */
  layerId: string | null;
  /** Its checkpoint was freed already. */
  freed: boolean;
}

export interface ReachInput {
  turns: ReachTurn[];
  /** Turns that must stay: the head, the bases of forks. */
  pinnedTurns: Iterable<number>;
  /** Layers something outside the turns stands on. */
  pinnedLayers: Iterable<string>;
  /** The layers a checkpoint's layer was taken over (its record's parents; [] when unknown). */
  parentsOf: (layerId: string) => readonly string[];
}

/** The turns whose checkpoints are kept (see the module comment). */
export function keptTurns(input: ReachInput): Set<number> {
  const byTurn = new Map(input.turns.map((t) => [t.turn, t]));
  const byLayer = new Map<string, ReachTurn[]>();
  for (const t of input.turns) if (t.layerId) byLayer.set(t.layerId, [...(byLayer.get(t.layerId) ?? []), t]);
  const kept = new Set<number>();
  const keptLayers = new Set<string>();
  const turnWork: number[] = [];
  const layerWork: string[] = [];
  const keepTurn = (n: number) => {
    if (kept.has(n) || !byTurn.has(n)) return;
    kept.add(n);
    turnWork.push(n);
  };
  const keepLayer = (l: string) => {
    if (keptLayers.has(l)) return;
    keptLayers.add(l);
    layerWork.push(l);
  };
  for (const t of input.turns) if (!t.left) keepTurn(t.turn);
  for (const n of input.pinnedTurns) keepTurn(n);
  for (const l of input.pinnedLayers) keepLayer(l);
  while (turnWork.length || layerWork.length) {
    const n = turnWork.pop();
    if (n !== undefined) {
      const t = byTurn.get(n)!;
      if (t.after !== t.turn) keepTurn(t.after);
      if (t.layerId) keepLayer(t.layerId);
      continue;
    }
    const l = layerWork.pop()!;
    for (const t of byLayer.get(l) ?? []) keepTurn(t.turn);
    for (const p of input.parentsOf(l)) keepLayer(p);
  }
  return kept;
}

/**
 * The turns whose checkpoints can be freed: left, with a checkpoint not freed yet, and not kept.
 * Highest first: a turn is only ever layered on lower ones, so freeing from the top down never
 * frees a layer under one that is kept (checkpoint-gc.ts stops at the first it may not free).
 */
export function unreachableTurns(input: ReachInput): number[] {
  const kept = keptTurns(input);
  return input.turns
    .filter((t) => t.left && t.layerId !== null && !t.freed && !kept.has(t.turn))
    .map((t) => t.turn)
    .sort((a, b) => b - a);
}

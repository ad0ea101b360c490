/**
 * The reachability of a conversation's turn checkpoints (services/conversations/reachability.ts):
 * what the checkpoint garbage collection may free.
 */
import { keptTurns, unreachableTurns, type ReachInput, type ReachTurn } from '../../services/conversations/reachability';

/** Turns 0..n in a line, each layered on the one before (parents expanded, topmost first). */
function line(n: number): { turns: ReachTurn[]; parents: Map<string, string[]> } {
  const turns: ReachTurn[] = [];
  const parents = new Map<string, string[]>();
  for (let t = 0; t <= n; t++) {
    turns.push({ turn: t, after: Math.max(0, t - 1), left: false, layerId: `L${t}`, freed: false });
    parents.set(
      `L${t}`,
      Array.from({ length: t }, (_, i) => `L${t - 1 - i}`),
    );
  }
  return { turns, parents };
}

function input(turns: ReachTurn[], parents: Map<string, string[]>, more: Partial<ReachInput> = {}): ReachInput {
  return { turns, pinnedTurns: [], pinnedLayers: [], parentsOf: (l) => parents.get(l) ?? [], ...more };
}

/** A rewind to `to`: the turns after it are left. */
const rewind = (turns: ReachTurn[], to: number) => turns.map((t) => (t.turn > to ? { ...t, left: true } : t));

describe('conversation checkpoint reachability', () => {
  test('every live turn is kept; nothing is freed without a rewind', () => {
    const { turns, parents } = line(4);
    expect(unreachableTurns(input(turns, parents))).toEqual([]);
    expect([...keptTurns(input(turns, parents))].sort()).toEqual([0, 1, 2, 3, 4]);
  });

  test('a rewind to 1 of 4: turns 2-4 are freed, highest first', () => {
    const { turns, parents } = line(4);
    expect(unreachableTurns(input(rewind(turns, 1), parents, { pinnedTurns: [1] }))).toEqual([4, 3, 2]);
  });

  test('a fork at a left turn keeps it and every layer under it, not the turns above it', () => {
    const { turns, parents } = line(4);
    expect(unreachableTurns(input(rewind(turns, 1), parents, { pinnedTurns: [1, 3] }))).toEqual([4]);
  });

  test('a layer something else stands on (a checkpoint over it, a snapshot) is kept with what is under it', () => {
    const { turns, parents } = line(4);
    expect(unreachableTurns(input(rewind(turns, 0), parents, { pinnedLayers: ['L2'] }))).toEqual([4, 3]);
  });

  test('parents alone keep the layers under a kept turn (its `after` unknown)', () => {
    const { turns, parents } = line(3);
    const t = rewind(turns, 0).map((x) => (x.turn === 3 ? { ...x, after: 3 } : x));
    expect(unreachableTurns(input(t, parents, { pinnedTurns: [3] }))).toEqual([]);
  });

  test('`after` alone keeps the turns under a kept one (its record names no parents)', () => {
    const { turns } = line(3);
    expect(unreachableTurns(input(rewind(turns, 0), new Map(), { pinnedTurns: [2] }))).toEqual([3]);
  });

  test('after a rewind, a new turn continues from the head: its line is kept, the branch left is freed', () => {
    const { turns, parents } = line(4);
    const t = rewind(turns, 1);
    t.push({ turn: 5, after: 1, left: false, layerId: 'L5', freed: false });
    parents.set('L5', ['L1', 'L0']);
    expect(unreachableTurns(input(t, parents, { pinnedTurns: [5] }))).toEqual([4, 3, 2]);
  });

  test('freed turns and turns without a checkpoint are not answered again', () => {
    const { turns, parents } = line(3);
    const t = rewind(turns, 0).map((x) => (x.turn === 3 ? { ...x, freed: true } : x.turn === 2 ? { ...x, layerId: null } : x));
    expect(unreachableTurns(input(t, parents))).toEqual([1]);
  });

  test('pinned turns that are not the conversation’s own are ignored', () => {
    const { turns, parents } = line(2);
    expect(unreachableTurns(input(rewind(turns, 0), parents, { pinnedTurns: [7] }))).toEqual([2, 1]);
  });
});

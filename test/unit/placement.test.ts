import type { HostDoc } from '../../store/hosts';
import { chooseHost, hostAlive, placementWeight } from '../../services/hosts/placement';

const now = Date.parse('2026-11-24T00:00:00Z');
const doc = (id: string, ageMs: number, sandboxes: number, maxSandboxes = 10, reservedMB = 0, memoryMB = 8192): HostDoc => ({
  _id: id,
  url: `http://${id}`,
  taskQueue: `q@${id}`,
  updatedAt: new Date(now - ageMs),
  capacity: { sandboxes, maxSandboxes, reservedMB, memoryMB },
});

describe('placement', () => {
  it('weighs a host by its free slots, scaled down by reserved memory (never below a tenth), 0 when full', () => {
    expect(placementWeight(doc('a', 0, 0).capacity)).toBe(10);
    expect(placementWeight(doc('a', 0, 4).capacity)).toBe(6);
    expect(placementWeight(doc('a', 0, 4, 10, 4096).capacity)).toBe(3);
    expect(placementWeight(doc('a', 0, 4, 10, 100_000).capacity)).toBeCloseTo(0.6);
    expect(placementWeight(doc('a', 0, 10).capacity)).toBe(0);
    expect(placementWeight(doc('a', 0, 12).capacity)).toBe(0);
    // A record without a load (an older worker) counts as room.
    expect(placementWeight(undefined)).toBe(1);
  });

  it('is alive while the heartbeat is younger than HOST_DEAD_AFTER', () => {
    expect(hostAlive(doc('a', 14_999, 0), 15_000, now)).toBe(true);
    expect(hostAlive(doc('a', 15_000, 0), 15_000, now)).toBe(false);
  });

  it('chooses among live hosts with room, in proportion to their weight', () => {
    const docs = [doc('empty', 0, 0), doc('busy', 0, 8), doc('full', 0, 10), doc('dead', 60_000, 0)];
    const counts: Record<string, number> = {};
    // A fixed sequence of "random" numbers across [0, 1): the share each host gets is its weight's.
    for (let i = 0; i < 1200; i++) {
      const chosen = chooseHost(docs, 15_000, () => (i + 0.5) / 1200, now)!;
      counts[chosen._id] = (counts[chosen._id] ?? 0) + 1;
    }
    expect(counts).toEqual({ empty: 1000, busy: 200 });
  });

  it('answers null when no live host has room', () => {
    expect(chooseHost([doc('full', 0, 10), doc('dead', 60_000, 0)], 15_000, Math.random, now)).toBeNull();
    expect(chooseHost([], 15_000, Math.random, now)).toBeNull();
  });

  it('places nothing on a host marked lost until it rejoins, even once it is heard of again', () => {
    const back = { ...doc('back', 0, 0), lostAt: new Date(now - 5_000) };
    expect(chooseHost([back], 15_000, Math.random, now)).toBeNull();
    expect(chooseHost([back, doc('other', 0, 9)], 15_000, () => 0, now)!._id).toBe('other');
    expect(chooseHost([{ ...back, lostAt: null }], 15_000, Math.random, now)!._id).toBe('back');
  });
});

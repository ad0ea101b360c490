/**
 * An exec exit reported before its session's record is written (the start writes the record while
 * the host starts the command; `exit 7` can end first): written once the record is there, not lost.
 */
import { createExecLive } from '../../services/exec/exec-live';
import type { SandboxDeps } from '../../services/deps';
import type { SandboxService } from '../../services/sandboxes/sandboxes';

function fakes(matchedAfter: number) {
  const calls: { filter: unknown; update: unknown }[] = [];
  // An exit's write: the record's update (answering the record before it, or null without one), then its open-exec entry's removal.
  const collection = {
    findOneAndUpdate: jest.fn(async (filter: unknown, update: unknown) => {
      calls.push({ filter, update });
      return calls.length > matchedAfter ? { _id: 'es-0123456789abcdef', orgId: 'org' } : null;
    }),
    deleteOne: jest.fn(async () => ({ deletedCount: 1 })),
  };
  const deps = { store: { db: { collection: () => collection } }, logger: { warn: jest.fn() } } as unknown as SandboxDeps;
  return { live: createExecLive(deps, { onCreated: () => undefined } as unknown as SandboxService), calls };
}

describe('an exec exit whose record is not written yet', () => {
  beforeEach(() => jest.useFakeTimers());
  afterEach(() => jest.useRealTimers());

  it('is written again until the record is there, then once only', async () => {
    const { live, calls } = fakes(2);
    const at = new Date();
    await live.recordExit('exec', 'es-0123456789abcdef', 7, at);
    expect(calls).toHaveLength(1);
    await jest.advanceTimersByTimeAsync(250);
    expect(calls).toHaveLength(2);
    await jest.advanceTimersByTimeAsync(250);
    expect(calls).toHaveLength(3);
    expect(calls[2]).toEqual({ filter: { _id: 'es-0123456789abcdef' }, update: { $set: { exitedAt: at, exitCode: 7 } } });
    // Written: neither the timers nor the follower's report of it again write it a second time.
    await jest.advanceTimersByTimeAsync(5000);
    await live.recordExit('exec', 'es-0123456789abcdef', 7, at);
    expect(calls).toHaveLength(3);
  });

  it('gives up after a bounded number of tries (a session no one will record)', async () => {
    const { live, calls } = fakes(Infinity);
    await live.recordExit('exec', 'es-ffffffffffffffff', 1, new Date());
    await jest.advanceTimersByTimeAsync(60_000);
    expect(calls).toHaveLength(20);
  });
});

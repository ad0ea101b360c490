import { GroupWriter } from '../../store/group-writer';

describe('GroupWriter (group commit)', () => {
  it('writes one alone at once, and the items that come while a write is out together in the next', async () => {
    const writes: number[][] = [];
    let release!: () => void;
    const first = new Promise<void>((r) => (release = r));
    const writer = new GroupWriter<number>(async (items) => {
      writes.push(items);
      if (writes.length === 1) await first;
      return items.map(() => undefined);
    });
    const a = writer.add(1);
    const rest = [2, 3, 4].map((n) => writer.add(n));
    expect(writes).toEqual([[1]]);
    release();
    await Promise.all([a, ...rest]);
    expect(writes).toEqual([[1], [2, 3, 4]]);
  });

  it("gives each caller its own item's error, and a thrown one to every item of that write", async () => {
    let fail = false;
    const writer = new GroupWriter<string>(async (items) => {
      if (fail) throw new Error('server gone');
      return items.map((i) => (i.startsWith('bad') ? new Error(`refused ${i}`) : undefined));
    });
    const outcomes = await Promise.allSettled(['ok1', 'bad1', 'ok2'].map((i) => writer.add(i)));
    expect(outcomes.map((o) => o.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect((outcomes[1] as PromiseRejectedResult).reason.message).toBe('refused bad1');
    fail = true;
    const failed = await Promise.allSettled(['x', 'y'].map((i) => writer.add(i)));
    expect(failed.map((o) => (o as PromiseRejectedResult).reason?.message)).toEqual(['server gone', 'server gone']);
    fail = false;
    await expect(writer.add('after')).resolves.toBeUndefined();
  });

  it('takes at most `max` items per write', async () => {
    const sizes: number[] = [];
    const writer = new GroupWriter<number>(async (items) => {
      sizes.push(items.length);
      await new Promise((r) => setTimeout(r, 5));
      return items.map(() => undefined);
    }, 3);
    await Promise.all(Array.from({ length: 8 }, (_x, i) => writer.add(i)));
    expect(sizes).toEqual([1, 3, 3, 1]);
  });
});

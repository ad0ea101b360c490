/**
 * Group commit for one kind of write: while a write is at the server, the writes that come are
 * queued, and the next write takes them all (up to `max`). Under a burst the server sees a few
 * large writes instead of one per caller; alone, a write goes at once. Each caller learns its own
 * outcome: `write` answers one error (or undefined) per item, in order, or throws for all of them.
 */
export class GroupWriter<T> {
  private queue: { item: T; resolve: () => void; reject: (err: unknown) => void }[] = [];
  private busy = false;

  constructor(
    private readonly write: (items: T[]) => Promise<(unknown | undefined)[]>,
    private readonly max = 256,
  ) {}

  /** Resolves once `item` is written; rejects with its own error. */
  add(item: T): Promise<void> {
    return new Promise((resolve, reject) => {
      this.queue.push({ item, resolve, reject });
      if (!this.busy) void this.drain();
    });
  }

  private async drain(): Promise<void> {
    this.busy = true;
    while (this.queue.length) {
      const batch = this.queue.splice(0, this.max);
      let errors: (unknown | undefined)[];
      try {
        errors = await this.write(batch.map((b) => b.item));
      } catch (err) {
        errors = batch.map(() => err);
      }
      batch.forEach((b, i) => (errors[i] === undefined ? b.resolve() : b.reject(errors[i])));
    }
    this.busy = false;
  }
}

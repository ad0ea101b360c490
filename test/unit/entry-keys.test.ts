/**
 * Entry collections' keys (store/entry-keys.ts): a group's range holds its members and no other
 * group's, even one whose key starts with it; settling; which insert errors mean "there already".
 */
import { MongoBulkWriteError, MongoServerError } from 'mongodb';
import { END, entryKey, groupRange, memberOf, onlyDuplicates, SEP, settled } from '../../store/entry-keys';

const inRange = (key: string, r: ReturnType<typeof groupRange>) => key > r._id.$gt && key < r._id.$lt;

describe('entry keys', () => {
  it("holds a group's members in its range, and no member of a group whose key starts with it", () => {
    const r = groupRange('org-a');
    expect(inRange(entryKey('org-a', 'cp-1'), r)).toBe(true);
    expect(inRange(entryKey('org-a', `cp-${'z'.repeat(40)}`), r)).toBe(true);
    expect(inRange(entryKey('org-ab', 'cp-1'), r)).toBe(false);
    expect(inRange(entryKey('org-', 'cp-1'), r)).toBe(false);
    expect(inRange('org-a', r)).toBe(false);
    expect(memberOf(entryKey('sb-1', 'app.preview.example'))).toBe('app.preview.example');
    expect(END > SEP).toBe(true);
  });

  it('takes an entry as settled only once it is older than any write in flight', () => {
    const now = Date.now();
    expect(settled(new Date(now - 1_000), now)).toBe(false);
    expect(settled(new Date(now - 61_000), now)).toBe(true);
  });

  it('takes duplicate-key errors, and only those, as "there already"', () => {
    const dup = new MongoServerError({ code: 11000, errmsg: 'E11000 duplicate key' });
    const other = new MongoServerError({ code: 2, errmsg: 'bad value' });
    expect(onlyDuplicates(dup)).toBe(true);
    expect(onlyDuplicates(other)).toBe(false);
    expect(onlyDuplicates(new Error('network'))).toBe(false);
    const bulk = (codes: number[]) =>
      new MongoBulkWriteError(
        { message: 'bulk', code: codes[0], writeErrors: codes.map((code, index) => ({ code, index, errmsg: 'x' })) } as never,
        {} as never,
      );
    expect(onlyDuplicates(bulk([11000, 11000]))).toBe(true);
    expect(onlyDuplicates(bulk([11000, 2]))).toBe(false);
  });
});

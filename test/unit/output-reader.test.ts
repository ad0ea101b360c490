/**
 * Reading a child's output into reused slabs: every byte arrives in order, a retained chunk is never
 * overwritten, released slabs are reused, slow output is copied out, pause/resume stop and restart reads.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import { createHash } from 'node:crypto';
import { pooledSlabs, readOutput, type Slab } from '../../sandbox/host/output-reader';

const LINE = '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ';
const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

function run(script: string) {
  return spawn('/bin/sh', ['-c', script], { stdio: ['ignore', 'pipe', 'pipe'] });
}

describe('readOutput', () => {
  it('reads a fast stream into slabs, large reads, every byte in order', async () => {
    // How large each read is depends on how much the child has written by then, so the stream is made
    // fast for certain: the reader is paused until the writer blocks on a full socket buffer (its
    // /proc/<pid>/syscall shows the blocked write), then resumed. Its first read fills the shared
    // buffer (64 KiB: fast), and the next goes into a slab with what is left waiting. How much of a
    // whole stream goes through slabs depends on the scheduler: `npm run bench -- exec` measures that.
    const bytes = 20 * 1024 * 1024;
    const file = `/tmp/output-reader-fast-${process.pid}`;
    const expected = Buffer.from(`${LINE}\n`.repeat(Math.ceil(bytes / 63))).subarray(0, bytes);
    fs.writeFileSync(file, expected);
    try {
      const child = spawn('cat', [file], { stdio: ['ignore', 'pipe', 'ignore'] });
      const copies: Buffer[] = [];
      let viaSlab = 0;
      let largest = 0;
      const r = readOutput(child.stdout!, (d, slab) => {
        copies.push(Buffer.from(d));
        if (slab) viaSlab += d.length;
        largest = Math.max(largest, d.length);
      });
      r.pause();
      expect(r.direct).toBe(true);
      const blockedInWrite = () => {
        try {
          return fs.readFileSync(`/proc/${child.pid}/syscall`, 'utf8').startsWith('1 ');
        } catch {
          return false;
        }
      };
      while (!blockedInWrite()) await new Promise((res) => setTimeout(res, 5));
      r.resume();
      await r.ended;
      const got = Buffer.concat(copies);
      expect(got.length).toBe(bytes);
      expect(got.equals(expected)).toBe(true);
      expect(viaSlab).toBeGreaterThan(0);
      expect(largest).toBeGreaterThan(64 * 1024);
    } finally {
      fs.rmSync(file, { force: true });
    }
  });

  it('never reuses a slab a chunk is retained in; released slabs go back to the pool', async () => {
    const bytes = 12 * 1024 * 1024;
    const file = `/tmp/output-reader-test-${process.pid}`;
    const child = run(`head -c ${bytes} /dev/urandom > ${file} && cat ${file} && sha256sum ${file} >&2; rm -f ${file}`);
    const kept: { d: Buffer; slab: Slab | null }[] = [];
    const err: Buffer[] = [];
    const out = readOutput(child.stdout!, (d, slab) => {
      slab?.retain();
      kept.push({ d, slab });
    });
    const errReader = readOutput(child.stderr!, (d) => err.push(Buffer.from(d)));
    await Promise.all([out.ended, errReader.ended]);
    const fromViews = Buffer.concat(kept.map((k) => k.d));
    expect(fromViews.length).toBe(bytes);
    expect(sha(fromViews)).toBe(Buffer.concat(err).toString().split(' ')[0]);
    const before = pooledSlabs();
    for (const k of kept) k.slab?.release();
    expect(pooledSlabs()).toBeGreaterThan(before);
    expect(pooledSlabs()).toBeLessThanOrEqual(8);
    expect(() => kept.find((k) => k.slab)!.slab!.release()).toThrow(/released more often/);
  });

  it('copies slow output out of the shared buffer (no slab held by an idle command)', async () => {
    const child = run('for i in 1 2 3 4 5; do echo "line $i"; sleep 0.02; done');
    const chunks: { text: string; slab: boolean }[] = [];
    const r = readOutput(child.stdout!, (d, slab) => chunks.push({ text: d.toString(), slab: slab !== null }));
    await r.ended;
    expect(chunks.map((c) => c.text).join('')).toBe('line 1\nline 2\nline 3\nline 4\nline 5\n');
    expect(chunks.every((c) => !c.slab)).toBe(true);
  });

  it('stops reading while paused, so the writer blocks; resumes to the end', async () => {
    // One writer, the shell's own process (exec), whose state /proc shows.
    const child = run('exec head -c 8000000 /dev/zero');
    let got = 0;
    const r = readOutput(child.stdout!, (d) => {
      got += d.length;
    });
    r.pause();
    // The event: the writer is asleep in write(2) (x86-64 syscall 1; /proc/<pid>/syscall), the pipe full.
    const blockedInWrite = () => {
      try {
        return /^1 /.test(fs.readFileSync(`/proc/${child.pid}/syscall`, 'utf8')) && / S /.test(fs.readFileSync(`/proc/${child.pid}/stat`, 'utf8'));
      } catch {
        return false;
      }
    };
    for (let i = 0; i < 1000 && !blockedInWrite(); i++) await new Promise((res) => setTimeout(res, 10));
    expect(blockedInWrite()).toBe(true);
    const whilePaused = got;
    // Whatever the loop had pending is delivered; nothing more is read and the writer stays blocked.
    for (let i = 0; i < 5; i++) await new Promise((res) => setImmediate(res));
    expect(got).toBe(whilePaused);
    expect(blockedInWrite()).toBe(true);
    expect(whilePaused).toBeLessThan(8000000);
    r.resume();
    await r.ended;
    expect(got).toBe(8000000);
  });

  it('falls back to data events for a stream without a handle of its own', async () => {
    const { PassThrough } = await import('node:stream');
    const s = new PassThrough();
    const got: Buffer[] = [];
    const r = readOutput(s, (d, slab) => {
      expect(slab).toBeNull();
      got.push(d);
    });
    expect(r.direct).toBe(false);
    s.end('abc');
    await r.ended;
    expect(Buffer.concat(got).toString()).toBe('abc');
  });
});

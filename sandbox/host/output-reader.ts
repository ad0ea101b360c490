/**
 * Reads a command's stdout or stderr into reused memory.
 *
 * Node reads a child's output into a new 64 KiB buffer per read. At hundreds of MB/s V8 then runs
 * a full collection every 25 MB or so (measured with --trace-gc: 10 per 256 MiB streamed to a client)
 * and its helper threads spent about 0.3 CPU-s per 256 MiB on them, more than the host's own work on
 * the stream. Here a fast stream is read straight into 1 MiB slabs, up to 256 KiB
 * a read, and each chunk is a view of its slab; a slab goes back to a small pool once nothing refers
 * to it any more. References are counted explicitly: whoever keeps a chunk beyond the callback
 * (the scrollback, a socket write in flight) calls `retain` and later `release` exactly once.
 *
 * A slow stream (reads under 32 KiB) is read into a 64 KiB buffer shared by all streams and each
 * chunk copied out at once (libuv reads a stream and calls back before it reads the next, so one
 * buffer serves them all): an idle command holds no memory of its own. A read of 32 KiB or more
 * switches the stream to slabs; one under 8 KiB switches it back.
 *
 * This takes over the stream's libuv handle through `onread` (net.Socket's user-buffer reads),
 * which child_process does not offer: it needs the handle of `child.stdout` (a private field). When
 * that is not available the stream is read the ordinary way ('data' events, chunks without a slab).
 */
import * as net from 'node:net';
import type { Readable } from 'node:stream';

const SLAB_BYTES = 1024 * 1024;
const FAST_READ = 256 * 1024;
const SLOW_READ = 64 * 1024;
const TO_FAST = 32 * 1024;
const TO_SLOW = 8 * 1024;
/** The read buffer of every stream in slow mode (its chunks are copied out in the callback). */
const shared = Buffer.allocUnsafeSlow(SLOW_READ);
/** Free slabs kept for reuse (beyond that they are left to the garbage collector). */
const POOL_MAX = 8;

/** A piece of memory chunks are views of; reusable when no one holds it. */
export class Slab {
  readonly buf = Buffer.allocUnsafeSlow(SLAB_BYTES);
  private refs = 0;
  /** `release` as a function value (a write callback), made once per slab. */
  readonly releaseFn = (): void => this.release();

  retain(): void {
    this.refs++;
  }

  release(): void {
    if (--this.refs > 0) return;
    if (this.refs < 0) throw new Error('slab released more often than retained');
    if (pool.length < POOL_MAX) pool.push(this);
  }
}

const pool: Slab[] = [];

function takeSlab(): Slab {
  return pool.pop() ?? new Slab();
}

/** Free slabs in the pool (for tests and metrics). */
export function pooledSlabs(): number {
  return pool.length;
}

/** One read: `data` is a view of `slab` (retain it to keep it past the callback), or its own copy when slab is null. */
export type OnChunk = (data: Buffer, slab: Slab | null) => void;

/** A stream being read; `ended` resolves at end of file (or when the stream fails or closes). */
export interface OutputReader {
  pause(): void;
  resume(): void;
  readonly ended: Promise<void>;
  /** True when reads go through reused memory (false: ordinary 'data' events). */
  readonly direct: boolean;
}

interface HandleLike {
  reading?: boolean;
  useUserBuffer?: unknown;
}

/** Reads `stream` (a child's stdout or stderr) until its end, calling onChunk for each read. */
export function readOutput(stream: Readable, onChunk: OnChunk): OutputReader {
  const handle = (stream as Readable & { _handle?: HandleLike })._handle;
  if (stream instanceof net.Socket && handle && typeof handle.useUserBuffer === 'function' && handle.reading === true) {
    return direct(stream as net.Socket & { _handle: HandleLike }, onChunk);
  }
  stream.on('data', (d: Buffer) => onChunk(d, null));
  return {
    direct: false,
    pause: () => stream.pause(),
    resume: () => stream.resume(),
    ended: endOf(stream),
  };
}

function endOf(s: Readable): Promise<void> {
  return new Promise((resolve) => {
    s.once('end', resolve);
    s.once('close', resolve);
    s.once('error', () => resolve());
  });
}

function direct(original: net.Socket & { _handle: HandleLike }, onChunk: OnChunk): OutputReader {
  let slab: Slab | null = null;
  let pos = 0;
  let fast = false;

  /** Where the next read goes. */
  const target = (): Buffer => {
    if (!fast) {
      if (slab) {
        slab.release();
        slab = null;
      }
      return shared;
    }
    if (!slab || pos + FAST_READ > SLAB_BYTES) {
      slab?.release();
      slab = takeSlab();
      slab.retain();
      pos = 0;
    }
    return slab.buf.subarray(pos, pos + FAST_READ);
  };

  // `handle` (the same libuv handle, now read into our buffers: `original` never sees another
  // byte) is an option net.Socket takes but does not document.
  const socket = new net.Socket({
    handle: original._handle,
    readable: true,
    writable: false,
    onread: {
      buffer: target,
      callback: (n: number, buf: Uint8Array) => {
        if (buf === shared) {
          onChunk(Buffer.from(shared.subarray(0, n)), null);
          fast = n >= TO_FAST;
        } else {
          const s = slab as Slab;
          const data = s.buf.subarray(pos, pos + n);
          pos += n;
          onChunk(data, s);
          fast = n >= TO_SLOW;
        }
      },
    },
  } as net.SocketConstructorOpts);
  // The handle is ours now; the original must never close it (nothing else refers to it).
  (original as unknown as { _handle: unknown })._handle = null;
  socket.on('close', () => {
    slab?.release();
    slab = null;
  });
  return {
    direct: true,
    pause: () => socket.pause(),
    resume: () => socket.resume(),
    ended: endOf(socket),
  };
}

/**
 * Released layers (sandbox/base/layer-gc.ts) on a temporary DATA_DIR: a layer in use stays until its
 * last user (running sandbox, create under way, respawn record, sandbox directory, layer over it) goes,
 * and a host that starts again removes the released layers nothing uses.
 */
import { promises as fsp } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import pino from 'pino';
import { LayerGc, RELEASED_DIR, type LayerGcDeps } from '../../sandbox/base/layer-gc';
import type { SandboxState } from '../../sandbox/base/state-file';

let dir: string;
const layers = () => path.join(dir, 'layers');
const sandboxes = () => path.join(dir, 'sandboxes');
const respawn = () => path.join(dir, 'hibernated');
const exists = (p: string) =>
  fsp.stat(p).then(
    () => true,
    () => false,
  );
const has = (id: string) => exists(path.join(layers(), id, 'layer.json'));

async function layer(id: string, parents: string[] = []): Promise<void> {
  await fsp.mkdir(path.join(layers(), id, 'root'), { recursive: true });
  await fsp.writeFile(path.join(layers(), id, 'layer.json'), JSON.stringify({ parents }));
}

function gcWith(states = new Map<string, SandboxState>(), readPlain?: LayerGcDeps['readPlain']): LayerGc {
  return new LayerGc({
    log: pino({ level: 'silent' }),
    layersDir: layers,
    sandboxesDir: sandboxes,
    respawnDir: respawn,
    states,
    readPlain:
      readPlain ??
      (async (id) =>
        fsp
          .readFile(path.join(sandboxes(), id, 'state.json'), 'utf8')
          .then((t) => JSON.parse(t) as SandboxState)
          .catch(() => undefined)),
  });
}

/** A LayerGc whose collections read a sandbox directory not adopted (sb-9), calling `during` as they do. */
async function gcDuringRead(states: Map<string, SandboxState>, during: (gc: LayerGc) => void): Promise<LayerGc> {
  await fsp.mkdir(path.join(sandboxes(), 'sb-9'), { recursive: true });
  const gc: LayerGc = gcWith(states, async () => {
    during(gc);
    return undefined;
  });
  return gc;
}

const running = (id: string, ls: string[]) => [id, { id, layers: ls } as unknown as SandboxState] as const;

/**
 * cp-a under sb-1 and cp-b under sb-2, both released. Once `gone` is no longer running, the next
 * collection's read of a sandbox directory starts a create (sb-3) over `held`: a create that began meanwhile.
 */
async function createDuringCollection(gone: string, held: string) {
  for (const l of ['cp-a', 'cp-b']) await layer(l);
  const states = new Map([running('sb-1', ['cp-a']), running('sb-2', ['cp-b'])]);
  let begun = false;
  const gc = await gcDuringRead(states, (g) => {
    if (begun || states.has(gone)) return;
    begun = true;
    g.hold('sb-3', [held]);
  });
  expect(await gc.release('cp-a')).toBe('released');
  expect(await gc.release('cp-b')).toBe('released');
  return { gc, states, begun: () => begun };
}

beforeEach(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'layer-gc-'));
  for (const d of [layers(), sandboxes(), respawn()]) await fsp.mkdir(d, { recursive: true });
});
afterEach(async () => {
  await fsp.rm(dir, { recursive: true, force: true });
});

describe('released layers', () => {
  it('removes an unused layer at once and answers absent for one that is not there', async () => {
    await layer('cp-a');
    const gc = gcWith();
    expect(await gc.release('cp-a')).toBe('deleted');
    expect(await has('cp-a')).toBe(false);
    expect(await gc.release('cp-a')).toBe('absent');
    expect(await fsp.readdir(layers())).toEqual([RELEASED_DIR]);
    expect(await fsp.readdir(path.join(layers(), RELEASED_DIR))).toEqual([]);
    await expect(gc.release('../etc')).rejects.toThrow();
  });

  it('keeps a layer while a running sandbox stands on it, and removes it after the sandbox goes', async () => {
    await layer('cp-a');
    const states = new Map([running('sb-1', ['cp-a'])]);
    const gc = gcWith(states);
    expect(await gc.release('cp-a')).toBe('released');
    expect(await has('cp-a')).toBe(true);
    expect(await gc.isReleased('cp-a')).toBe(true);
    states.delete('sb-1');
    expect(await gc.collect()).toEqual(['cp-a']);
    expect(await has('cp-a')).toBe(false);
    expect(await gc.isReleased('cp-a')).toBe(false);
  });

  it('keeps a layer that another layer names as parent, a hibernated sandbox stands on, or a create holds', async () => {
    await layer('cp-base');
    await layer('cp-child', ['cp-base']);
    await layer('sb-2.h1', ['cp-base']);
    await fsp.writeFile(path.join(respawn(), 'sb-2.json'), JSON.stringify({ id: 'sb-2', layer: 'sb-2.h1' }));
    const gc = gcWith();
    expect(await gc.release('cp-base')).toBe('released');
    // The hibernated sandbox goes (its respawn record and hibernation layer): the child checkpoint still names it.
    await fsp.rm(path.join(respawn(), 'sb-2.json'));
    expect(await gc.release('sb-2.h1')).toBe('deleted');
    expect(await has('cp-base')).toBe(true);
    // A create over the child holds it (and so its parent) until it runs or fails.
    gc.hold('sb-3', ['cp-child']);
    expect(await gc.release('cp-child')).toBe('released');
    expect(await has('cp-base')).toBe(true);
    gc.drop('sb-3');
    expect((await gc.collect()).sort()).toEqual(['cp-base', 'cp-child']);
    expect(await fsp.readdir(layers())).toEqual([RELEASED_DIR]);
  });

  it('counts a sandbox directory that was not adopted, and at a new start removes what nothing uses', async () => {
    await layer('cp-a');
    await layer('cp-b');
    await fsp.mkdir(path.join(sandboxes(), 'sb-4'), { recursive: true });
    await fsp.writeFile(path.join(sandboxes(), 'sb-4', 'state.json'), JSON.stringify({ id: 'sb-4', layers: ['cp-a'] }));
    // A host that released both and died: the marks are on disk.
    const gc = gcWith(new Map([running('sb-5', ['cp-b'])]));
    expect(await gc.release('cp-a')).toBe('released');
    expect(await gc.release('cp-b')).toBe('released');
    // The next host's start: sb-5 did not come back; sb-4's directory is still there.
    const next = gcWith();
    expect(await next.collect()).toEqual(['cp-b']);
    await fsp.rm(path.join(sandboxes(), 'sb-4'), { recursive: true });
    expect(await next.collect()).toEqual(['cp-a']);
    // A mark whose layer is gone is dropped; nothing else is touched.
    await layer('cp-c');
    await fsp.writeFile(path.join(layers(), RELEASED_DIR, 'cp-gone'), '');
    expect(await next.collect()).toEqual([]);
    expect(await fsp.readdir(path.join(layers(), RELEASED_DIR))).toEqual([]);
    expect(await has('cp-c')).toBe(true);
  });

  it('after a destroy, reads nothing unless the sandbox (or a hold dropped since) stood on a released layer', async () => {
    for (const l of ['cp-a', 'cp-b', 'cp-c']) await layer(l);
    const states = new Map([running('sb-1', ['cp-a']), running('sb-2', ['cp-b'])]);
    const gc = gcWith(states);
    gc.hold('sb-3', ['cp-c']);
    expect(await gc.release('cp-a')).toBe('released');
    expect(await gc.release('cp-c')).toBe('released');
    const readdir = jest.spyOn(fsp, 'readdir');
    try {
      // sb-2 stood on nothing released: no collection, nothing read.
      states.delete('sb-2');
      expect(await gc.collectAfter(['cp-b'])).toEqual([]);
      expect(readdir).not.toHaveBeenCalled();
      // The create that held cp-c failed: its layer goes with the next destroy's collection.
      gc.drop('sb-3');
      expect(await gc.collectAfter([])).toEqual(['cp-c']);
      expect(readdir).toHaveBeenCalled();
      readdir.mockClear();
      expect(await gc.collectAfter([])).toEqual([]);
      expect(readdir).not.toHaveBeenCalled();
      // sb-1 stood on cp-a: collected.
      states.delete('sb-1');
      expect(await gc.collectAfter(['cp-a'])).toEqual(['cp-a']);
    } finally {
      readdir.mockRestore();
    }
    expect(await has('cp-a')).toBe(false);
    expect(await has('cp-b')).toBe(true);
    expect(await has('cp-c')).toBe(false);
  });

  it('after a destroy, collects when a create that began during the last collection held one of its layers', async () => {
    const { gc, states, begun } = await createDuringCollection('sb-1', 'cp-a');
    // sb-1 goes while sb-3's create begins over cp-a: that collection leaves cp-a (and cp-b) to the next.
    states.delete('sb-1');
    expect(await gc.collectAfter(['cp-a'])).toEqual([]);
    expect(begun()).toBe(true);
    // sb-3's create failed; sb-2 goes later: its collection removes cp-a and cp-b.
    gc.drop('sb-3');
    states.delete('sb-2');
    expect((await gc.collectAfter(['cp-b'])).sort()).toEqual(['cp-a', 'cp-b']);
  });

  it('after a destroy, collects what a collection left for a create that then ran', async () => {
    const { gc, states, begun } = await createDuringCollection('sb-2', 'cp-b');
    // sb-1 and sb-2 go; sb-3's create begins over cp-b during the collection: nothing removed yet.
    states.delete('sb-1');
    states.delete('sb-2');
    expect(await gc.collectAfter(['cp-a', 'cp-b'])).toEqual([]);
    expect(begun()).toBe(true);
    // sb-3 runs on cp-b: a destroy of a sandbox that stood on nothing released still collects cp-a.
    states.set(...running('sb-3', ['cp-b']));
    expect(await gc.collectAfter(['cp-x'])).toEqual(['cp-a']);
    expect(await has('cp-b')).toBe(true);
  });
});
